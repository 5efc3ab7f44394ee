// What the chunk table's updates are: bit-identical for every arrival order,
// each optimizer against a scalar reference, the BSP, ASP and SSP policies,
// and several shards together covering the model. Its bookkeeping (exactly
// once, refusals, memory) is tested in chunk_table_test.cpp.
#include "agg/chunk_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "agg/chunk_table_test_util.h"

namespace mercury::agg {
namespace {

using namespace test;

// Runs one iteration with the given arrival order of (chunk, rank) and
// returns every chunk's update bytes, by chunk index.
std::vector<std::vector<float>> run_in_order(const Placement& p,
                                             const std::vector<ChunkRef>& chunks, Grads& grads,
                                             const std::vector<std::pair<size_t, uint16_t>>& order,
                                             OptimizerKind kind) {
  RecordingSink sink;
  ChunkTable table(p, config(4, kind), make_bsp(), sink);
  for (uint32_t key : p.shard_keys(0)) {
    std::vector<float> init(p.at(key).elements);
    std::iota(init.begin(), init.end(), 0.5f);
    table.initialize_block(key, init);
  }
  sink.updates.clear();
  for (auto [i, r] : order) EXPECT_TRUE(taken(table.contribute(grads.make(chunks, i, r, 0))));
  std::vector<std::vector<float>> out(chunks.size());
  for (const auto& s : sink.updates) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].key == s.u.key && chunks[i].offset == s.u.offset) out[i] = s.values;
    }
  }
  return out;
}

TEST(AggChunkTable, BitIdenticalForEveryArrivalOrder) {
  const auto decls = small_model();
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(2);
  Grads grads(rng, chunks, 4);

  // The orders differ enough to matter: summing in reverse rank order gives
  // different bytes for some element, so equality below is not luck.
  bool order_matters = false;
  for (size_t e = 0; e < chunks[0].elements; ++e) {
    const auto& g = grads.g[0];
    const float fwd = ((g[0][e] + g[1][e]) + g[2][e]) + g[3][e];
    const float rev = ((g[3][e] + g[2][e]) + g[1][e]) + g[0][e];
    order_matters |= std::memcmp(&fwd, &rev, 4) != 0;
  }
  ASSERT_TRUE(order_matters);

  for (OptimizerKind kind : {OptimizerKind::kSumOnly, OptimizerKind::kAdam}) {
    std::vector<std::pair<size_t, uint16_t>> base;
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (uint16_t r = 0; r < 4; ++r) base.push_back({i, r});
    }
    const auto reference = run_in_order(p, chunks, grads, base, kind);
    for (const auto& v : reference) ASSERT_FALSE(v.empty());
    // All 24 rank permutations, each chunk seeing them in a different
    // rotation, then random interleavings across chunks and ranks.
    std::array<uint16_t, 4> perm{0, 1, 2, 3};
    int rotation = 0;
    do {
      std::vector<std::pair<size_t, uint16_t>> order;
      for (size_t i = 0; i < chunks.size(); ++i) {
        std::array<uint16_t, 4> q = perm;
        std::rotate(q.begin(), q.begin() + (i + rotation) % 4, q.end());
        for (uint16_t r : q) order.push_back({i, r});
      }
      ++rotation;
      ASSERT_EQ(run_in_order(p, chunks, grads, order, kind), reference);
    } while (std::next_permutation(perm.begin(), perm.end()));
    for (int trial = 0; trial < 20; ++trial) {
      auto order = base;
      std::shuffle(order.begin(), order.end(), rng);
      const auto got = run_in_order(p, chunks, grads, order, kind);
      for (size_t i = 0; i < chunks.size(); ++i) {
        ASSERT_EQ(0, std::memcmp(got[i].data(), reference[i].data(), reference[i].size() * 4))
            << "chunk " << i << " trial " << trial;
      }
    }
  }
}

TEST(AggChunkTable, EachOptimizerMatchesAScalarReferenceOverSeveralSteps) {
  const std::vector<TensorDecl> decls{{"w", 1000, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  for (OptimizerKind kind : {OptimizerKind::kSumOnly, OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdam}) {
    SCOPED_TRACE(optimizer_name(kind));
    std::mt19937 rng(3);
    RecordingSink sink;
    const OptimizerConfig oc{.kind = kind, .learning_rate = 0.1f, .momentum = 0.8f};
    ShardConfig sc = config(3, kind);
    sc.optimizer = oc;
    ChunkTable table(p, sc, make_bsp(), sink);
    std::vector<float> param(1000), m(1000, 0.0f), v(1000, 0.0f);
    std::iota(param.begin(), param.end(), -3.0f);
    table.initialize_block(0, param);
    for (uint32_t t = 0; t < 4; ++t) {
      Grads grads(rng, chunks, 3);
      for (size_t i = 0; i < chunks.size(); ++i) {
        for (uint16_t r : {2, 0, 1})
          ASSERT_TRUE(taken(table.contribute(grads.make(chunks, i, r, t))));
      }
      // The formulas, element by element.
      const double step = t + 1;
      const float a = static_cast<float>(oc.learning_rate / (1.0 - std::pow(double{0.9f}, step)));
      const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{0.999f}, step)));
      for (size_t i = 0; i < chunks.size(); ++i) {
        for (uint32_t e = 0; e < chunks[i].elements; ++e) {
          const size_t x = chunks[i].offset / 4 + e;
          const auto& gr = grads.g[i];
          const float g = ((gr[0][e] + gr[1][e]) + gr[2][e]) * (1.0f / 3.0f);
          switch (kind) {
            case OptimizerKind::kSumOnly:
              param[x] = g;
              break;
            case OptimizerKind::kSgd:
              param[x] = param[x] - 0.1f * g;
              break;
            case OptimizerKind::kMomentum:
              m[x] = 0.8f * m[x] + g;
              param[x] = param[x] - 0.1f * m[x];
              break;
            case OptimizerKind::kAdam:
              m[x] = 0.9f * m[x] + (1.0f - 0.9f) * g;
              v[x] = 0.999f * v[x] + (1.0f - 0.999f) * (g * g);
              param[x] = param[x] - (a * m[x]) / (std::sqrt(v[x] * c2) + 1e-8f);
              break;
          }
        }
      }
      const auto got = table.parameters(0);
      ASSERT_EQ(got.size(), param.size());
      ASSERT_EQ(0, std::memcmp(got.data(), param.data(), param.size() * 4)) << "step " << t;
      EXPECT_EQ(table.version(0, 0), t + 1);
    }
  }
}

TEST(AggChunkTable, BspOrdering) {
  const std::vector<TensorDecl> decls{{"w", 354, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(4);
  Grads grads(rng, chunks, 3);
  RecordingSink sink;
  ChunkTable table(p, config(3), make_bsp(), sink);

  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0)), Outcome::kHeld);
  // Rank 0 already ahead at iteration 1 while 0 is not done: refused.
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 1)), Outcome::kFuture);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 1)), Outcome::kFuture);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kHeld);
  EXPECT_TRUE(sink.updates.empty());  // no update before every rank
  EXPECT_EQ(table.version(0, 0), 0u);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 0)), Outcome::kApplied);
  ASSERT_EQ(sink.updates.size(), 1u);
  EXPECT_EQ(sink.updates[0].u.version, 1u);
  EXPECT_EQ(sink.updates[0].u.staleness, 0u);
  EXPECT_EQ(table.version(0, 0), 1u);
  // Iteration 0 is over; iteration 1 is now the current one.
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 0)), Outcome::kStale);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 1)), Outcome::kHeld);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 2)), Outcome::kFuture);
  EXPECT_EQ(table.counters().count(Outcome::kFuture), 3u);
  EXPECT_EQ(table.counters().count(Outcome::kStale), 1u);
}

// A BSP job that shrinks (docs/membership.md): rank 2 of 4 is removed in
// the middle of iteration 0. A set that holds its contribution keeps it and
// averages over 4; the others average over the 3 ranks left, at once if
// they hold all three, and so does every set from then on.
TEST(AggChunkTable, BspSetsCompleteWithoutARemovedRank) {
  const auto decls = small_model();
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  ASSERT_GE(chunks.size(), 3u);
  std::mt19937 rng(9);
  Grads grads(rng, chunks, 4);
  RecordingSink sink;
  ChunkTable table(p, config(4, OptimizerKind::kSumOnly), make_bsp(), sink);
  // The rank-order sum of `ranks`' gradients of chunk i, x 1/n.
  auto average = [&](size_t i, std::initializer_list<uint16_t> ranks) {
    std::vector<float> a(chunks[i].elements, 0.0f);
    bool first = true;
    for (uint16_t r : ranks) {
      for (size_t e = 0; e < a.size(); ++e)
        a[e] = first ? grads.g[i][r][e] : a[e] + grads.g[i][r][e];
      first = false;
    }
    const float scale = 1.0f / static_cast<float>(ranks.size());
    for (float& x : a) x = x * scale;
    return a;
  };
  auto contribute = [&](size_t i, uint16_t r, uint32_t it) {
    return table.contribute(grads.make(chunks, i, r, it));
  };
  // Chunk 0 has ranks 0, 1, 3; chunk 1 ranks 2 and 0; chunk 2 nothing.
  for (uint16_t r : {0, 1, 3}) EXPECT_EQ(contribute(0, r, 0), Outcome::kHeld);
  for (uint16_t r : {2, 0}) EXPECT_EQ(contribute(1, r, 0), Outcome::kHeld);
  EXPECT_TRUE(sink.updates.empty());
  table.remove_rank(2);
  EXPECT_EQ(table.removed(), 0b0100u);
  // Chunk 0 completed in the call, over its three.
  ASSERT_EQ(sink.updates.size(), 1u);
  EXPECT_EQ(sink.updates[0].u.offset, chunks[0].offset);
  EXPECT_EQ(sink.updates[0].u.version, 1u);
  EXPECT_EQ(sink.updates[0].u.contributors, 0b1011u);
  EXPECT_EQ(sink.updates[0].values, average(0, {0, 1, 3}));
  // Chunk 1 keeps rank 2's and needs ranks 1 and 3: an average over 4.
  EXPECT_EQ(contribute(1, 1, 0), Outcome::kHeld);
  EXPECT_EQ(contribute(1, 3, 0), Outcome::kApplied);
  EXPECT_EQ(sink.updates.back().u.contributors, 0b1111u);
  EXPECT_EQ(sink.updates.back().values, average(1, {0, 1, 2, 3}));
  // Chunk 2's first set, and every later one, is over the three.
  EXPECT_EQ(contribute(2, 3, 0), Outcome::kHeld);
  EXPECT_EQ(contribute(2, 0, 0), Outcome::kHeld);
  EXPECT_EQ(contribute(2, 1, 0), Outcome::kApplied);
  EXPECT_EQ(sink.updates.back().values, average(2, {0, 1, 3}));
  for (uint16_t r : {1, 0}) EXPECT_EQ(contribute(0, r, 1), Outcome::kHeld);
  EXPECT_EQ(contribute(0, 3, 1), Outcome::kApplied);
  EXPECT_EQ(sink.updates.back().u.version, 2u);
  EXPECT_EQ(sink.updates.back().values, average(0, {0, 1, 3}));
  // Every buffer came back once, rank 2's included; nothing is held.
  EXPECT_EQ(table.held(), 0u);
  EXPECT_EQ(sink.released.count(&grads.g[1][2]), 1u);
  // Removing it again, or a rank that is not one, changes nothing.
  table.remove_rank(2);
  table.remove_rank(9);
  EXPECT_EQ(table.removed(), 0b0100u);
}

TEST(AggChunkTable, AspAppliesEachContributionAndRejectsReplays) {
  const std::vector<TensorDecl> decls{{"w", 354, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(9);
  Grads grads(rng, chunks, 2);
  RecordingSink sink;
  ChunkTable table(p, config(2), make_asp(), sink);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0)), Outcome::kDuplicate);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kApplied);  // 1 stale
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 3)), Outcome::kFuture);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 2)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 1)), Outcome::kDuplicate);  // replay
  ASSERT_EQ(sink.updates.size(), 3u);
  EXPECT_EQ(sink.updates[1].u.staleness, 1u);
  EXPECT_EQ(sink.updates[1].u.contributors, 2u);
  EXPECT_EQ(sink.updates[2].u.version, 3u);
  EXPECT_EQ(sink.released.size(), 3u);
  EXPECT_EQ(table.held(), 0u);
  // The ASP step is the plain gradient: p = 0 - lr * g0 - lr * g1 - lr * g0.
  const auto& g = grads.g[0];
  const float want = ((0.0f - 0.1f * g[0][5]) - 0.1f * g[1][5]) - 0.1f * g[0][5];
  EXPECT_EQ(table.parameters(0)[5], want);
}

// The per-rank clocks: a push behind its rank's clock is a replay, a gap is
// accepted (the clock moves past it), and every update says the chunk's
// slowest clock, which the workers' SSP wait reads.
TEST(AggChunkTable, AsyncUpdatesCarryTheSlowestClock) {
  const std::vector<TensorDecl> decls{{"w", 354, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(11);
  Grads grads(rng, chunks, 3);
  RecordingSink sink;
  ChunkTable table(p, config(3), make_asp(), sink);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0, 0)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 1, 1)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0, 0)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 3, 0)), Outcome::kDuplicate);  // replay
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 2, 0)), Outcome::kApplied);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 4, 5)), Outcome::kApplied);  // a gap
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 5, 3)), Outcome::kDuplicate);
  ASSERT_EQ(sink.updates.size(), 5u);
  // Clocks after each update (ranks 0, 1, 2): 1 0 0 | 2 0 0 | 2 1 0 | 2 1 1 | 2 1 6.
  const uint32_t want[] = {0, 0, 0, 1, 1};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(sink.updates[i].u.slowest, want[i]) << i;
  EXPECT_EQ(sink.updates[4].u.contributors, 4u);
  EXPECT_EQ(sink.updates[4].u.staleness, 0u);
  EXPECT_EQ(sink.updates[3].u.staleness, 1u);  // computed from version 2, applied at 3
}

TEST(AggChunkTable, SspBoundAndStalenessScaledStep) {
  const std::vector<TensorDecl> decls{{"w", 354, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(10);
  Grads grads(rng, chunks, 3);
  {
    RecordingSink sink;
    ChunkTable table(p, config(3), make_ssp(1), sink);
    EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0)), Outcome::kApplied);
    EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kApplied);  // staleness 1
    EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 0)), Outcome::kStale);    // staleness 2
    EXPECT_EQ(table.policy().name(), "ssp");
  }
  {
    RecordingSink sink;
    ChunkTable table(p, config(3), make_staleness_scaled(), sink);
    table.contribute(grads.make(chunks, 0, 0, 0));
    table.contribute(grads.make(chunks, 0, 1, 0));
    table.contribute(grads.make(chunks, 0, 2, 0));  // staleness 2: lr / 3
    const auto& g = grads.g[0];
    const float lr = 0.1f;
    const float want =
        ((0.0f - lr * g[0][7]) - (lr * 0.5f) * g[1][7]) - (lr * (1.0f / 3.0f)) * g[2][7];
    EXPECT_EQ(table.parameters(0)[7], want);
  }
  // training.staleness_lr's other rules: lr / sqrt(1 + s), and none.
  for (const StalenessLr rule : {StalenessLr::kInverseSqrt, StalenessLr::kNone}) {
    RecordingSink sink;
    ChunkTable table(p, config(3), make_staleness_scaled(UINT32_MAX, rule), sink);
    table.contribute(grads.make(chunks, 0, 0, 0));
    table.contribute(grads.make(chunks, 0, 1, 0));
    table.contribute(grads.make(chunks, 0, 2, 0));
    const auto& g = grads.g[0];
    const float lr = 0.1f;
    auto scale = [&](float s) {
      return rule == StalenessLr::kNone ? 1.0f : 1.0f / std::sqrt(1.0f + s);
    };
    const float want =
        ((0.0f - lr * g[0][7]) - (lr * scale(1)) * g[1][7]) - (lr * scale(2)) * g[2][7];
    EXPECT_EQ(table.parameters(0)[7], want);
    ASSERT_EQ(sink.updates.size(), 3u);
    EXPECT_EQ(sink.updates[2].u.staleness, 2u);
  }
}

// Several shards, as lib/server runs them: each table takes only its own
// blocks, and together they update every element of the model once per
// iteration, each with its own ranks' average.
TEST(AggChunkTable, ShardsTogetherCoverTheModel) {
  const std::vector<TensorDecl> decls{{"a", 20000, 0}, {"b", 300, 1}, {"c", 9000, 2}, {"d", 64, 3}};
  constexpr uint32_t kShards = 3;
  const Placement p = Placement::compute(decls, kShards);
  std::vector<RecordingSink> sinks(kShards);
  std::vector<std::unique_ptr<ChunkTable>> tables;
  for (uint32_t s = 0; s < kShards; ++s) {
    ShardConfig sc = config(2, OptimizerKind::kSumOnly);
    sc.shard = s;
    tables.push_back(std::make_unique<ChunkTable>(p, sc, make_bsp(), sinks[s]));
  }
  // Rank r pushes the value (r + 1) x (global element index) everywhere.
  uint64_t pushed = 0;
  for (const Block& q : p.blocks()) {
    std::vector<std::vector<float>> g(2, std::vector<float>(q.elements));
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint64_t e = 0; e < q.elements; ++e) {
        g[r][e] = static_cast<float>((r + 1) * (q.first_element + e));
      }
    }
    for (uint64_t e = 0; e < q.elements; e += kChunkElems) {
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(kChunkElems, q.elements - e));
      for (uint16_t r = 0; r < 2; ++r) {
        for (uint32_t s = 0; s < kShards; ++s) {
          const Outcome o = tables[s]->contribute(
              Contribution{.key = q.key,
                           .offset = static_cast<uint32_t>(e * 4),
                           .rank = r,
                           .data = reinterpret_cast<const std::byte*>(g[r].data() + e),
                           .bytes = n * 4});
          EXPECT_EQ(taken(o), s == q.shard) << outcome_name(o);
          if (s != q.shard) {
            EXPECT_EQ(o, Outcome::kNotOwned);
          }
        }
      }
      ++pushed;
    }
  }
  uint64_t updates = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    updates += tables[s]->counters().updates;
    EXPECT_EQ(tables[s]->held(), 0u);
  }
  EXPECT_EQ(updates, pushed);
  for (const Block& q : p.blocks()) {
    const auto values = tables[q.shard]->parameters(q.key);
    ASSERT_EQ(values.size(), q.elements);
    for (uint64_t e = 0; e < q.elements; ++e) {
      const float x = static_cast<float>(q.first_element + e);
      ASSERT_EQ(values[e], (x + 2 * x) * 0.5f);
    }
  }
}

}  // namespace
}  // namespace mercury::agg
