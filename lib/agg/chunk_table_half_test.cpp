// The chunk table with bfloat16 and float16 blocks: geometry in 2-byte
// elements, initial values, and updates that are bit for bit those of a
// float32 table fed the same contributions widened, with every update rounded
// once into the block's dtype.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/chunk_table_test_util.h"
#include "agg/half.h"
#include "agg/shard_state.h"

namespace mercury::agg {
namespace {

using test::kChunkBytes;
using wire::Dtype;

// Keeps every update's bytes, by (key, offset), the latest version last.
class Sink final : public ChunkSink {
 public:
  struct Seen {
    Update u;
    std::vector<std::byte> bytes;
    const std::byte* at = nullptr;  // where the table handed them out
  };
  void on_update(const Update& u) override {
    Seen s{u, std::vector<std::byte>(u.data, u.data + u.bytes), u.data};
    s.u.data = nullptr;
    updates.push_back(std::move(s));
  }
  void release(void* const*, uint32_t count) override { released += count; }
  std::vector<Seen> updates;
  uint64_t released = 0;
};

uint16_t narrow(Dtype d, float f) {
  return d == Dtype::kBFloat16 ? float_to_bf16(f) : float_to_fp16(f);
}
float widen(Dtype d, uint16_t h) {
  return d == Dtype::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
}

TEST(AggChunkTableHalf, ChunksHoldTwiceTheElementsAndLengthsAreInTheDtype) {
  // 1000 bfloat16 elements: chunks of 704 and 296 (1408 and 592 bytes).
  const Placement p = Placement::compute(
      std::vector<TensorDecl>{{"w", 1000, 0, Dtype::kBFloat16}, {"v", 1000, 1}}, 1);
  ASSERT_EQ(p.at(0).bytes(), 2000u);
  ASSERT_EQ(p.at(1).bytes(), 4000u);
  Sink sink;
  const ShardConfig config = test::config(2);
  ChunkTable table(p, config, make_bsp(), sink);
  EXPECT_EQ(table.chunks(), 2u + 3u);  // 704 + 296 bfloat16; 352 + 352 + 296 float32
  EXPECT_EQ(table.memory_bytes(), ChunkTable::memory_needed(p, config, table.policy()));
  // Against the same tensors in float32: one chunk fewer (its record and
  // N = 2 held slots), and the half-precision scratch (one chunk's float32
  // sum, 2 x 1408 bytes, and every element's rounded update, 2 x 2000 bytes,
  // whole lines), which a table owning no half-precision block does not have.
  const Placement f32 =
      Placement::compute(std::vector<TensorDecl>{{"w", 1000, 0}, {"v", 1000, 1}}, 1);
  constexpr uint64_t kOneChunk = 32 + 2 * 16;
  EXPECT_EQ(ChunkTable::memory_needed(p, config, table.policy()) + kOneChunk,
            ChunkTable::memory_needed(f32, config, table.policy()) + 2 * 1408 + 4032);

  std::vector<uint16_t> g(704, 0x3f80);
  const auto* data = reinterpret_cast<const std::byte*>(g.data());
  auto c = [&](uint32_t offset, uint32_t bytes) {
    return table.contribute(
        Contribution{.key = 0, .offset = offset, .rank = 0, .data = data, .bytes = bytes});
  };
  EXPECT_EQ(c(704, 1408), Outcome::kBadOffset);   // a float32 chunk boundary, not a bfloat16 one
  EXPECT_EQ(c(0, 704), Outcome::kBadLength);      // 352 elements' worth
  EXPECT_EQ(c(1408, 1184), Outcome::kBadLength);  // 296 elements as float32
  EXPECT_EQ(c(2000, 0), Outcome::kBadOffset);     // past the block
  EXPECT_EQ(c(1408, 592), Outcome::kHeld);
  EXPECT_EQ(c(0, 1408), Outcome::kHeld);
  EXPECT_EQ(table.held(), 2u);
  EXPECT_EQ(table.held_ranks(0, 1408), 1u);
  EXPECT_EQ(table.version(0, 1408), 0u);
  EXPECT_EQ(table.version(0, 2000), UINT32_MAX);
}

// Rank 0's initial values arrive as the dtype's elements and are widened
// exactly; initialize_block() takes float32 values, kept unrounded, and
// emits them rounded.
TEST(AggChunkTableHalf, InitialValuesAreWidenedAndEmittedInTheDtype) {
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    const Placement p =
        Placement::compute(std::vector<TensorDecl>{{"w", 800, 0, d}, {"v", 900, 1, d}}, 1);
    Sink sink;
    ChunkTable table(p, test::config(2), make_bsp(), sink);
    std::vector<uint16_t> init(800);
    for (size_t i = 0; i < init.size(); ++i)
      init[i] = narrow(d, 0.001f * static_cast<float>(i) - 0.3f);
    const auto* bytes = reinterpret_cast<const std::byte*>(init.data());
    EXPECT_EQ(table.initialize(0, 0, bytes, 1408), Outcome::kInitialized);
    EXPECT_EQ(table.initialize(0, 1408, bytes + 1408, 192), Outcome::kInitialized);
    EXPECT_EQ(table.initialize(0, 0, bytes, 1408), Outcome::kDuplicate);
    ASSERT_EQ(sink.updates.size(), 2u);
    for (size_t i = 0; i < init.size(); ++i) {
      ASSERT_EQ(table.parameters(0)[i], widen(d, init[i])) << i;
    }
    // Emitted as received: widening then rounding gives the pattern back.
    EXPECT_EQ(sink.updates[0].u.dtype, d);
    EXPECT_EQ(sink.updates[0].u.bytes, 1408u);
    EXPECT_EQ(sink.updates[1].u.bytes, 192u);
    EXPECT_EQ(0, std::memcmp(sink.updates[0].bytes.data(), bytes, 1408));
    EXPECT_EQ(0, std::memcmp(sink.updates[1].bytes.data(), bytes + 1408, 192));

    std::vector<float> master(900);
    for (size_t i = 0; i < master.size(); ++i) master[i] = 1.0f + 1e-4f * static_cast<float>(i);
    table.initialize_block(1, master);
    ASSERT_EQ(sink.updates.size(), 4u);
    EXPECT_EQ(table.counters().count(Outcome::kInitialized), 4u);
    for (size_t i = 0; i < master.size(); ++i) ASSERT_EQ(table.parameters(1)[i], master[i]);
    for (size_t k = 2; k < 4; ++k) {
      const auto& s = sink.updates[k];
      const uint32_t first = s.u.offset / 2;
      ASSERT_EQ(s.bytes.size(), (k == 2 ? 704u : 196u) * 2);
      for (size_t i = 0; i < s.bytes.size() / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, s.bytes.data() + 2 * i, 2);
        ASSERT_EQ(h, narrow(d, master[first + i])) << i;
      }
    }
    // Every chunk's update stays where it was handed out, unchanged, until
    // the chunk's next one: the server sends it by reference, and again
    // after a loss.
    for (const auto& s : sink.updates) {
      EXPECT_EQ(0, std::memcmp(s.at, s.bytes.data(), s.bytes.size())) << s.u.offset;
    }
  }
}

// The contract: a bfloat16 (float16) table's parameters are, after every
// iteration, bit for bit those of a float32 table given the widened
// contributions, for every optimizer and both kernel sets, whatever the
// arrival order and whether a contribution was held or staged; and each of
// its updates is those parameters rounded once into the dtype.
TEST(AggChunkTableHalf, UpdatesAreTheFloat32UpdatesOfTheWidenedContributions) {
  constexpr uint32_t kWorkers = 4;
  constexpr uint32_t kIterations = 3;
  std::mt19937 rng(11);
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    for (const OptimizerKind kind : {OptimizerKind::kSumOnly, OptimizerKind::kSgd,
                                     OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
      for (const Simd simd : {Simd::kAuto, Simd::kPortable}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " " + std::string(optimizer_name(kind)) + " " +
                     std::string(simd_name(simd)));
        const std::vector<TensorDecl> decls{{"a", 3000, 0, d}, {"b", 701, 1, d}};
        std::vector<TensorDecl> f32_decls = decls;
        for (TensorDecl& t : f32_decls) t.dtype = Dtype::kFloat32;
        const Placement half = Placement::compute(decls, 1);
        const Placement f32 = Placement::compute(f32_decls, 1);
        ShardConfig config = test::config(kWorkers, kind);
        config.simd = simd;
        config.staging_chunks = kStagingMost;
        Sink half_sink, f32_sink;
        ChunkTable half_table(half, config, make_bsp(), half_sink);
        ChunkTable f32_table(f32, config, make_bsp(), f32_sink);
        for (uint32_t key = 0; key < 2; ++key) {
          std::vector<float> init(half.at(key).elements);
          for (float& v : init) v = std::normal_distribution<float>(0.0f, 0.1f)(rng);
          half_table.initialize_block(key, init);
          f32_table.initialize_block(key, init);
        }
        for (uint32_t it = 0; it < kIterations; ++it) {
          // Per rank and tensor, gradients of mixed magnitudes (subnormal
          // to large: the rounding and the order of the sum both show).
          std::vector<std::vector<std::vector<uint16_t>>> g(kWorkers);
          std::vector<std::vector<std::vector<float>>> wide(kWorkers);
          for (uint32_t r = 0; r < kWorkers; ++r) {
            for (uint32_t key = 0; key < 2; ++key) {
              g[r].emplace_back(half.at(key).elements);
              wide[r].emplace_back(half.at(key).elements);
              for (size_t i = 0; i < g[r][key].size(); ++i) {
                const float v = std::normal_distribution<float>(0.0f, 1.0f)(rng) *
                                std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
                g[r][key][i] = narrow(d, v);
                wide[r][key][i] = widen(d, g[r][key][i]);
              }
            }
          }
          // Every (block, chunk, rank), in a random order; the same order
          // (by element range) into the float32 table.
          struct Push {
            uint32_t key, first, elements;
            uint16_t rank;
            bool copy;
          };
          std::vector<Push> pushes;
          for (uint32_t key = 0; key < 2; ++key) {
            const uint32_t n = static_cast<uint32_t>(half.at(key).elements);
            for (uint32_t first = 0; first < n; first += kChunkBytes / 2) {
              for (uint16_t r = 0; r < kWorkers; ++r) {
                pushes.push_back(
                    {key, first, std::min(kChunkBytes / 2, n - first), r, rng() % 2 == 0});
              }
            }
          }
          std::shuffle(pushes.begin(), pushes.end(), rng);
          for (const Push& q : pushes) {
            const Outcome o = half_table.contribute(Contribution{
                .key = q.key,
                .offset = q.first * 2,
                .iteration = it,
                .rank = q.rank,
                .data = reinterpret_cast<const std::byte*>(g[q.rank][q.key].data() + q.first),
                .bytes = q.elements * 2,
                .token = &g[q.rank][q.key],
                .copy = q.copy});
            ASSERT_TRUE(taken(o)) << outcome_name(o);
            // The same elements as float32 chunks (two per half chunk).
            for (uint32_t e = q.first; e < q.first + q.elements; e += kChunkBytes / 4) {
              const uint32_t n = std::min(kChunkBytes / 4, q.first + q.elements - e);
              ASSERT_TRUE(taken(f32_table.contribute(Contribution{
                  .key = q.key,
                  .offset = e * 4,
                  .iteration = it,
                  .rank = q.rank,
                  .data = reinterpret_cast<const std::byte*>(wide[q.rank][q.key].data() + e),
                  .bytes = n * 4})));
            }
          }
          ASSERT_EQ(half_table.version(0, 0), it + 1);
          ASSERT_EQ(half_table.held(), 0u);
          ASSERT_EQ(half_table.staged(), 0u);
          for (uint32_t key = 0; key < 2; ++key) {
            const auto a = half_table.parameters(key);
            const auto b = f32_table.parameters(key);
            ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size_bytes()))
                << "key " << key << " iteration " << it;
          }
        }
        EXPECT_GT(half_table.counters().count(Outcome::kCopied), 0u);
        ASSERT_EQ(half_table.chunks(), 5u + 1u);  // 6000 and 1402 bytes
        EXPECT_EQ(half_table.counters().updates, uint64_t{kIterations} * 6);
        EXPECT_EQ(half_table.counters().gradient_bytes,
                  uint64_t{kIterations} * kWorkers * 3701 * 2);
        // Every update is the rounding of the parameters it was emitted from:
        // the last one of each chunk is the rounding of the final parameters.
        for (const auto& s : half_sink.updates) {
          EXPECT_EQ(s.u.dtype, d);
          EXPECT_EQ(s.u.bytes % 2, 0u);
        }
        for (size_t k = half_sink.updates.size() - 6; k < half_sink.updates.size(); ++k) {
          const auto& s = half_sink.updates[k];
          ASSERT_EQ(s.u.version, kIterations);
          const auto params = half_table.parameters(s.u.key);
          for (size_t i = 0; i < s.bytes.size() / 2; ++i) {
            uint16_t h;
            std::memcpy(&h, s.bytes.data() + 2 * i, 2);
            ASSERT_EQ(h, narrow(d, params[s.u.offset / 2 + i])) << "key " << s.u.key << " i " << i;
          }
        }
        // What a fan-out sends again, a block's wire bytes: every element its
        // final parameter rounded once; a float32 block's, its parameters.
        for (uint32_t key = 0; key < 2; ++key) {
          const auto wire = half_table.wire_values(key);
          const auto params = half_table.parameters(key);
          ASSERT_EQ(wire.size(), params.size() * 2);
          for (size_t i = 0; i < params.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, wire.data() + 2 * i, 2);
            ASSERT_EQ(h, narrow(d, params[i])) << "key " << key << " i " << i;
          }
          const auto f32_wire = f32_table.wire_values(key);
          const auto f32_params = f32_table.parameters(key);
          ASSERT_EQ(f32_wire.size(), f32_params.size_bytes());
          EXPECT_EQ(0, std::memcmp(f32_wire.data(), f32_params.data(), f32_wire.size()));
        }
        EXPECT_TRUE(half_table.wire_values(2).empty());  // no such block
      }
    }
  }
}

// A half-precision tensor's own update rule (the average, rank 0's push)
// and the optimizer's beside it are those of the float32 table given the
// widened contributions; a chunk restored from a checkpoint (float32
// values, as a job's state file holds them) is emitted rounded and goes on
// exactly as the table it was exported from.
TEST(AggChunkTableHalf, UpdateRulesAndARestoreAreTheFloat32Table) {
  constexpr uint32_t kWorkers = 3;
  std::mt19937 rng(5);
  for (const Dtype d : {Dtype::kBFloat16, Dtype::kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    const std::vector<TensorDecl> decls{{"w", 1000, 0, d},
                                        {"mean", 900, 1, d, UpdateRule::kAverage},
                                        {"var", 900, 2, d, UpdateRule::kRank0}};
    std::vector<TensorDecl> f32_decls = decls;
    for (TensorDecl& t : f32_decls) t.dtype = Dtype::kFloat32;
    const Placement half = Placement::compute(decls, 1);
    const Placement f32 = Placement::compute(f32_decls, 1);
    const ShardConfig config = test::config(kWorkers, OptimizerKind::kMomentum);
    Sink half_sink, f32_sink, restored_sink;
    ChunkTable half_table(half, config, make_bsp(), half_sink);
    ChunkTable f32_table(f32, config, make_bsp(), f32_sink);
    for (uint32_t key = 0; key < 3; ++key) {
      std::vector<float> init(half.at(key).elements);
      for (float& v : init) v = std::normal_distribution<float>(0.0f, 0.1f)(rng);
      half_table.initialize_block(key, init);
      f32_table.initialize_block(key, init);
    }
    // One iteration into both tables, ranks in reverse order; a table may
    // hold a contribution's buffer until its set completes, so every buffer
    // lives until the iteration ends.
    auto iterate = [&](ChunkTable& a, ChunkTable* b, uint32_t it) {
      std::vector<std::vector<uint16_t>> halves;
      std::vector<std::vector<float>> wides;
      halves.reserve(kWorkers * 3);
      wides.reserve(kWorkers * 3);
      for (uint32_t r = kWorkers; r-- > 0;) {
        for (uint32_t key = 0; key < 3; ++key) {
          const uint32_t n = static_cast<uint32_t>(half.at(key).elements);
          std::vector<uint16_t>& g = halves.emplace_back(n);
          std::vector<float>& wide = wides.emplace_back(n);
          for (uint32_t i = 0; i < n; ++i) {
            g[i] = narrow(d, std::normal_distribution<float>(0.0f, 1.0f)(rng));
            wide[i] = widen(d, g[i]);
          }
          for (uint32_t first = 0; first < n; first += kChunkBytes / 2) {
            const uint32_t m = std::min(kChunkBytes / 2, n - first);
            ASSERT_TRUE(taken(a.contribute(
                Contribution{.key = key,
                             .offset = first * 2,
                             .iteration = it,
                             .rank = static_cast<uint16_t>(r),
                             .data = reinterpret_cast<const std::byte*>(g.data() + first),
                             .bytes = m * 2})));
          }
          for (uint32_t e = 0; b != nullptr && e < n; e += kChunkBytes / 4) {
            const uint32_t m = std::min(kChunkBytes / 4, n - e);
            ASSERT_TRUE(taken(b->contribute(
                Contribution{.key = key,
                             .offset = e * 4,
                             .iteration = it,
                             .rank = static_cast<uint16_t>(r),
                             .data = reinterpret_cast<const std::byte*>(wide.data() + e),
                             .bytes = m * 4})));
          }
          if (r == 0 && key == 2 && b != nullptr) {  // rank 0's push, widened
            const auto v = a.parameters(2);
            for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(v[i], wide[i]) << i;
          }
        }
      }
    };
    iterate(half_table, &f32_table, 0);
    for (uint32_t key = 0; key < 3; ++key) {
      const auto a = half_table.parameters(key);
      const auto b = f32_table.parameters(key);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size_bytes())) << "key " << key;
    }
    // Every chunk of the half table into a new one, through a job's state
    // file (its records hold the float32 masters; each chunk's length is
    // checked against the placement's, in its dtype's elements), then the
    // same next iteration into both: the same parameters and the same
    // emitted bytes.
    ChunkTable restored(half, config, make_bsp(), restored_sink);
    std::vector<std::byte> pages;
    ASSERT_EQ(export_page(half_table, half.fingerprint(), 0, kStatePageBytes, pages),
              half_table.chunks());
    const std::vector<std::byte> file = join_state(pages, half.fingerprint());
    const StateFile f = check_state(file, half, kChunkBytes, OptimizerKind::kMomentum, false);
    EXPECT_EQ(f.version, 1u);
    ASSERT_EQ(f.chunks.size(), half_table.chunks());
    std::vector<RecordRef> records = {f.hyperparameters};
    records.insert(records.end(), f.chunks.begin(), f.chunks.end());
    ASSERT_EQ(restore_records(restored, half.fingerprint(), 1, records), "");
    ASSERT_EQ(restored_sink.updates.size(), half_table.chunks());
    for (size_t i = 0; i < restored_sink.updates.size(); ++i) {
      const auto& s = restored_sink.updates[i];
      EXPECT_EQ(s.u.version, 1u);
      EXPECT_EQ(s.u.dtype, d);
      const auto params = restored.parameters(s.u.key);
      for (size_t e = 0; e < s.bytes.size() / 2; ++e) {
        uint16_t h;
        std::memcpy(&h, s.bytes.data() + 2 * e, 2);
        ASSERT_EQ(h, narrow(d, params[s.u.offset / 2 + e])) << i;
      }
    }
    const std::mt19937 before = rng;
    iterate(half_table, nullptr, 1);
    rng = before;
    iterate(restored, nullptr, 1);
    for (uint32_t key = 0; key < 3; ++key) {
      const auto a = half_table.parameters(key);
      const auto b = restored.parameters(key);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size_bytes())) << "key " << key;
    }
  }
}

// ASP applies each contribution alone (quorum 1): the same holds.
TEST(AggChunkTableHalf, AsynchronousUpdatesAreExactToo) {
  const Dtype d = Dtype::kBFloat16;
  const Placement half = Placement::compute(std::vector<TensorDecl>{{"w", 1000, 0, d}}, 1);
  const Placement f32 = Placement::compute(std::vector<TensorDecl>{{"w", 1000, 0}}, 1);
  Sink half_sink, f32_sink;
  ChunkTable half_table(half, test::config(3, OptimizerKind::kMomentum), make_asp(), half_sink);
  ChunkTable f32_table(f32, test::config(3, OptimizerKind::kMomentum), make_asp(), f32_sink);
  std::mt19937 rng(5);
  std::vector<uint16_t> g(1000);
  std::vector<float> w(1000);
  // Every chunk of the tensor from `rank`, each applied on arrival.
  auto push = [](ChunkTable& table, const std::byte* data, uint32_t size, uint16_t rank,
                 uint32_t clock) {
    const uint32_t per_chunk = kChunkBytes / size;
    for (uint32_t first = 0; first < 1000; first += per_chunk) {
      const uint32_t offset = first * size;
      ASSERT_EQ(table.contribute(Contribution{.key = 0,
                                              .offset = offset,
                                              .iteration = table.version(0, offset),
                                              .rank = rank,
                                              .clock = clock,
                                              .data = data + offset,
                                              .bytes = std::min(per_chunk, 1000 - first) * size}),
                Outcome::kApplied);
    }
  };
  for (uint32_t step = 0; step < 6; ++step) {
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = narrow(d, std::normal_distribution<float>(0.0f, 1.0f)(rng));
      w[i] = widen(d, g[i]);
    }
    const auto rank = static_cast<uint16_t>(step % 3);
    push(half_table, reinterpret_cast<const std::byte*>(g.data()), 2, rank, step / 3);
    push(f32_table, reinterpret_cast<const std::byte*>(w.data()), 4, rank, step / 3);
    ASSERT_EQ(0, std::memcmp(half_table.parameters(0).data(), f32_table.parameters(0).data(), 4000))
        << "step " << step;
  }
}

}  // namespace
}  // namespace mercury::agg
