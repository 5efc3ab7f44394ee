// The transport endpoint over real PMD ports: net_ring links, the link
// emulator on every TX queue (both directions, so data and ACKs are
// impaired alike), and every byte of every message checked in the
// destination buffers.
//
// Everything runs in one thread that polls every endpoint in turn (the
// deterministic choice: no cross-core timing, and the 2-core CI machine is
// not oversubscribed). The incast has four senders, each on its own ring
// link to the receiver; the receiver side is one core polling four
// Interfaces, one Endpoint each, all delivering into one MessageReceiver.
#include <gtest/gtest.h>
#include <rte_cycles.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "fixture.h"
#include "pmd_env.h"

namespace mercury::transport {
namespace {

using testing::CheckingReceiver;
using testing::CompletionLog;
using testing::PlannedMessage;
using testing::RingLink;

constexpr uint32_t kMtu = 9000;
constexpr uint64_t kMiB = 1ull << 20;
// Holds every message cut from it; larger than the largest message.
constexpr size_t kPatternBytes = 80 * kMiB;

const std::vector<std::byte>& pattern() {
  static const std::vector<std::byte> p = testing::random_pattern(kPatternBytes, 42);
  return p;
}

EndpointConfig endpoint_config(uint16_t epoch, uint16_t sender_id, std::vector<PeerSpec> peers) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 5'000'000;
  c.local_epoch = epoch;
  c.sender_id = sender_id;
  c.peers = std::move(peers);
  return c;
}

net::LinkParams faults(double loss, uint64_t seed) {
  net::LinkParams p;
  p.loss = loss;
  if (loss > 0) {
    p.reorder = 0.05;
    p.duplicate = 0.02;
  }
  p.seed = seed;
  return p;
}

// Polls every endpoint until `done` or the time limit; returns false on time out.
template <typename Done>
bool run(const std::vector<Endpoint*>& eps, Done done, double limit_s) {
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * hz);
  for (;;) {
    const uint64_t now = rte_rdtsc();
    for (Endpoint* e : eps) e->poll_st(now);
    if (done()) return true;
    if (now > deadline) return false;
  }
}

void print_stats(const char* what, const Endpoint& tx, double seconds, uint64_t bytes) {
  const EndpointPeerStats s = tx.peer_stats_st(0);
  const EndpointCounters c = tx.counters_st();
  std::printf(
      "[ %s ] %.1f MiB in %.2f s (%.2f Gbit/s); sent %llu, resent %llu (fast %llu, rto %llu), "
      "rto expiries %llu, deferred %llu, stale %llu, no room %llu, not needed %llu, false losses "
      "%llu, cwnd %u\n",
      what, bytes / double(kMiB), seconds, bytes * 8 / seconds / 1e9,
      (unsigned long long)s.transport.tx.packets_sent, (unsigned long long)c.tx_retransmits,
      (unsigned long long)s.transport.tx.retransmits_fast,
      (unsigned long long)s.transport.tx.retransmits_timeout,
      (unsigned long long)s.transport.tx.rto_expirations, (unsigned long long)c.deferred,
      (unsigned long long)c.drops[static_cast<size_t>(EndpointDrop::kRetransmitStale)],
      (unsigned long long)c.resends_no_room, (unsigned long long)c.resends_not_needed,
      (unsigned long long)s.transport.tx.false_losses, s.transport.tx.cwnd);
}

// A sends `forward` bytes to B, B sends `back` bytes to A, over one link.
void two_endpoints(const std::string& name, uint8_t net, uint32_t mtu, const net::LinkParams& lp,
                   uint64_t forward, uint64_t back, double limit_s, bool known_epochs,
                   void (*tune)(Config&) = nullptr) {
  RingLink link(name, net, mtu, lp);
  std::vector<std::vector<PlannedMessage>> plans = {
      testing::plan_messages(forward, 64 << 20, kPatternBytes, lp.seed + 1),
      testing::plan_messages(back, 4 << 20, kPatternBytes, lp.seed + 2)};
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  EndpointConfig ca =
      endpoint_config(3, 0, {{"b", RingLink::ip_b(net), 47101, uint16_t(known_epochs ? 5 : 0)}});
  EndpointConfig cb =
      endpoint_config(5, 1, {{"a", RingLink::ip_a(net), 47100, uint16_t(known_epochs ? 3 : 0)}});
  if (tune != nullptr) {
    tune(ca.transport);
    tune(cb.transport);
  }
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), ca, rx_a, now);
  Endpoint b(link.b(), cb, rx_b, now);
  CompletionLog log_a(plans[0].size()), log_b(plans[1].size());
  testing::submit_plan(a, 0, 0, plans[0], pattern(), log_a);
  testing::submit_plan(b, 0, 1, plans[1], pattern(), log_b);

  const uint64_t t0 = rte_rdtsc();
  const bool finished = run(
      {&a, &b},
      [&] {
        return log_a.total_ok() == plans[0].size() && log_b.total_ok() == plans[1].size() &&
               rx_b.all_exactly_once(0) && rx_a.all_exactly_once(1);
      },
      limit_s);
  const double secs = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
  print_stats(name.c_str(), a, secs, forward);
  EXPECT_TRUE(finished) << "time out: " << log_a.total_ok() << "/" << plans[0].size() << " and "
                        << log_b.total_ok() << "/" << plans[1].size() << " completed";
  EXPECT_TRUE(log_a.each_once());
  EXPECT_TRUE(log_b.each_once());
  EXPECT_EQ(log_a.first_error, "");
  EXPECT_EQ(log_b.first_error, "");
  // Every byte, checked against the source in the destination buffers.
  EXPECT_EQ(rx_b.corrupt(), 0u);
  EXPECT_EQ(rx_a.corrupt(), 0u);
  EXPECT_EQ(rx_b.unexpected() + rx_a.unexpected(), 0u);
  EXPECT_EQ(rx_b.bytes_ok(), forward);
  EXPECT_EQ(rx_a.bytes_ok(), back);
  EXPECT_TRUE(rx_b.all_exactly_once(0));
  EXPECT_TRUE(rx_a.all_exactly_once(1));
  EXPECT_EQ(rx_b.open_buffers() + rx_a.open_buffers(), 0u);
  if (lp.loss > 0) {
    // The faults were real and the transport recovered from them.
    EXPECT_GT(link.emu_a()->lost, 0u);
    EXPECT_GT(link.emu_a()->duplicated, 0u);
    EXPECT_GT(link.emu_a()->reordered, 0u);
    EXPECT_GT(a.counters_st().tx_retransmits, 0u);
    EXPECT_GT(b.peer_stats_st(0).transport.rx.duplicates, 0u);
  }
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(b.idle_st());
}

TEST(Endpoint, TwoEndpointsNoFaults256MiB) {
  two_endpoints("nofault", 1, kMtu, faults(0, 1), 256 * kMiB, 16 * kMiB, 30, false);
}

TEST(Endpoint, TwoEndpointsNoFaults1500Mtu) {
  two_endpoints("nofault1500", 2, 1500, faults(0, 2), 64 * kMiB, 4 * kMiB, 30, true);
}

TEST(Endpoint, TwoEndpointsLoss1Percent256MiB) {
  two_endpoints("loss1", 3, kMtu, faults(0.01, 11), 256 * kMiB, 16 * kMiB, 40, false);
}

TEST(Endpoint, TwoEndpointsLoss5Percent256MiB) {
  two_endpoints("loss5", 4, kMtu, faults(0.05, 12), 256 * kMiB, 16 * kMiB, 40, true);
}

TEST(Endpoint, TwoEndpointsLoss10Percent256MiB) {
  two_endpoints("loss10", 5, kMtu, faults(0.10, 13), 256 * kMiB, 16 * kMiB, 40, false);
}

// At 30 % loss both ways the default cwnd floor of 2 leaves too few later
// transmissions for fast retransmit, so recovery would be by timer alone:
// a floor of 8 and a 20 ms RTO ceiling keep the smaller volume quick.
TEST(Endpoint, TwoEndpointsLoss30PercentSmaller) {
  two_endpoints("loss30", 6, kMtu, faults(0.30, 14), 32 * kMiB, 2 * kMiB, 40, true, [](Config& c) {
    c.cwnd_floor = 8;
    c.initial_rto_us = 2'000;
    c.min_rto_us = 500;
    c.max_rto_us = 20'000;
  });
}

// Four senders, each on its own ring link, into one receiving core that
// polls four Interfaces (one Endpoint each) delivering into one receiver.
void incast(const std::string& name, uint8_t net0, const net::LinkParams& lp, uint64_t total,
            double limit_s) {
  constexpr int kSenders = 4;
  std::vector<std::unique_ptr<RingLink>> links;
  std::vector<std::vector<PlannedMessage>> plans;
  for (int s = 0; s < kSenders; ++s) {
    net::LinkParams p = lp;
    p.seed = lp.seed * 10 + s;
    links.push_back(std::make_unique<RingLink>(name + std::to_string(s),
                                               static_cast<uint8_t>(net0 + s), kMtu, p, 1023));
    plans.push_back(testing::plan_messages(total / kSenders, 64 << 20, kPatternBytes, p.seed));
  }
  CheckingReceiver rx(pattern(), plans);
  CheckingReceiver nothing(pattern(), plans);  // the senders receive no messages
  const uint64_t now = rte_rdtsc();
  std::vector<std::unique_ptr<Endpoint>> senders, receivers;
  std::vector<std::unique_ptr<CompletionLog>> logs;
  std::vector<Endpoint*> all;
  for (int s = 0; s < kSenders; ++s) {
    const auto net = static_cast<uint8_t>(net0 + s);
    senders.push_back(
        std::make_unique<Endpoint>(links[s]->a(),
                                   endpoint_config(7, static_cast<uint16_t>(s + 1),
                                                   {{"server", RingLink::ip_b(net), 47101, 0}}),
                                   nothing, now));
    receivers.push_back(std::make_unique<Endpoint>(
        links[s]->b(),
        endpoint_config(9, 0, {{"w" + std::to_string(s), RingLink::ip_a(net), 47100, 0}}), rx,
        now));
    logs.push_back(std::make_unique<CompletionLog>(plans[s].size()));
    testing::submit_plan(*senders[s], 0, static_cast<uint32_t>(s), plans[s], pattern(), *logs[s]);
    all.push_back(senders[s].get());
    all.push_back(receivers[s].get());
  }
  const uint64_t t0 = rte_rdtsc();
  const bool finished = run(
      all,
      [&] {
        for (int s = 0; s < kSenders; ++s) {
          if (logs[s]->total_ok() != plans[s].size()) return false;
        }
        return rx.all_exactly_once();
      },
      limit_s);
  const double secs = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
  print_stats(name.c_str(), *senders[0], secs, total);
  EXPECT_TRUE(finished);
  for (int s = 0; s < kSenders; ++s) {
    EXPECT_TRUE(logs[s]->each_once()) << "sender " << s;
    EXPECT_EQ(logs[s]->first_error, "") << "sender " << s;
    EXPECT_TRUE(senders[s]->idle_st());
  }
  EXPECT_EQ(rx.corrupt(), 0u);
  EXPECT_EQ(rx.unexpected(), 0u);
  EXPECT_EQ(rx.bytes_ok(), total);
  EXPECT_TRUE(rx.all_exactly_once());
  EXPECT_EQ(rx.open_buffers(), 0u);
}

TEST(Endpoint, Incast4To1NoFaults256MiB) { incast("incast", 20, faults(0, 3), 256 * kMiB, 40); }

TEST(Endpoint, Incast4To1Loss5Percent256MiB) {
  incast("incastloss", 30, faults(0.05, 4), 256 * kMiB, 40);
}

// A peer that stops answering: everything queued and in flight for it fails,
// once each, with an error naming it; nothing hangs.
TEST(Endpoint, DeadPeerFailsEverythingWithItsName) {
  RingLink link("dead", 40, kMtu, faults(0, 5));
  std::vector<std::vector<PlannedMessage>> plans = {
      testing::plan_messages(96 * kMiB, 16 << 20, kPatternBytes, 77)};
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  EndpointConfig ca = endpoint_config(3, 0, {{"w2", RingLink::ip_b(40), 47101, 5}});
  ca.transport.peer_timeout_us = 200'000;
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), ca, rx_a, now);
  Endpoint b(link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(40), 47100, 3}}), rx_b, now);
  CompletionLog log(plans[0].size());
  testing::submit_plan(a, 0, 0, plans[0], pattern(), log);
  // Run both until some messages are delivered, then only A: B is gone.
  ASSERT_TRUE(run(
      {&a, &b}, [&] { return log.total_ok() >= 3; }, 20));
  const bool finished = run(
      {&a},
      [&] {
        uint64_t n = 0;
        for (size_t i = 0; i < log.ok.size(); ++i) n += log.ok[i] + log.failed[i];
        return n == plans[0].size();
      },
      10);
  EXPECT_TRUE(finished);
  EXPECT_TRUE(log.each_once());
  EXPECT_NE(log.first_error.find("peer w2 (10.0.40.2:47101) did not acknowledge for 200 ms"),
            std::string::npos)
      << log.first_error;
  EXPECT_TRUE(a.peer_stats_st(0).dead);
  EXPECT_GT(a.peer_stats_st(0).messages_failed, 0u);
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(rx_b.none_twice());
  EXPECT_EQ(rx_b.corrupt(), 0u);
  // Messages sent after the death fail too, at once.
  MessageMeta meta;
  const size_t before = log.failed[0];
  ASSERT_EQ(
      a.send(0, pattern().data(), 1000, 0, meta, Completion{&CompletionLog::callback, &log, 0}),
      SubmitStatus::kQueued);
  a.poll_st(rte_rdtsc());
  EXPECT_EQ(log.failed[0], before + 1);
}

// Submission refusals are reported, never queued.
TEST(Endpoint, SendRefusesInvalidArguments) {
  RingLink link("inval", 41, kMtu, faults(0, 6));
  std::vector<std::vector<PlannedMessage>> plans = {{}};
  CheckingReceiver rx(pattern(), plans);
  Endpoint a(link.a(), endpoint_config(3, 0, {{"b", RingLink::ip_b(41), 47101, 0}}), rx,
             rte_rdtsc());
  MessageMeta meta;
  EXPECT_EQ(a.send(1, pattern().data(), 10, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send(0, pattern().data(), 10, 64, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send(0, nullptr, 10, 0, meta, {}), SubmitStatus::kInvalid);
  meta.type = wire::PacketType::kAck;
  EXPECT_EQ(a.send(0, pattern().data(), 10, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.counters_st().submit_invalid, 4u);
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
