// The chunk table's settings, update rules and checkpoints: versioned
// hyperparameters applied from a version on, the average and rank 0 rules
// beside an optimizer, and a shard's state written as records, joined into
// a job's state file, checked and restored into fresh tables that then go
// on bit for bit as the tables that never stopped.
#include "agg/shard_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "agg/chunk_table_test_util.h"

namespace mercury::agg {
namespace {

using namespace test;

constexpr uint32_t kWorkers = 3;

ShardConfig config_for(uint32_t shard, OptimizerKind kind, bool decoupled = false) {
  ShardConfig c = config(kWorkers, kind);
  c.shard = shard;
  c.optimizer.weight_decay = 0.01f;
  c.optimizer.decoupled_weight_decay = decoupled;
  return c;
}

void initialize(const Placement& p, uint32_t shard, ChunkTable& table) {
  for (uint32_t key : p.shard_keys(shard)) {
    std::vector<float> init(p.at(key).elements);
    std::iota(init.begin(), init.end(), 0.25f * static_cast<float>(key + 1));
    for (float& v : init) v = std::sin(v);
    table.initialize_block(key, init);
  }
}

// One BSP round of every chunk of `table`: rank-ordered gradients drawn from
// `seed` (the same for every table given the same seed and round).
void round(ChunkTable& table, const std::vector<ChunkRef>& chunks, uint32_t version,
           uint32_t seed) {
  std::mt19937 rng(seed * 7919 + version);
  Grads grads(rng, chunks, kWorkers);
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(taken(table.contribute(grads.make(chunks, i, r, version))));
    }
  }
}

std::vector<float> params_of(const ChunkTable& t) {
  std::vector<float> out;
  for (uint64_t i = 0; i < t.chunks(); ++i) {
    const ChunkTable::ChunkView c = t.chunk_view(i);
    out.insert(out.end(), c.params.begin(), c.params.end());
    out.insert(out.end(), c.state0.begin(), c.state0.end());
    out.insert(out.end(), c.state1.begin(), c.state1.end());
  }
  return out;
}

// A change of the learning rate from version 2 on: the updates at versions 0
// and 1 use the old rate, the later ones the new, written out element by
// element for SGD.
TEST(AggSettings, ARateChangeAppliesFromItsVersion) {
  const std::vector<TensorDecl> decls = {{"w", 700, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  RecordingSink sink;
  ShardConfig c = config(kWorkers, OptimizerKind::kSgd);
  ChunkTable table(p, c, make_bsp(), sink);
  std::vector<float> want(700, 1.0f);
  table.initialize_block(0, want);
  Hyperparameters h = hyperparameters_of(c.optimizer);
  h.learning_rate = 0.5f;
  const auto [low, high] = table.version_range();
  EXPECT_EQ(low, 0u);
  EXPECT_EQ(high, 0u);
  EXPECT_EQ(table.optimizer().hyperparameters().change(2, h, low, high), Change::kAdded);
  for (uint32_t v = 0; v < 4; ++v) {
    std::mt19937 rng(v);
    Grads grads(rng, chunks, kWorkers);
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (uint16_t r = 0; r < kWorkers; ++r) table.contribute(grads.make(chunks, i, r, v));
      const float lr = v < 2 ? 0.1f : 0.5f;
      for (uint32_t e = 0; e < chunks[i].elements; ++e) {
        float g = grads.g[i][0][e];
        for (uint32_t r = 1; r < kWorkers; ++r) g = g + grads.g[i][r][e];
        g = g * (1.0f / static_cast<float>(kWorkers));
        float& w = want[chunks[i].offset / 4 + e];
        w = w - lr * g;
      }
    }
    // Too late: a chunk already updated from version v.
    EXPECT_EQ(table.optimizer().hyperparameters().change(v, h, v + 1, v + 1), Change::kTooLate);
  }
  EXPECT_EQ(table.version_range(), std::make_pair(4u, 4u));
  const std::span<const float> got = table.parameters(0);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
}

// Beside the optimizer's tensors, one averaged and one taken from rank 0:
// the average is the rank-order sum times 1/n, rank 0's push is copied,
// and neither touches the optimizer's state.
TEST(AggRules, AverageAndRank0BesideTheOptimizer) {
  const std::vector<TensorDecl> decls = {
      {"w", 400, 0, wire::Dtype::kFloat32, UpdateRule::kOptimizer},
      {"bn.mean", 300, 1, wire::Dtype::kFloat32, UpdateRule::kAverage},
      {"bn.var", 500, 2, wire::Dtype::kFloat32, UpdateRule::kRank0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  RecordingSink sink;
  ChunkTable table(p, config(kWorkers, OptimizerKind::kMomentum), make_bsp(), sink);
  initialize(p, 0, table);
  std::vector<std::vector<float>> before(3);
  for (uint32_t k = 0; k < 3; ++k) {
    const auto v = table.parameters(k);
    before[k].assign(v.begin(), v.end());
  }
  std::mt19937 rng(4);
  Grads grads(rng, chunks, kWorkers);
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = kWorkers; r-- > 0;) table.contribute(grads.make(chunks, i, r, 0));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkRef& c = chunks[i];
    const std::span<const float> got = table.parameters(c.key);
    for (uint32_t e = 0; e < c.elements; ++e) {
      const uint32_t at = c.offset / 4 + e;
      float sum = grads.g[i][0][e];
      for (uint32_t r = 1; r < kWorkers; ++r) sum = sum + grads.g[i][r][e];
      const float avg = sum * (1.0f / static_cast<float>(kWorkers));
      if (c.key == 0) {
        ASSERT_EQ(got[at], before[0][at] - 0.1f * (0.9f * 0.0f + avg)) << e;
      } else if (c.key == 1) {
        ASSERT_EQ(got[at], avg) << e;
      } else {
        ASSERT_EQ(got[at], grads.g[i][0][e]) << e;
      }
    }
  }
  // The momentum of the rules' chunks stays zero.
  for (uint64_t i = 0; i < table.chunks(); ++i) {
    const ChunkTable::ChunkView v = table.chunk_view(i);
    EXPECT_EQ(v.version, 1u);
    if (v.key == 0) continue;
    for (float u : v.state0) ASSERT_EQ(u, 0.0f);
  }
}

// ASP applies each push alone: a rank-0 tensor changes only with rank 0's.
TEST(AggRules, Rank0UnderAspTakesOnlyRank0sPush) {
  const std::vector<TensorDecl> decls = {
      {"bn.var", 100, 0, wire::Dtype::kFloat32, UpdateRule::kRank0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  RecordingSink sink;
  ChunkTable table(p, config(kWorkers, OptimizerKind::kSgd), make_asp(), sink);
  initialize(p, 0, table);
  const std::vector<float> init(table.parameters(0).begin(), table.parameters(0).end());
  std::mt19937 rng(5);
  Grads grads(rng, chunks, kWorkers);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kApplied);
  EXPECT_EQ(std::memcmp(table.parameters(0).data(), init.data(), 400), 0);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 1)), Outcome::kApplied);
  EXPECT_EQ(std::memcmp(table.parameters(0).data(), grads.g[0][0].data(), 400), 0);
  EXPECT_EQ(table.version(0, 0), 2u);
}

// The optimizer on rank 0's push when the ranks push the same gradient, as they
// should: nothing counted; then one rank's push differs in one chunk (a rank whose
// step diverged): that update is counted, and rank 0's is applied as ever.
TEST(AggRules, OptimizerOnRank0CountsAPushThatDiffersFromRank0s) {
  const std::vector<TensorDecl> decls = {
      {"w", 900, 0, wire::Dtype::kFloat32, UpdateRule::kOptimizerRank0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  ASSERT_GT(chunks.size(), 1u);
  RecordingSink sink;
  ChunkTable table(p, config_for(0, OptimizerKind::kSgd, false), make_bsp(), sink);
  initialize(p, 0, table);
  for (uint32_t v = 0; v < 2; ++v) {
    std::mt19937 rng(v);
    Grads grads(rng, chunks, kWorkers);
    for (auto& by_rank : grads.g) {
      for (size_t r = 1; r < by_rank.size(); ++r) by_rank[r] = by_rank[0];  // every rank rank 0's
    }
    if (v == 1) grads.g[1][2][0] += 1.0f;  // chunk 1, rank 2: one element differs
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (uint16_t r = 0; r < kWorkers; ++r) {
        ASSERT_TRUE(taken(table.contribute(grads.make(chunks, i, r, v))));
      }
    }
    EXPECT_EQ(table.counters().rank0_differ, v) << "round " << v;
  }
  EXPECT_EQ(table.version(0, 0), 2u);
}

// The optimizer on rank 0's push: the ranks' pushes differ here (the rule
// takes rank 0's, not their average), and rounds 2 and 4 are skipped (rank
// 0's pushes are the skip marker). The table goes as one of a single worker
// fed rank 0's pushes of the rounds taken (AdamW: its t counts the steps
// taken, not the versions), is checkpointed with fewer steps than its
// version, restored, and goes on as the table that never stopped.
TEST(AggRules, OptimizerOnRank0sPushSkipsMarkedSteps) {
  const std::vector<TensorDecl> decls = {
      {"w", 900, 0, wire::Dtype::kFloat32, UpdateRule::kOptimizerRank0}};
  const Placement p = Placement::compute(decls, 1);
  const std::vector<TensorDecl> alone_decls = {{"w", 900, 0}};
  const Placement alone_p = Placement::compute(alone_decls, 1);
  const auto chunks = chunks_of(p, 0);
  RecordingSink sink;
  ChunkTable table(p, config_for(0, OptimizerKind::kAdam, true), make_bsp(), sink);
  ChunkTable restored(p, config_for(0, OptimizerKind::kAdam, true), make_bsp(), sink);
  ShardConfig one = config_for(0, OptimizerKind::kAdam, true);
  one.workers = 1;
  ChunkTable alone(alone_p, one, make_bsp(), sink);
  initialize(p, 0, table);
  initialize(alone_p, 0, alone);
  const auto is_skipped = [](uint32_t v) { return v == 2 || v == 4; };
  uint32_t taken_rounds = 0;
  std::vector<std::byte> pages;
  for (uint32_t v = 0; v < 8; ++v) {
    std::mt19937 rng(v);
    Grads grads(rng, chunks, kWorkers);
    if (is_skipped(v)) {
      for (auto& by_rank : grads.g) {
        for (auto& g : by_rank) {
          for (float& x : g) std::memcpy(&x, &kSkipStepFloat32, 4);
        }
      }
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (uint16_t r = kWorkers; r-- > 0;) {
        ASSERT_TRUE(taken(table.contribute(grads.make(chunks, i, r, v))));
        if (v >= 6) {
          ASSERT_TRUE(taken(restored.contribute(grads.make(chunks, i, r, v))));
        }
      }
      if (!is_skipped(v)) {
        ASSERT_TRUE(taken(alone.contribute(grads.make(chunks, i, 0, taken_rounds))));
      }
    }
    if (!is_skipped(v)) ++taken_rounds;
    ASSERT_EQ(std::memcmp(table.parameters(0).data(), alone.parameters(0).data(), 900 * 4), 0)
        << "round " << v;
    for (uint64_t i = 0; i < table.chunks(); ++i) {
      const ChunkTable::ChunkView a = table.chunk_view(i);
      const ChunkTable::ChunkView b = alone.chunk_view(i);
      ASSERT_EQ(a.version, v + 1);
      ASSERT_EQ(a.steps, taken_rounds);
      ASSERT_EQ(std::memcmp(a.state0.data(), b.state0.data(), a.state0.size_bytes()), 0);
      ASSERT_EQ(std::memcmp(a.state1.data(), b.state1.data(), a.state1.size_bytes()), 0);
    }
    if (v == 5) {
      // The checkpoint after 6 versions and 4 steps, into a fresh table.
      export_page(table, p.fingerprint(), 0, kStatePageBytes, pages);
      const std::vector<std::byte> file = join_state(pages, p.fingerprint());
      const StateFile f = check_state(file, p, kChunkBytes, OptimizerKind::kAdam, true);
      EXPECT_EQ(f.version, 6u);
      std::vector<RecordRef> mine = {f.hyperparameters};
      mine.insert(mine.end(), f.chunks.begin(), f.chunks.end());
      ASSERT_EQ(restore_records(restored, p.fingerprint(), 6, mine), "");
      EXPECT_EQ(restored.chunk_view(0).steps, 4u);
      // The rule is part of the job: the file is not the plain optimizer's.
      try {
        check_state(file, alone_p, kChunkBytes, OptimizerKind::kAdam, true);
        ADD_FAILURE() << "accepted";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("another job"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(table.counters().steps_skipped, 2 * table.chunks());
  // The ranks' pushes differed in every round taken (the skipped rounds' were all the marker).
  EXPECT_EQ(table.counters().rank0_differ, 6 * table.chunks());
  EXPECT_EQ(params_of(restored), params_of(table));
  // A plain optimizer chunk restored with fewer steps than its version is refused.
  ChunkTable plain(alone_p, one, make_bsp(), sink);
  const ChunkTable::ChunkView c = alone.chunk_view(0);
  EXPECT_EQ(plain.restore(c.key, c.offset, c.version, c.params, c.state0, c.state1, c.steps - 1),
            Outcome::kBadLength);
  EXPECT_EQ(plain.restore(c.key, c.offset, c.version, c.params, c.state0, c.state1, c.steps),
            Outcome::kInitialized);
}

// Two shards, run 3 rounds with a rate change, checkpointed, restored into
// fresh tables, 3 more rounds: every parameter and state byte as the tables
// that ran 6 rounds without stopping. Momentum, Adam and AdamW.
TEST(AggShardState, ResumeIsBitExact) {
  for (auto [kind, decoupled] :
       {std::pair{OptimizerKind::kMomentum, false}, std::pair{OptimizerKind::kAdam, false},
        std::pair{OptimizerKind::kAdam, true}}) {
    SCOPED_TRACE(std::string(optimizer_name(kind)) + (decoupled ? "w" : ""));
    const std::vector<TensorDecl> decls = {
        {"conv", 1000, 0},
        {"fc", 5000, 1},
        {"bn.mean", 64, 2, wire::Dtype::kFloat32, UpdateRule::kAverage}};
    const Placement p = Placement::compute(decls, 2);
    const uint64_t job = p.fingerprint();
    RecordingSink sink;
    std::vector<std::unique_ptr<ChunkTable>> straight, first, resumed;
    for (uint32_t s = 0; s < 2; ++s) {
      straight.push_back(
          std::make_unique<ChunkTable>(p, config_for(s, kind, decoupled), make_bsp(), sink));
      first.push_back(
          std::make_unique<ChunkTable>(p, config_for(s, kind, decoupled), make_bsp(), sink));
      resumed.push_back(
          std::make_unique<ChunkTable>(p, config_for(s, kind, decoupled), make_bsp(), sink));
      initialize(p, s, *straight[s]);
      initialize(p, s, *first[s]);
    }
    Hyperparameters h = straight[0]->optimizer().hyperparameters().at(0);
    h.learning_rate = 0.03f;
    for (uint32_t v = 0; v < 6; ++v) {
      for (uint32_t s = 0; s < 2; ++s) {
        const auto chunks = chunks_of(p, s);
        if (v == 2) {
          ASSERT_EQ(straight[s]->optimizer().hyperparameters().change(2, h, 2, 2), Change::kAdded);
          ASSERT_EQ(first[s]->optimizer().hyperparameters().change(2, h, 2, 2), Change::kAdded);
        }
        round(*straight[s], chunks, v, s);
        if (v < 3) round(*first[s], chunks, v, s);
      }
    }
    // The checkpoint: each shard's pages (small ones, so there are several),
    // in the order two servers' answers might interleave.
    std::vector<std::byte> pages;
    for (uint32_t s : {1u, 0u}) {
      uint64_t next = 0;
      int n = 0;
      do {
        next = export_page(*first[s], job, next, 4096, pages);
        ++n;
      } while (next < first[s]->chunks());
      EXPECT_GT(n, 1);
    }
    const std::vector<std::byte> file = join_state(pages, job);
    const StateFile f = check_state(file, p, kChunkBytes, kind, decoupled);
    EXPECT_EQ(f.version, 3u);
    // Each shard gets its chunks and the hyperparameters.
    for (uint32_t s = 0; s < 2; ++s) {
      std::vector<RecordRef> mine = {f.hyperparameters};
      for (const RecordRef& r : f.chunks) {
        if (p.at(r.header.key).shard == s) mine.push_back(r);
      }
      EXPECT_EQ(chunks_without_values(*resumed[s]), resumed[s]->chunks());
      ASSERT_EQ(restore_records(*resumed[s], job, 3, mine), "");
      EXPECT_EQ(chunks_without_values(*resumed[s]), 0u);
      EXPECT_EQ(params_of(*resumed[s]), params_of(*first[s]));
      EXPECT_EQ(resumed[s]->optimizer().hyperparameters().entries().back().values, h);
      // A chunk restored twice, or at another version, is refused.
      EXPECT_NE(restore_records(*resumed[s], job, 3, {&mine[1], 1}).find("cannot be restored"),
                std::string::npos);
    }
    for (uint32_t v = 3; v < 6; ++v) {
      for (uint32_t s = 0; s < 2; ++s) round(*resumed[s], chunks_of(p, s), v, s);
    }
    for (uint32_t s = 0; s < 2; ++s) {
      const std::vector<float> a = params_of(*straight[s]);
      const std::vector<float> b = params_of(*resumed[s]);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "shard " << s;
    }
  }
}

TEST(AggShardState, ABadStateFileIsRefusedWithItsReason) {
  const std::vector<TensorDecl> decls = {{"conv", 1000, 0}, {"fc", 700, 1}};
  const Placement p = Placement::compute(decls, 1);
  const uint64_t job = p.fingerprint();
  RecordingSink sink;
  ChunkTable table(p, config(kWorkers, OptimizerKind::kMomentum), make_bsp(), sink);
  initialize(p, 0, table);
  std::vector<std::byte> pages;
  export_page(table, job, 0, kStatePageBytes, pages);
  const std::vector<std::byte> file = join_state(pages, job);
  const auto refused = [&](std::span<const std::byte> bytes, const Placement& q,
                           OptimizerKind kind = OptimizerKind::kMomentum) {
    try {
      check_state(bytes, q, kChunkBytes, kind, false);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused(file, p), "accepted");
  // Another job: the same tensors with another rule.
  std::vector<TensorDecl> other = decls;
  other[1].update = UpdateRule::kAverage;
  EXPECT_NE(refused(file, Placement::compute(other, 1)).find("another job"), std::string::npos);
  EXPECT_NE(refused(file, p, OptimizerKind::kAdam).find("optimizer momentum"), std::string::npos);
  // A chunk missing: the last record cut off.
  const RecordRef last = split_records(file, job).back();
  const std::span<const std::byte> short_file(file.data(), file.size() - last.bytes.size());
  EXPECT_NE(refused(short_file, p).find("the state has no tensor 1"), std::string::npos)
      << refused(short_file, p);
  // A torn record.
  EXPECT_NE(refused(std::span(file).first(file.size() - 1), p).find("truncated"),
            std::string::npos);
  // No hyperparameter record first.
  const std::span<const std::byte> chunks_only =
      std::span(file).subspan(split_records(file, job).front().bytes.size());
  EXPECT_NE(refused(chunks_only, p).find("not the hyperparameter record"), std::string::npos);
  // Chunks at two versions: not one step boundary.
  std::mt19937 rng(1);
  const auto cs = chunks_of(p, 0);
  Grads grads(rng, cs, kWorkers);
  for (uint16_t r = 0; r < kWorkers; ++r) table.contribute(grads.make(cs, 0, r, 0));
  std::vector<std::byte> torn_pages;
  export_page(table, job, 0, kStatePageBytes, torn_pages);
  EXPECT_NE(refused(join_state(torn_pages, job), p).find("not of one step boundary"),
            std::string::npos);
  // Two exports of the same shard: every chunk twice.
  std::vector<std::byte> twice = pages;
  twice.insert(twice.end(), pages.begin(), pages.end());
  EXPECT_THROW(join_state(twice, job), std::invalid_argument);
}

}  // namespace
}  // namespace mercury::agg
