// The chunk table's staging chunks: contributions marked `copy` are copied and
// their buffers left with the caller, the reduction is bit-identical to holding
// the buffers, staging chunks come back when their sets complete, and the count
// is bounded by configuration and by the memory limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/chunk_table_test_util.h"

namespace mercury::agg {
namespace {

using namespace test;

ShardConfig staged(uint32_t workers, uint64_t staging) {
  ShardConfig c = config(workers, OptimizerKind::kSumOnly);
  c.staging_chunks = staging;
  return c;
}

// Runs one iteration of every chunk, every rank, in a shuffled order; every
// contribution but the set's last marked `copy` when `mark`. Returns the updates.
std::vector<RecordingSink::Seen> run_round(ChunkTable& table, RecordingSink& sink, Grads& grads,
                                           const std::vector<ChunkRef>& chunks, uint32_t workers,
                                           bool mark, std::mt19937& rng) {
  std::vector<std::pair<size_t, uint16_t>> sends;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < workers; ++r) sends.push_back({i, r});
  }
  std::shuffle(sends.begin(), sends.end(), rng);
  for (auto [i, r] : sends) {
    Contribution c = grads.make(chunks, i, r, 0);
    c.copy = mark;
    const Outcome o = table.contribute(c);
    EXPECT_TRUE(taken(o)) << outcome_name(o);
  }
  return sink.updates;
}

TEST(AggChunkTableStaging, CopiesAreBitIdenticalToHeldBuffersAndLeaveBuffersWithTheCaller) {
  const auto decls = small_model();
  const Placement p = Placement::compute(decls, 2);
  const auto chunks = chunks_of(p, 0);
  constexpr uint32_t kWorkers = 4;
  std::mt19937 g1(3), g2(3), order1(9), order2(9);
  Grads held_grads(g1, chunks, kWorkers), copied_grads(g2, chunks, kWorkers);
  RecordingSink held_sink, copied_sink;
  ChunkTable held(p, staged(kWorkers, 0), make_bsp(), held_sink);
  ChunkTable copied(p, staged(kWorkers, kStagingMost), make_bsp(), copied_sink);
  EXPECT_EQ(held.staging_chunks(), 0u);
  EXPECT_EQ(copied.staging_chunks(), chunks.size() * (kWorkers - 1));

  const auto want = run_round(held, held_sink, held_grads, chunks, kWorkers, false, order1);
  // Marked copies: the caller's buffers may change as soon as contribute() returns.
  std::vector<std::pair<size_t, uint16_t>> sends;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < kWorkers; ++r) sends.push_back({i, r});
  }
  std::shuffle(sends.begin(), sends.end(), order2);
  uint64_t copies = 0;
  for (auto [i, r] : sends) {
    std::vector<float> scratch = copied_grads.g[i][r];
    Contribution c = copied_grads.make(chunks, i, r, 0);
    c.data = reinterpret_cast<const std::byte*>(scratch.data());
    c.copy = true;
    const Outcome o = copied.contribute(c);
    ASSERT_TRUE(o == Outcome::kCopied || o == Outcome::kApplied) << outcome_name(o);
    if (o == Outcome::kCopied) ++copies;
    std::fill(scratch.begin(), scratch.end(), -1.0e30f);  // the caller reuses its buffer
  }
  // Every set: N - 1 copies, the last contribution reduced from its buffer and released.
  EXPECT_EQ(copies, chunks.size() * (kWorkers - 1));
  EXPECT_EQ(copied.counters().count(Outcome::kCopied), copies);
  EXPECT_EQ(copied_sink.released.size(), chunks.size());
  EXPECT_EQ(copied.held(), 0u);
  EXPECT_EQ(copied.staged(), 0u);
  EXPECT_EQ(copied.staging_released(), copies);
  EXPECT_EQ(copied.counters().staging_full, 0u);

  ASSERT_EQ(copied_sink.updates.size(), want.size());
  for (const auto& s : copied_sink.updates) {
    const auto it = std::find_if(want.begin(), want.end(), [&](const RecordingSink::Seen& w) {
      return w.u.key == s.u.key && w.u.offset == s.u.offset;
    });
    ASSERT_NE(it, want.end());
    EXPECT_EQ(s.u.contributors, it->u.contributors);
    ASSERT_EQ(s.values.size(), it->values.size());
    EXPECT_EQ(std::memcmp(s.values.data(), it->values.data(), s.values.size() * 4), 0);
  }
}

// One tensor of `n` chunks on one shard, gradients for `workers` ranks, a sink.
struct OneTensor {
  Placement p;
  std::vector<ChunkRef> chunks;
  std::mt19937 rng;
  Grads grads;
  RecordingSink sink;
  OneTensor(uint32_t n, uint32_t workers, uint32_t seed)
      : p(Placement::compute(std::vector<TensorDecl>{{"w", kChunkElems * n, 0}}, 1)),
        chunks(chunks_of(p, 0)),
        rng(seed),
        grads(rng, chunks, workers) {}
};

TEST(AggChunkTableStaging, WithNoChunkFreeAMarkedContributionIsHeldAndCounted) {
  OneTensor t(3, 2, 4);
  const auto& chunks = t.chunks;
  Grads& grads = t.grads;
  RecordingSink& sink = t.sink;
  ChunkTable table(t.p, staged(2, 2), make_bsp(), sink);
  ASSERT_EQ(table.staging_chunks(), 2u);
  for (size_t i = 0; i < 3; ++i) {
    Contribution c = grads.make(chunks, i, 0, 0);
    c.copy = true;
    EXPECT_EQ(table.contribute(c), i < 2 ? Outcome::kCopied : Outcome::kHeld);
  }
  EXPECT_EQ(table.counters().staging_full, 1u);
  EXPECT_EQ(table.staged(), 2u);
  EXPECT_EQ(table.held(), 1u);
  // A completing contribution is never copied, marked or not.
  Contribution last = grads.make(chunks, 0, 1, 0);
  last.copy = true;
  EXPECT_EQ(table.contribute(last), Outcome::kApplied);
  EXPECT_EQ(table.staged(), 1u);
  EXPECT_EQ(table.staging_released(), 1u);
  // The freed chunk serves the next marked contribution of another chunk's next set.
  EXPECT_EQ(table.contribute(grads.make(chunks, 1, 1, 0)), Outcome::kApplied);
  Contribution again = grads.make(chunks, 0, 0, 1);
  again.copy = true;
  EXPECT_EQ(table.contribute(again), Outcome::kCopied);
  EXPECT_EQ(table.staged(), 1u);
  // Released buffers: the two completing contributions only, and rank 0's
  // held chunk 2 is still the caller's until its set completes.
  EXPECT_EQ(sink.released.size(), 2u);
  EXPECT_EQ(sink.released.count(&grads.g[2][0]), 0u);
}

TEST(AggChunkTableStaging, TheDestructorReleasesHeldBuffersButNotStagedCopies) {
  OneTensor t(2, 3, 6);
  const auto& chunks = t.chunks;
  Grads& grads = t.grads;
  RecordingSink& sink = t.sink;
  {
    ChunkTable table(t.p, staged(3, kStagingMost), make_bsp(), sink);
    Contribution c = grads.make(chunks, 0, 0, 0);
    c.copy = true;
    EXPECT_EQ(table.contribute(c), Outcome::kCopied);
    EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kHeld);
  }
  ASSERT_EQ(sink.released.size(), 1u);
  EXPECT_EQ(sink.released.count(&grads.g[0][1]), 1u);
}

TEST(AggChunkTableStaging, CountAndMemoryFollowTheConfigurationAndTheMemoryLimit) {
  const std::vector<TensorDecl> decls{{"w", kChunkElems * 1000, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto bsp = make_bsp();
  ShardConfig c = staged(4, 0);
  const uint64_t base = ChunkTable::memory_needed(p, c, *bsp);
  // Capped at chunks x (N - 1), the most a BSP set can hold.
  c.staging_chunks = 1u << 20;
  EXPECT_EQ(ChunkTable::staging_for(p, c, *bsp), 3000u);
  c.staging_chunks = 10;
  EXPECT_EQ(ChunkTable::staging_for(p, c, *bsp), 10u);
  EXPECT_EQ(ChunkTable::memory_needed(p, c, *bsp), base + 10 * (kChunkBytes + 4));
  // kStagingMost: all of them while they fit, then what fits under the limit.
  c.staging_chunks = kStagingMost;
  EXPECT_EQ(ChunkTable::staging_for(p, c, *bsp), 3000u);
  c.memory_limit_bytes = base + (uint64_t{4} << 20);
  const uint64_t trimmed = ChunkTable::staging_for(p, c, *bsp);
  EXPECT_GT(trimmed, 0u);
  EXPECT_LT(trimmed, 3000u);
  EXPECT_LE(ChunkTable::memory_needed(p, c, *bsp), c.memory_limit_bytes);
  RecordingSink sink;
  ChunkTable table(p, c, make_bsp(), sink);
  EXPECT_EQ(table.staging_chunks(), trimmed);
  EXPECT_EQ(table.memory_bytes(), ChunkTable::memory_needed(p, c, *bsp));
  // No room at all: none, and the table still builds.
  c.memory_limit_bytes = base;
  EXPECT_EQ(ChunkTable::staging_for(p, c, *bsp), 0u);
  // One worker: nothing is ever held, so nothing is staged.
  c = staged(1, kStagingMost);
  EXPECT_EQ(ChunkTable::staging_for(p, c, *bsp), 0u);
}

// A running server that rolls back (docs/durability.md, "Several servers"):
// rewind() gives back every held buffer and staging chunk and leaves every
// chunk without values, so the checkpoint's chunks are restored over a table
// that had moved on, and the sets after it aggregate as in a fresh table.
TEST(AggChunkTableStaging, RewindGivesBackWhatTheSetsHoldAndRestoreTakesTheChunksAgain) {
  OneTensor t(3, 3, 8);
  const auto& chunks = t.chunks;
  ChunkTable table(t.p, staged(3, 2), make_bsp(), t.sink);
  // Version 1 of every chunk, then a second round half in: chunk 0 holds
  // rank 0's buffer and rank 1's staged copy, chunk 1 rank 2's copy.
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(taken(table.contribute(t.grads.make(chunks, i, r, 0))));
    }
  }
  ASSERT_EQ(table.version(chunks[0].key, chunks[0].offset), 1u);
  const size_t released_before = t.sink.released.size();
  EXPECT_EQ(table.contribute(t.grads.make(chunks, 0, 0, 1)), Outcome::kHeld);
  Contribution c = t.grads.make(chunks, 0, 1, 1);
  c.copy = true;
  EXPECT_EQ(table.contribute(c), Outcome::kCopied);
  Contribution d = t.grads.make(chunks, 1, 2, 1);
  d.copy = true;
  EXPECT_EQ(table.contribute(d), Outcome::kCopied);
  ASSERT_EQ(table.held(), 1u);
  ASSERT_EQ(table.staged(), 2u);
  const uint64_t staging_released = table.staging_released();

  EXPECT_EQ(table.rewind(), 1u);
  EXPECT_EQ(table.held(), 0u);
  EXPECT_EQ(table.staged(), 0u);
  EXPECT_EQ(table.staging_released(), staging_released + 2);
  ASSERT_EQ(t.sink.released.size(), released_before + 1);
  EXPECT_EQ(t.sink.released.count(&t.grads.g[0][0]), 2u);  // version 1's set, then the rewind
  for (const ChunkRef& ch : chunks) {
    EXPECT_EQ(table.version(ch.key, ch.offset), 0u);
    EXPECT_EQ(table.held_ranks(ch.key, ch.offset), 0u);
  }
  // Restored at version 1: taken again, emitted at 1, and version 1's
  // pushes make version 2.
  const std::vector<float> values(kChunkElems, 0.5f);
  const size_t updates = t.sink.updates.size();
  for (const ChunkRef& ch : chunks) {
    EXPECT_EQ(table.restore(ch.key, ch.offset, 1, std::span<const float>(values).first(ch.elements),
                            {}, {}),
              Outcome::kInitialized);
  }
  ASSERT_EQ(t.sink.updates.size(), updates + chunks.size());
  EXPECT_EQ(t.sink.updates.back().u.version, 1u);
  for (uint16_t r = 0; r < 3; ++r) {
    Contribution again = t.grads.make(chunks, 0, r, 1);
    again.copy = r != 2;
    EXPECT_TRUE(taken(table.contribute(again)));
  }
  EXPECT_EQ(table.version(chunks[0].key, chunks[0].offset), 2u);
  EXPECT_EQ(table.staged(), 0u);
}

}  // namespace
}  // namespace mercury::agg
