// The chunk table's bookkeeping: each (chunk, rank) taken exactly once under
// duplicates, loss and reordering; every malformed contribution refused by
// reason; initial values, held buffers, memory bounds and configuration. What
// the updates are (reduction order, optimizers, sync policies) is tested in
// chunk_table_update_test.cpp.
#include "agg/chunk_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "agg/chunk_table_test_util.h"

namespace mercury::agg {
namespace {

using namespace test;

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
