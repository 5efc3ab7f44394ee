#include "agg/chunk_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace mercury::agg {
namespace {

constexpr uint32_t kChunkBytes = 1408;  // net::payload_per_packet(1500)
constexpr uint32_t kChunkElems = kChunkBytes / 4;

// Records what the table hands out. A token may come back more than once
// only where a test hands the same buffer in twice (ASP, later iterations).
class RecordingSink final : public ChunkSink {
 public:
  struct Seen {
    Update u;
    std::vector<float> values;
  };
  void on_update(const Update& u) override {
    Seen s{u, std::vector<float>(u.bytes / 4)};
    std::memcpy(s.values.data(), u.data, u.bytes);
    s.u.data = nullptr;
    updates.push_back(std::move(s));
  }
  void release(void* const* tokens, uint32_t count) override {
    for (uint32_t i = 0; i < count; ++i) released.insert(tokens[i]);
  }
  std::vector<Seen> updates;
  std::multiset<void*> released;
};

// Three tensors over two shards; the test works on shard 0 (or one shard).
std::vector<TensorDecl> small_model() {
  return {{"conv", 1000, 0}, {"fc", 5000, 1}, {"bias", 77, 2}};
}

ShardConfig config(uint32_t workers, OptimizerKind kind = OptimizerKind::kSgd) {
  return ShardConfig{.shard = 0,
                     .workers = workers,
                     .chunk_bytes = kChunkBytes,
                     .optimizer = {.kind = kind, .learning_rate = 0.1f}};
}

// One chunk's address and size in the table.
struct ChunkRef {
  uint32_t key, offset, elements;
};

std::vector<ChunkRef> chunks_of(const Placement& p, uint32_t shard) {
  std::vector<ChunkRef> out;
  for (uint32_t key : p.shard_keys(shard)) {
    const uint64_t n = p.at(key).elements;
    for (uint64_t e = 0; e < n; e += kChunkElems) {
      out.push_back({key, static_cast<uint32_t>(e * 4),
                     static_cast<uint32_t>(std::min<uint64_t>(kChunkElems, n - e))});
    }
  }
  return out;
}

// Gradients whose magnitudes differ by orders, so float addition order shows.
std::vector<float> gradient(std::mt19937& rng, uint32_t n, uint32_t rank) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  const float scale = std::pow(10.0f, static_cast<float>(rank % 4) * 2.0f - 3.0f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng) * scale;
  return v;
}

// Contribution data per (chunk, rank): stable storage and a unique token.
struct Grads {
  std::vector<std::vector<std::vector<float>>> g;  // [chunk][rank]
  Grads(std::mt19937& rng, const std::vector<ChunkRef>& chunks, uint32_t workers) {
    for (const ChunkRef& c : chunks) {
      g.emplace_back();
      for (uint32_t r = 0; r < workers; ++r) g.back().push_back(gradient(rng, c.elements, r));
    }
  }
  Contribution make(const std::vector<ChunkRef>& chunks, size_t i, uint16_t rank,
                    uint32_t iteration) {
    return Contribution{.key = chunks[i].key,
                        .offset = chunks[i].offset,
                        .iteration = iteration,
                        .rank = rank,
                        .data = reinterpret_cast<const std::byte*>(g[i][rank].data()),
                        .bytes = chunks[i].elements * 4,
                        .token = &g[i][rank]};
  }
};

TEST(AggChunkTable, ExactlyOnceUnderDuplicates) {
  const auto decls = small_model();
  const Placement p = Placement::compute(decls, 2);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(1);
  Grads grads(rng, chunks, 4);
  RecordingSink sink;
  ChunkTable table(p, config(4, OptimizerKind::kSumOnly), make_bsp(), sink);

  // Every contribution three times, shuffled: the first copy is taken; a
  // copy before the set completes is a duplicate, after it a stale one.
  std::vector<std::pair<size_t, uint16_t>> sends;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < 4; ++r) {
      for (int k = 0; k < 3; ++k) sends.push_back({i, r});
    }
  }
  std::shuffle(sends.begin(), sends.end(), rng);
  uint64_t taken_count = 0;
  for (auto [i, r] : sends) {
    const Outcome o = table.contribute(grads.make(chunks, i, r, 0));
    if (taken(o))
      ++taken_count;
    else
      EXPECT_TRUE(o == Outcome::kDuplicate || o == Outcome::kStale) << outcome_name(o);
  }
  EXPECT_EQ(taken_count, chunks.size() * 4);
  EXPECT_EQ(sink.updates.size(), chunks.size());
  EXPECT_EQ(table.counters().updates, chunks.size());
  EXPECT_EQ(table.counters().count(Outcome::kDuplicate) + table.counters().count(Outcome::kStale),
            chunks.size() * 4 * 2);
  EXPECT_EQ(table.counters().count(Outcome::kApplied), chunks.size());
  EXPECT_EQ(sink.released.size(), chunks.size() * 4);
  EXPECT_EQ(std::set<void*>(sink.released.begin(), sink.released.end()).size(), chunks.size() * 4);
  EXPECT_EQ(table.held(), 0u);
  // Each chunk's update is the average of the four, counted once each.
  for (const auto& s : sink.updates) {
    const auto it = std::find_if(chunks.begin(), chunks.end(), [&](const ChunkRef& c) {
      return c.key == s.u.key && c.offset == s.u.offset;
    });
    ASSERT_NE(it, chunks.end());
    const size_t i = static_cast<size_t>(it - chunks.begin());
    EXPECT_EQ(s.u.version, 1u);
    EXPECT_EQ(s.u.contributors, 0xfu);
    for (uint32_t e = 0; e < it->elements; ++e) {
      const float want =
          (((grads.g[i][0][e] + grads.g[i][1][e]) + grads.g[i][2][e]) + grads.g[i][3][e]) * 0.25f;
      ASSERT_EQ(std::memcmp(&s.values[e], &want, 4), 0);
    }
  }
}

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

TEST(AggChunkTable, HeldRanksShowTheCurrentSet) {
  const std::vector<TensorDecl> decls{{"w", 1000, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(5);
  Grads grads(rng, chunks, 3);
  RecordingSink sink;
  ChunkTable table(p, config(3), make_bsp(), sink);
  EXPECT_EQ(table.held_ranks(0, 0), 0u);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 2, 0)), Outcome::kHeld);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 0, 0)), Outcome::kHeld);
  EXPECT_EQ(table.held_ranks(0, 0), 0b101u);
  EXPECT_EQ(table.held_ranks(0, kChunkBytes), 0u);  // another chunk
  EXPECT_EQ(table.contribute(grads.make(chunks, 1, 1, 0)), Outcome::kHeld);
  EXPECT_EQ(table.held_ranks(0, kChunkBytes), 0b010u);
  // Completing the set clears it; the next iteration starts from nothing.
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kApplied);
  EXPECT_EQ(table.held_ranks(0, 0), 0u);
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 1)), Outcome::kHeld);
  EXPECT_EQ(table.held_ranks(0, 0), 0b010u);
  // Not here: an unknown key, an offset past the block, inside a chunk.
  EXPECT_EQ(table.held_ranks(7, 0), 0u);
  EXPECT_EQ(table.held_ranks(0, 4000), 0u);
  EXPECT_EQ(table.held_ranks(0, 4), 0u);
}

TEST(AggChunkTable, RejectsMalformedContributionsByReason) {
  const auto decls = small_model();
  const Placement p = Placement::compute(decls, 2, {.max_block_bytes = 4000});
  const auto mine = chunks_of(p, 0);
  const auto theirs = chunks_of(p, 1);
  ASSERT_FALSE(theirs.empty());
  std::vector<float> buf(kChunkElems);
  RecordingSink sink;
  ChunkTable table(p, config(4), make_bsp(), sink);
  auto c = [&](uint32_t key, uint32_t offset, uint32_t bytes, uint16_t rank) {
    return table.contribute(Contribution{.key = key,
                                         .offset = offset,
                                         .rank = rank,
                                         .data = reinterpret_cast<const std::byte*>(buf.data()),
                                         .bytes = bytes});
  };
  const ChunkRef& m = mine[0];
  EXPECT_EQ(c(m.key, m.offset, m.elements * 4, 4), Outcome::kBadRank);
  EXPECT_EQ(c(uint32_t(p.blocks().size()), 0, m.elements * 4, 0), Outcome::kUnknownKey);
  EXPECT_EQ(c(theirs[0].key, 0, theirs[0].elements * 4, 0), Outcome::kNotOwned);
  EXPECT_EQ(c(m.key, m.offset + 4, m.elements * 4, 0), Outcome::kBadOffset);
  EXPECT_EQ(c(m.key, uint32_t(p.at(m.key).bytes()) + kChunkBytes * 8, kChunkBytes, 0),
            Outcome::kBadOffset);
  EXPECT_EQ(c(m.key, m.offset, m.elements * 4 - 4, 0), Outcome::kBadLength);
  EXPECT_EQ(table.counters().rejected(), 6u);
  EXPECT_EQ(table.held(), 0u);
  EXPECT_TRUE(sink.released.empty());  // rejected buffers stay with the caller
  for (Outcome o :
       {Outcome::kBadRank, Outcome::kUnknownKey, Outcome::kNotOwned, Outcome::kBadLength}) {
    EXPECT_EQ(table.counters().count(o), 1u) << outcome_name(o);
  }
  EXPECT_EQ(table.counters().count(Outcome::kBadOffset), 2u);
}

TEST(AggChunkTable, InitialParametersFromRankZero) {
  const std::vector<TensorDecl> decls{{"w", 800, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  RecordingSink sink;
  ChunkTable table(p, config(2), make_bsp(), sink);
  std::vector<float> init(800);
  std::iota(init.begin(), init.end(), 1.0f);
  const auto* bytes = reinterpret_cast<const std::byte*>(init.data());
  EXPECT_EQ(table.initialize(0, 0, bytes, kChunkBytes), Outcome::kInitialized);
  EXPECT_EQ(table.initialize(0, 0, bytes, kChunkBytes), Outcome::kDuplicate);
  ASSERT_EQ(sink.updates.size(), 1u);
  EXPECT_EQ(sink.updates[0].u.version, 0u);
  EXPECT_EQ(sink.updates[0].values, std::vector<float>(init.begin(), init.begin() + kChunkElems));
  table.initialize_block(0, init);  // the rest; chunk 0 counted as a duplicate again
  EXPECT_EQ(sink.updates.size(), chunks.size());
  EXPECT_EQ(std::vector<float>(table.parameters(0).begin(), table.parameters(0).end()), init);
  EXPECT_THROW(table.initialize_block(0, std::span<const float>(init).first(10)),
               std::invalid_argument);
  EXPECT_THROW(table.initialize_block(1, init), std::invalid_argument);
  // After the first update of a chunk its initial values can no longer be changed.
  std::mt19937 rng(5);
  Grads grads(rng, chunks, 2);
  table.contribute(grads.make(chunks, 0, 0, 0));
  EXPECT_EQ(table.contribute(grads.make(chunks, 0, 1, 0)), Outcome::kApplied);
  EXPECT_EQ(table.initialize(0, 0, bytes, kChunkBytes), Outcome::kStale);
}

TEST(AggChunkTable, MemoryIsBoundedByConfiguration) {
  const std::vector<TensorDecl> decls{{"a", 100000, 0}, {"b", 3000, 1}};
  const Placement p = Placement::compute(decls, 1);
  RecordingSink sink;
  ShardConfig sc = config(4, OptimizerKind::kAdam);
  const uint64_t need = ChunkTable::memory_needed(p, sc, BspPolicy{});
  // Parameters and two Adam arrays dominate; slots and chunk records are the rest.
  const uint64_t chunks =
      (100000 + kChunkElems - 1) / kChunkElems + (3000 + kChunkElems - 1) / kChunkElems;
  EXPECT_GE(need, 3 * 103000 * 4 + chunks * (32 + 4 * 16));
  EXPECT_LE(need, 3 * 103000 * 4 + chunks * (32 + 4 * 16) + 1024);
  sc.memory_limit_bytes = need - 1;
  EXPECT_THROW(ChunkTable(p, sc, make_bsp(), sink), std::length_error);

  sc.memory_limit_bytes = need;
  sc.max_held = 10;
  ChunkTable table(p, sc, make_bsp(), sink);
  EXPECT_EQ(table.memory_bytes(), need);
  EXPECT_EQ(table.max_held(), 10u);
  // Three ranks push everything; only max_held buffers are ever held.
  const auto refs = chunks_of(p, 0);
  std::mt19937 rng(6);
  Grads grads(rng, refs, 4);
  for (uint16_t r = 0; r < 3; ++r) {
    for (size_t i = 0; i < refs.size(); ++i) {
      const Outcome o = table.contribute(grads.make(refs, i, r, 0));
      EXPECT_TRUE(o == Outcome::kHeld || o == Outcome::kHoldLimit);
      EXPECT_LE(table.held(), 10u);
    }
  }
  EXPECT_EQ(table.held(), 10u);
  EXPECT_EQ(table.counters().count(Outcome::kHoldLimit), refs.size() * 3 - 10);
  // With one rank missing from a chunk, the set-completing contribution is
  // still taken at the limit.
  ShardConfig two = sc;
  two.workers = 2;
  two.max_held = 1;
  RecordingSink sink2;
  ChunkTable t2(p, two, make_bsp(), sink2);
  EXPECT_EQ(t2.contribute(grads.make(refs, 0, 0, 0)), Outcome::kHeld);
  EXPECT_EQ(t2.contribute(grads.make(refs, 1, 0, 0)), Outcome::kHoldLimit);
  EXPECT_EQ(t2.contribute(grads.make(refs, 0, 1, 0)), Outcome::kApplied);
  EXPECT_EQ(t2.held(), 0u);
  EXPECT_EQ(table.memory_bytes(), need);  // traffic never grew the table
}

TEST(AggChunkTable, DestructionReleasesHeldBuffers) {
  const std::vector<TensorDecl> decls{{"w", 1000, 0}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  std::mt19937 rng(8);
  Grads grads(rng, chunks, 3);
  RecordingSink sink;
  {
    ChunkTable table(p, config(3), make_bsp(), sink);
    table.contribute(grads.make(chunks, 0, 0, 0));
    table.contribute(grads.make(chunks, 1, 2, 0));
    EXPECT_EQ(table.held(), 2u);
    EXPECT_TRUE(sink.released.empty());
  }
  EXPECT_EQ(sink.released.size(), 2u);
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
}

TEST(AggChunkTable, RejectsBadConfiguration) {
  const std::vector<TensorDecl> decls{{"w", 64, 0}};
  const Placement p = Placement::compute(decls, 2);
  RecordingSink sink;
  ShardConfig sc = config(4);
  sc.workers = 65;
  EXPECT_THROW(ChunkTable(p, sc, make_bsp(), sink), std::invalid_argument);
  sc = config(4);
  sc.chunk_bytes = 1418;
  EXPECT_THROW(ChunkTable(p, sc, make_bsp(), sink), std::invalid_argument);
  sc = config(4);
  sc.shard = 2;
  EXPECT_THROW(ChunkTable(p, sc, make_bsp(), sink), std::invalid_argument);
  sc = config(4);
  EXPECT_THROW(ChunkTable(p, sc, nullptr, sink), std::invalid_argument);
  // A shard that owns nothing is legal (more shards than blocks).
  sc.shard = 1;
  ChunkTable empty(p, sc, make_bsp(), sink);
  EXPECT_EQ(empty.chunks(), 0u);
}

// locate() divides by chunk_bytes with a multiply (see chunk_table.cpp):
// every offset, for a 1500 and a 9000 MTU chunk and the extremes, is mapped
// as a real division would.
TEST(AggChunkTable, OffsetToChunkMatchesDivisionForEveryOffset) {
  for (uint32_t chunk_bytes : {1416u, 8952u, 4u, 65532u}) {
    const uint64_t elements = chunk_bytes == 4 ? 4000 : 300000;
    const std::vector<TensorDecl> decls{{"w", elements, 0}};
    const Placement p = Placement::compute(decls, 1);
    RecordingSink sink;
    ShardConfig sc = config(2);
    sc.chunk_bytes = chunk_bytes;
    ChunkTable table(p, sc, make_bsp(), sink);
    const uint32_t total = static_cast<uint32_t>(elements * 4);
    for (uint32_t off = 0; off < total + 2 * chunk_bytes; ++off) {
      const uint32_t want = off % chunk_bytes == 0 && off < total ? 0u : UINT32_MAX;
      ASSERT_EQ(table.version(0, off), want) << "chunk_bytes=" << chunk_bytes << " off=" << off;
    }
    // And the chunk found is the right one: complete chunk 3 only.
    std::vector<float> g(chunk_bytes / 4, 1.0f);
    for (uint16_t r = 0; r < 2; ++r) {
      table.contribute(Contribution{.key = 0,
                                    .offset = 3 * chunk_bytes,
                                    .rank = r,
                                    .data = reinterpret_cast<const std::byte*>(g.data()),
                                    .bytes = chunk_bytes});
    }
    EXPECT_EQ(table.version(0, 2 * chunk_bytes), 0u);
    EXPECT_EQ(table.version(0, 3 * chunk_bytes), 1u);
    EXPECT_EQ(table.version(0, 4 * chunk_bytes), 0u);
    ASSERT_EQ(sink.updates.size(), 1u);
    EXPECT_EQ(sink.updates[0].u.offset, 3 * chunk_bytes);
  }
  // Offsets near 2^32 (blocks up to the 4 GiB message cap).
  const uint64_t magic = UINT64_MAX / 1416 + 1;
  for (uint64_t off = UINT32_MAX - 100000; off <= UINT32_MAX; ++off) {
    const uint64_t q = static_cast<uint64_t>((static_cast<unsigned __int128>(magic) * off) >> 64);
    ASSERT_EQ(q, off / 1416);
    ASSERT_EQ(off * magic <= magic - 1, off % 1416 == 0);
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

// A lossy, duplicating, reordering network between 4 workers and a shard,
// over several BSP iterations, against a plain oracle: every chunk ends
// bit-identical to the rank-order reference, each (chunk, rank, iteration)
// is taken exactly once and every extra copy is rejected and counted.
TEST(AggChunkTable, RandomNetworkMatchesTheOracle) {
  const std::vector<TensorDecl> decls{{"a", 3000, 0}, {"b", 700, 1}, {"c", 354, 2}};
  const Placement p = Placement::compute(decls, 1);
  const auto chunks = chunks_of(p, 0);
  constexpr uint32_t kIterations = 4;
  constexpr uint16_t kRanks = 4;
  // The gradient of (chunk, rank, iteration): fixed, magnitudes spread out.
  std::vector<std::vector<float>> store;
  auto grad_index = [&](size_t i, uint16_t r, uint32_t it) {
    return (i * kRanks + r) * kIterations + it;
  };
  std::mt19937 gen(99);
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint16_t r = 0; r < kRanks; ++r) {
      for (uint32_t it = 0; it < kIterations; ++it) {
        store.push_back(gradient(gen, chunks[i].elements, r + it));
      }
    }
  }
  for (uint32_t seed = 0; seed < 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    RecordingSink sink;
    ChunkTable table(p, config(kRanks), make_bsp(), sink);
    struct Packet {
      size_t chunk;
      uint16_t rank;
      uint32_t iteration;
    };
    std::vector<Packet> network;
    for (size_t i = 0; i < chunks.size(); ++i) {
      for (uint16_t r = 0; r < kRanks; ++r) network.push_back({i, r, 0});
    }
    uint64_t sent = network.size();
    uint64_t taken_count = 0;
    std::bernoulli_distribution duplicate(0.3);
    while (!network.empty()) {
      // Any packet in flight may arrive next; some arrive twice or more.
      std::uniform_int_distribution<size_t> pick(0, network.size() - 1);
      const size_t k = pick(rng);
      const Packet pk = network[k];
      if (duplicate(rng)) {
        ++sent;  // a retransmitted or duplicated copy stays in flight
      } else {
        network[k] = network.back();
        network.pop_back();
      }
      const auto& g = store[grad_index(pk.chunk, pk.rank, pk.iteration)];
      const Outcome o =
          table.contribute(Contribution{.key = chunks[pk.chunk].key,
                                        .offset = chunks[pk.chunk].offset,
                                        .iteration = pk.iteration,
                                        .rank = pk.rank,
                                        .data = reinterpret_cast<const std::byte*>(g.data()),
                                        .bytes = chunks[pk.chunk].elements * 4,
                                        .token = const_cast<float*>(g.data())});
      if (taken(o)) {
        ++taken_count;
      } else {
        ASSERT_TRUE(o == Outcome::kDuplicate || o == Outcome::kStale) << outcome_name(o);
      }
      // An update reaches every worker, which then pushes the next iteration.
      if (o == Outcome::kApplied && pk.iteration + 1 < kIterations) {
        for (uint16_t r = 0; r < kRanks; ++r) network.push_back({pk.chunk, r, pk.iteration + 1});
        sent += kRanks;
      }
    }
    EXPECT_EQ(taken_count, chunks.size() * kRanks * kIterations);
    EXPECT_EQ(table.counters().updates, chunks.size() * kIterations);
    EXPECT_EQ(table.counters().rejected(), sent - taken_count);
    EXPECT_EQ(table.held(), 0u);
    EXPECT_EQ(sink.released.size(), taken_count);
    // The oracle: SGD in rank order, iteration after iteration.
    for (size_t i = 0; i < chunks.size(); ++i) {
      std::vector<float> ref(chunks[i].elements, 0.0f);
      for (uint32_t it = 0; it < kIterations; ++it) {
        for (uint32_t e = 0; e < chunks[i].elements; ++e) {
          float sum = store[grad_index(i, 0, it)][e];
          for (uint16_t r = 1; r < kRanks; ++r) sum = sum + store[grad_index(i, r, it)][e];
          ref[e] = ref[e] - 0.1f * (sum * 0.25f);
        }
      }
      const float* got = table.parameters(chunks[i].key).data() + chunks[i].offset / 4;
      ASSERT_EQ(0, std::memcmp(got, ref.data(), ref.size() * 4)) << "chunk " << i;
      EXPECT_EQ(table.version(chunks[i].key, chunks[i].offset), kIterations);
    }
  }
}

}  // namespace
}  // namespace mercury::agg
