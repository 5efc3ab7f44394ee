// Every counter struct of the server is declared from a list: its sum
// (operator+=) and its walk (for_each) must cover every field.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <numeric>
#include <set>
#include <string>
#include <string_view>

#include "server/server_node.h"

namespace mercury::server {
namespace {

// T is made of 64-bit counters only (what base::Published needs too):
// fill word i with i + 1, add T to itself, and walk it.
template <class T>
void expect_sum_and_walk_cover_every_field() {
  static_assert(sizeof(T) % sizeof(uint64_t) == 0);
  constexpr size_t kWords = sizeof(T) / sizeof(uint64_t);
  std::array<uint64_t, kWords> words{};
  std::iota(words.begin(), words.end(), uint64_t{1});
  const T a = std::bit_cast<T>(words);

  T b = a;
  b += a;
  const auto summed = std::bit_cast<std::array<uint64_t, kWords>>(b);
  for (size_t i = 0; i < kWords; ++i) EXPECT_EQ(summed[i], 2 * words[i]) << "word " << i;

  size_t visited = 0;
  uint64_t total = 0;
  std::set<std::string> names;
  a.for_each([&](std::string_view prefix, std::string_view name, uint64_t v) {
    ++visited;
    total += v;
    names.insert(std::string(prefix).append(name));
  });
  EXPECT_EQ(visited, kWords);
  EXPECT_EQ(total, kWords * (kWords + 1) / 2);  // each word once
  EXPECT_EQ(names.size(), kWords) << "two counters share a name";
}

TEST(Counters, ShardCountersSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<ShardCounters>();
}

TEST(Counters, ControlCountersSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<ControlCounters>();
}

TEST(Counters, ChunkTableCountersSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<agg::ChunkTableCounters>();
}

TEST(Counters, EndpointCountersSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<transport::EndpointCounters>();
}

TEST(Counters, PortDropsSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<net::PortDrops>();
}

TEST(Counters, ServerCountersSumAndWalkEveryField) {
  expect_sum_and_walk_cover_every_field<ServerCounters>();
}

TEST(Counters, ServerCountersWalkNamesEachPart) {
  ServerCounters c;
  c.drops[static_cast<size_t>(ServerDrop::kNotRunning)] = 3;
  c.net.drops[static_cast<size_t>(transport::EndpointDrop::kBackpressure)] = 4;
  c.shards.updates = 5;
  c.control.declares = 6;
  c.held = 7;
  c.pmd_drops.rx_nombuf = 8;
  std::set<std::string> seen;
  c.for_each([&](std::string_view prefix, std::string_view name, uint64_t v) {
    if (v != 0) seen.insert(std::string(prefix).append(name) + "=" + std::to_string(v));
  });
  EXPECT_EQ(seen, (std::set<std::string>{"drop_not_running=3", "net_drop_backpressure=4",
                                         "shard_updates=5", "control_declares=6", "held=7",
                                         "port_drop_rx_nombuf=8"}));
}

}  // namespace
}  // namespace mercury::server
