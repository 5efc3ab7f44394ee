// A hot standby's replication state (replica.h) with real chunk tables: the
// primary's updates, as the replica packets carry them (in any order within
// a version), assembled and adopted by a standby's table; the standby then
// goes on from there as the primary would have.
#include "server/replica.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/sync_policy.h"

namespace mercury::server {
namespace {

constexpr uint32_t kChunkBytes = 1408;
constexpr uint32_t kWorkers = 3;

agg::ShardConfig shard_config(agg::OptimizerKind kind) {
  return agg::ShardConfig{.shard = 0,
                          .workers = kWorkers,
                          .chunk_bytes = kChunkBytes,
                          .optimizer = {.kind = kind, .learning_rate = 0.05f, .momentum = 0.9f}};
}

std::vector<agg::TensorDecl> model() { return {{"conv", 1500, 0}, {"fc", 700, 1}, {"b", 9, 2}}; }

// One replica packet as the primary's shard sends it (shard_replica.cpp).
struct Packet {
  uint64_t chunk;
  uint32_t version;
  uint32_t tag;
  std::vector<std::byte> bytes;
};

class NullSink final : public agg::ChunkSink {
 public:
  void on_update(const agg::Update&) override {}
  void release(void* const*, uint32_t) override {}
};

// The primary's sink: each update (and initial values) becomes its replica
// packets, one per array, as send_replica_st() makes them.
class ReplicatingSink final : public agg::ChunkSink {
 public:
  agg::ChunkTable* table = nullptr;
  std::vector<Packet> out;
  void on_update(const agg::Update& u) override {
    const int64_t i = table->chunk_index(u.key, u.offset);
    ASSERT_GE(i, 0);
    const agg::ChunkTable::ChunkView v = table->chunk_view(static_cast<uint64_t>(i));
    const std::span<const float> arrays[] = {v.params, v.state0, v.state1};
    for (uint32_t a = 0; a < kReplicaArrays; ++a) {
      if (a > 0 && arrays[a].empty()) continue;
      Packet p{static_cast<uint64_t>(i), v.version, replica_tag(v.steps, a), {}};
      p.bytes.resize(arrays[a].size_bytes());
      std::memcpy(p.bytes.data(), arrays[a].data(), p.bytes.size());
      out.push_back(std::move(p));
    }
  }
  void release(void* const*, uint32_t) override {}
};

uint32_t arrays_of(const agg::ChunkTable& t) {
  const agg::ChunkTable::ChunkView v = t.chunk_view(0);
  return 1 + (v.state0.empty() ? 0 : 1) + (v.state1.empty() ? 0 : 1);
}

// A primary and its standby, both a chunk table of the same placement.
class Pair {
 public:
  explicit Pair(agg::OptimizerKind kind)
      : placement_(agg::Placement::compute(model(), 1)),
        primary_(placement_, shard_config(kind), agg::make_bsp(), sink_),
        standby_(placement_, shard_config(kind), agg::make_bsp(), null_) {
    sink_.table = &primary_;
    assembly_.reset(standby_.chunks(), arrays_of(standby_), kChunkBytes / 4);
    for (uint64_t i = 0; i < primary_.chunks(); ++i) {
      const agg::ChunkTable::ChunkView v = primary_.chunk_view(i);
      std::vector<float> init(v.params.size());
      for (size_t e = 0; e < init.size(); ++e) init[e] = 0.01f * static_cast<float>((e + i) % 17);
      EXPECT_EQ(
          primary_.initialize(v.key, v.offset, reinterpret_cast<const std::byte*>(init.data()),
                              static_cast<uint32_t>(init.size() * 4)),
          agg::Outcome::kInitialized);
    }
  }

  static std::vector<float> gradient(uint64_t chunk, uint16_t rank, uint32_t version, size_t n) {
    std::vector<float> g(n);
    for (size_t e = 0; e < n; ++e) {
      g[e] = 0.003f * static_cast<float>((e * 5 + chunk * 7 + rank * 3 + version) % 13) - 0.02f;
    }
    return g;
  }

  // Every chunk of `table` takes every rank's gradient of its version.
  static void update(agg::ChunkTable& table) {
    for (uint64_t i = 0; i < table.chunks(); ++i) {
      const agg::ChunkTable::ChunkView v = table.chunk_view(i);
      std::vector<std::vector<float>> g;
      for (uint16_t r = 0; r < kWorkers; ++r)
        g.push_back(gradient(i, r, v.version, v.params.size()));
      for (uint16_t r = 0; r < kWorkers; ++r) {
        const agg::Outcome o = table.contribute(
            agg::Contribution{.key = v.key,
                              .offset = v.offset,
                              .iteration = v.version,
                              .rank = r,
                              .data = reinterpret_cast<const std::byte*>(g[r].data()),
                              .bytes = static_cast<uint32_t>(g[r].size() * 4)});
        ASSERT_TRUE(agg::taken(o)) << agg::outcome_name(o);
      }
    }
  }

  // Delivers the replica packets made so far in a shuffled order (a
  // version's arrays may come in any order; versions one after the other,
  // as the gate makes them) but the last `keep` of them, which stay in
  // flight; returns the versions adopted.
  uint64_t deliver(std::mt19937& rng, size_t keep = 0) {
    std::vector<Packet>& out = sink_.out;
    const size_t n = out.size() - std::min(keep, out.size());
    std::stable_sort(out.begin(), out.begin() + static_cast<int64_t>(n),
                     [](const Packet& a, const Packet& b) { return a.version < b.version; });
    // Shuffle within each version.
    for (size_t b = 0; b < n;) {
      size_t e = b;
      while (e < n && out[e].version == out[b].version) ++e;
      std::shuffle(out.begin() + static_cast<int64_t>(b), out.begin() + static_cast<int64_t>(e),
                   rng);
      b = e;
    }
    uint64_t adopted = 0;
    for (size_t k = 0; k < n; ++k) adopted += take(out[k]);
    out.erase(out.begin(), out.begin() + static_cast<int64_t>(n));
    return adopted;
  }

  // What Shard::take_replica_st does with one packet.
  bool take(const Packet& p) {
    const agg::ChunkTable::ChunkView v = standby_.chunk_view(p.chunk);
    const auto n = static_cast<uint32_t>(v.params.size());
    const ReplicaAssembly::Verdict verdict =
        assembly_.add(p.chunk, p.version, replica_steps(p.tag), replica_array(p.tag), p.bytes, n,
                      v.initialized, v.version);
    if (verdict != ReplicaAssembly::Verdict::kComplete) return false;
    const uint32_t arrays = assembly_.arrays();
    const std::span<const float> none;
    EXPECT_EQ(standby_.replicate(p.chunk, p.version, assembly_.steps(p.chunk),
                                 assembly_.array(p.chunk, 0, n),
                                 arrays > 1 ? assembly_.array(p.chunk, 1, n) : none,
                                 arrays > 2 ? assembly_.array(p.chunk, 2, n) : none),
              agg::Outcome::kInitialized);
    return true;
  }

  static std::vector<float> state(const agg::ChunkTable& t) {
    std::vector<float> out;
    for (uint64_t i = 0; i < t.chunks(); ++i) {
      const agg::ChunkTable::ChunkView v = t.chunk_view(i);
      out.insert(out.end(), v.params.begin(), v.params.end());
      out.insert(out.end(), v.state0.begin(), v.state0.end());
      out.insert(out.end(), v.state1.begin(), v.state1.end());
      out.push_back(static_cast<float>(v.version));
      out.push_back(static_cast<float>(v.steps));
    }
    return out;
  }
  static bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  agg::Placement placement_;
  ReplicatingSink sink_;
  NullSink null_;
  agg::ChunkTable primary_;
  agg::ChunkTable standby_;
  ReplicaAssembly assembly_;
};

class ReplicaAllOptimizers : public ::testing::TestWithParam<agg::OptimizerKind> {};

TEST_P(ReplicaAllOptimizers, StandbyHoldsThePrimaryBitForBitAndGoesOnAsIt) {
  Pair pair(GetParam());
  std::mt19937 rng(46);
  const uint64_t chunks = pair.primary_.chunks();
  EXPECT_EQ(pair.deliver(rng), chunks);  // version 0, rank 0's values
  for (int v = 0; v < 5; ++v) {
    Pair::update(pair.primary_);
    EXPECT_EQ(pair.deliver(rng), chunks);
    EXPECT_TRUE(Pair::same(Pair::state(pair.primary_), Pair::state(pair.standby_)));
  }
  // The primary dies with the next version's replicas partly delivered: the
  // chunks whose arrays are all in move on, the others stay whole at the
  // version before (none torn).
  Pair::update(pair.primary_);
  const size_t in_flight = pair.sink_.out.size() / 3;
  pair.deliver(rng, in_flight);
  uint64_t moved = 0;
  for (uint64_t i = 0; i < chunks; ++i) {
    const uint32_t v = pair.standby_.chunk_view(i).version;
    EXPECT_TRUE(v == 5 || v == 6) << v;
    moved += v == 6 ? 1 : 0;
  }
  EXPECT_GT(moved, 0u);
  EXPECT_LT(moved, chunks);
  // Promoted: the chunks at 5 aggregate the resent pushes of iteration 5;
  // a push of 5 to a chunk at 6 is stale (the shard answers it again).
  for (uint64_t i = 0; i < chunks; ++i) {
    const agg::ChunkTable::ChunkView v = pair.standby_.chunk_view(i);
    if (v.version == 6) {
      const std::vector<float> g = Pair::gradient(i, 0, 5, v.params.size());
      EXPECT_EQ(pair.standby_.contribute(
                    agg::Contribution{.key = v.key,
                                      .offset = v.offset,
                                      .iteration = 5,
                                      .rank = 0,
                                      .data = reinterpret_cast<const std::byte*>(g.data()),
                                      .bytes = static_cast<uint32_t>(g.size() * 4)}),
                agg::Outcome::kStale);
      continue;
    }
    std::vector<std::vector<float>> g;
    for (uint16_t r = 0; r < kWorkers; ++r) g.push_back(Pair::gradient(i, r, 5, v.params.size()));
    for (uint16_t r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(agg::taken(pair.standby_.contribute(
          agg::Contribution{.key = v.key,
                            .offset = v.offset,
                            .iteration = 5,
                            .rank = r,
                            .data = reinterpret_cast<const std::byte*>(g[r].data()),
                            .bytes = static_cast<uint32_t>(g[r].size() * 4)})));
    }
  }
  EXPECT_TRUE(Pair::same(Pair::state(pair.primary_), Pair::state(pair.standby_)));
  // And the next rounds on the standby are the primary's.
  for (int v = 0; v < 2; ++v) {
    Pair::update(pair.primary_);
    Pair::update(pair.standby_);
  }
  EXPECT_TRUE(Pair::same(Pair::state(pair.primary_), Pair::state(pair.standby_)));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ReplicaAllOptimizers,
                         ::testing::Values(agg::OptimizerKind::kSgd, agg::OptimizerKind::kMomentum,
                                           agg::OptimizerKind::kAdam));

TEST(ReplicaAssembly, RefusesStaleVersionsBadArraysAndLengths) {
  ReplicaAssembly a;
  a.reset(2, 2, 4);
  const std::vector<std::byte> four(16), three(12);
  using V = ReplicaAssembly::Verdict;
  EXPECT_EQ(a.add(0, 3, 3, 2, four, 4, true, 2), V::kBad);    // no array 2 with momentum
  EXPECT_EQ(a.add(0, 3, 3, 0, three, 4, true, 2), V::kBad);   // not the chunk's length
  EXPECT_EQ(a.add(0, 5, 5, 0, four, 8, true, 2), V::kBad);    // longer than a chunk
  EXPECT_EQ(a.add(0, 2, 2, 0, four, 4, true, 2), V::kStale);  // the version it holds
  EXPECT_EQ(a.add(0, 3, 3, 1, four, 4, true, 2), V::kPending);
  EXPECT_TRUE(a.partial(0));
  EXPECT_EQ(a.add(0, 3, 3, 1, four, 4, true, 2), V::kPending);  // the same array again
  EXPECT_EQ(a.add(0, 3, 3, 0, four, 4, true, 2), V::kComplete);
  EXPECT_FALSE(a.partial(0));
  // Version 0 of a chunk that has no values yet is taken.
  EXPECT_EQ(a.add(1, 0, 0, 0, four, 4, false, 0), V::kPending);
  EXPECT_EQ(a.add(1, 0, 0, 1, four, 4, false, 0), V::kComplete);
  EXPECT_EQ(replica_steps(replica_tag(1234, 2)), 1234u);
  EXPECT_EQ(replica_array(replica_tag(1234, 2)), 2u);
}

TEST(ReplicaGates, OpenOnTheLastAcknowledgementOrAllAtOnceWhenTheStandbyIsLost) {
  ReplicaGates g;
  g.reset(3);
  g.arm(0, 2);
  g.arm(2, 3);
  EXPECT_FALSE(g.settle(0));
  EXPECT_TRUE(g.settle(0));
  EXPECT_FALSE(g.settle(0));  // open: a late completion changes nothing
  EXPECT_FALSE(g.settle(1));
  EXPECT_FALSE(g.settle(2));
  std::vector<uint64_t> opened;
  EXPECT_EQ(g.open_all([&](uint64_t i) { opened.push_back(i); }), 1u);
  EXPECT_EQ(opened, std::vector<uint64_t>{2});
  EXPECT_FALSE(g.settle(2));
  EXPECT_EQ(g.waiting(2), 0u);
}

}  // namespace
}  // namespace mercury::server
