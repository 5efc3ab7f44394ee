// The admission signal a shard publishes: written by its owner, read by the
// net core (here one thread plays both; the ordering argument is in the
// header).
#include "server/started_sets.h"

#include <gtest/gtest.h>

#include <vector>

namespace mercury::server {
namespace {

constexpr uint32_t kChunk = 1408;

// Three tensors, unsplit, on two shards: "a" (3 chunks) on one, "c" (3) and
// "b" (1) on the other; every last chunk is shorter than kChunk.
agg::Placement placement() {
  const std::vector<agg::TensorDecl> decls = {{"a", 1000, 0}, {"b", 100, 1}, {"c", 900, 2}};
  return agg::Placement::compute(decls, 2, {.max_block_bytes = 1 << 20});
}

// The keys of shard `s` and their chunk counts.
std::vector<std::pair<uint32_t, uint32_t>> chunks_of(const agg::Placement& p, uint32_t s) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const agg::Block& block : p.blocks()) {
    if (block.shard == s) {
      out.emplace_back(block.key, static_cast<uint32_t>((block.bytes() + kChunk - 1) / kChunk));
    }
  }
  return out;
}

TEST(StartedSets, ASetStartedByOneRankIsJoinedByTheOthersOnly) {
  const agg::Placement p = placement();
  const auto keys = chunks_of(p, 0);
  ASSERT_FALSE(keys.empty());
  StartedSets s(p, 0, kChunk);
  const uint32_t key = keys.front().first;
  EXPECT_FALSE(s.others_started(key, 0, 0));
  EXPECT_FALSE(s.others_started(key, 0, 1));

  s.held_st(key, 0, 2);
  EXPECT_TRUE(s.others_started(key, 0, 0));
  EXPECT_TRUE(s.others_started(key, 0, 1));
  EXPECT_FALSE(s.others_started(key, 0, 2));  // rank 2's own is in: a copy

  s.held_st(key, 0, 0);  // rank 0 joins: 2 and 0 held, 0 last
  EXPECT_TRUE(s.others_started(key, 0, 1));
  EXPECT_TRUE(s.others_started(key, 0, 2));

  s.cleared_st(key, 0);  // the set completed: its next one is empty
  for (uint16_t r = 0; r < 3; ++r) EXPECT_FALSE(s.others_started(key, 0, r));
}

TEST(StartedSets, EveryChunkHasItsOwnByte) {
  const agg::Placement p = placement();
  for (uint32_t shard = 0; shard < 2; ++shard) {
    StartedSets s(p, shard, kChunk);
    uint64_t total = 0;
    for (const auto& [key, chunks] : chunks_of(p, shard)) {
      total += chunks;
      for (uint32_t c = 0; c < chunks; ++c) s.held_st(key, c * kChunk, static_cast<uint16_t>(c));
    }
    EXPECT_EQ(s.chunks(), total);
    for (const auto& [key, chunks] : chunks_of(p, shard)) {
      for (uint32_t c = 0; c < chunks; ++c) {
        EXPECT_FALSE(s.others_started(key, c * kChunk, static_cast<uint16_t>(c)));
        EXPECT_TRUE(s.others_started(key, c * kChunk, static_cast<uint16_t>(c + 1)));
      }
    }
  }
}

TEST(StartedSets, WhatIsNotAChunkOfTheShardIsNeverStarted) {
  const agg::Placement p = placement();
  StartedSets s(p, 0, kChunk);
  const auto mine = chunks_of(p, 0);
  const auto theirs = chunks_of(p, 1);
  ASSERT_FALSE(theirs.empty());
  const uint32_t key = mine.front().first;
  s.held_st(key, 0, 1);
  s.held_st(theirs.front().first, 0, 1);  // not ours: ignored
  EXPECT_FALSE(s.others_started(theirs.front().first, 0, 0));
  EXPECT_FALSE(s.others_started(key, 4, 0));                             // not a chunk boundary
  EXPECT_FALSE(s.others_started(key, mine.front().second * kChunk, 0));  // past the block
  EXPECT_FALSE(s.others_started(static_cast<uint32_t>(p.blocks().size()), 0, 0));  // no key
  EXPECT_TRUE(s.others_started(key, 0, 0));
  EXPECT_THROW(StartedSets(p, 0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace mercury::server
