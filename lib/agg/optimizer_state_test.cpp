#include "agg/optimizer_state.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace mercury::agg {
namespace {

constexpr uint64_t kJob = 0x0123456789abcdefull;

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(AggOptimizerState, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c({}), 0u);
  std::mt19937 rng(3);
  std::vector<std::byte> data(4099);
  for (std::byte& b : data) b = static_cast<std::byte>(rng());
  for (size_t len : {1u, 7u, 8u, 9u, 63u, 64u, 4099u}) {
    const std::span<const std::byte> d(data.data() + 1, len - 1);  // unaligned too
    EXPECT_EQ(crc32c(d), crc32c_portable(d)) << len;
    // Continuing from a prefix's CRC is the CRC of the whole.
    EXPECT_EQ(crc32c(d.subspan(d.size() / 2), crc32c(d.first(d.size() / 2))), crc32c(d)) << len;
  }
}

// The layout of optimizer_state.h, byte by byte: a change to it must change
// this test (and the format version).
TEST(AggOptimizerState, AChunkRecordIsTheDocumentedBytes) {
  const std::vector<float> params = {1.0f, -2.0f}, u = {0.5f, 0.25f};
  std::vector<std::byte> out(chunk_record_bytes(OptimizerKind::kMomentum, 2));
  ASSERT_EQ(out.size(), 64u + 16u);
  const ChunkState s{.key = 0x0a0b0c0d,
                     .offset = 2816,
                     .version = 77,
                     .steps = 0x100000002ull,
                     .kind = OptimizerKind::kMomentum};
  ASSERT_EQ(encode_chunk_record(kJob, s, params, u, {}, out), out.size());
  auto u8 = [&](size_t i) { return std::to_integer<unsigned>(out[i]); };
  auto le32 = [&](size_t i) { return u8(i) | u8(i + 1) << 8 | u8(i + 2) << 16 | u8(i + 3) << 24; };
  auto le64 = [&](size_t i) { return uint64_t{le32(i)} | uint64_t{le32(i + 4)} << 32; };
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), 4), "MSTA");
  EXPECT_EQ(u8(4), 1u);  // format version
  EXPECT_EQ(u8(5), 1u);  // chunk
  EXPECT_EQ(u8(6), 2u);  // momentum
  EXPECT_EQ(u8(7), 0u);  // flags
  EXPECT_EQ(le64(8), kJob);
  EXPECT_EQ(u8(8), 0xefu);  // little-endian: the low byte first
  EXPECT_EQ(le64(16), 16u);
  EXPECT_EQ(le32(24), 0x0a0b0c0du);
  EXPECT_EQ(le32(28), 2816u);
  EXPECT_EQ(le32(32), 2u);
  EXPECT_EQ(le32(36), 77u);
  EXPECT_EQ(le64(40), 0x100000002ull);
  EXPECT_EQ(le32(48), 1u);
  EXPECT_EQ(le32(52), crc32c({out.data() + 64, 16}));
  EXPECT_EQ(le32(56), 0u);
  EXPECT_EQ(le32(60), crc32c({out.data(), 60}));
  const float payload[] = {1.0f, -2.0f, 0.5f, 0.25f};
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(le32(64 + 4 * i), std::bit_cast<uint32_t>(payload[i]));
}

struct Arrays {
  std::vector<float> p, s0, s1;
  Arrays(OptimizerKind kind, size_t n, float seed) : p(n) {
    const uint32_t k = state_floats_per_element(kind);
    if (k >= 1) s0.resize(n);
    if (k >= 2) s1.resize(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = seed + static_cast<float>(i);
      if (k >= 1) s0[i] = -seed * static_cast<float>(i);
      if (k >= 2) s1[i] = seed / static_cast<float>(i + 1);
    }
  }
  bool operator==(const Arrays&) const = default;
};

TEST(AggOptimizerState, ChunkRecordsRoundTripForEveryOptimizer) {
  for (OptimizerKind kind : {OptimizerKind::kSumOnly, OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdam}) {
    for (bool decoupled : {false, kind == OptimizerKind::kAdam}) {
      SCOPED_TRACE(std::string(optimizer_name(kind)) + (decoupled ? "W" : ""));
      const Arrays a(kind, 352, 1.5f);
      const ChunkState s{.key = 9,
                         .offset = 1408,
                         .version = 12,
                         .steps = 11,
                         .kind = kind,
                         .decoupled_weight_decay = decoupled};
      std::vector<std::byte> out(chunk_record_bytes(kind, 352) + 10);
      const uint64_t n = encode_chunk_record(kJob, s, a.p, a.s0, a.s1, out);
      ASSERT_EQ(n, chunk_record_bytes(kind, 352));
      Arrays b(kind, 352, 0.0f);
      RecordHeader h;
      ASSERT_EQ(decode_chunk_record(kJob, {out.data(), n}, s, b.p, b.s0, b.s1, h),
                RecordReject::kNone);
      EXPECT_TRUE(a == b);
      EXPECT_EQ(h.version, 12u);
      EXPECT_EQ(h.steps, 11u);
      EXPECT_EQ(h.record_bytes(), n);
    }
  }
}

TEST(AggOptimizerState, EncodingRefusesInconsistentArguments) {
  const Arrays a(OptimizerKind::kAdam, 8, 1.0f);
  std::vector<std::byte> out(chunk_record_bytes(OptimizerKind::kAdam, 8));
  ChunkState s{.kind = OptimizerKind::kAdam};
  EXPECT_THROW(encode_chunk_record(kJob, s, a.p, a.s0, {}, out), std::invalid_argument);
  EXPECT_THROW(encode_chunk_record(kJob, s, a.p, a.s0, a.s1, {out.data(), out.size() - 1}),
               std::invalid_argument);
  s.kind = OptimizerKind::kSgd;
  s.decoupled_weight_decay = true;
  EXPECT_THROW(encode_chunk_record(kJob, s, a.p, {}, {}, out), std::invalid_argument);
}

// Every way a record can be wrong is refused with its reason, and nothing is
// written into the target.
TEST(AggOptimizerState, BadRecordsAreRefusedWithTheirReason) {
  const OptimizerKind kind = OptimizerKind::kAdam;
  const Arrays a(kind, 16, 2.0f);
  const ChunkState s{.key = 3, .offset = 64, .version = 5, .steps = 5, .kind = kind};
  std::vector<std::byte> good(chunk_record_bytes(kind, 16));
  encode_chunk_record(kJob, s, a.p, a.s0, a.s1, good);
  const Arrays untouched(kind, 16, -7.0f);

  auto read = [&](std::span<const std::byte> in, std::optional<ChunkState> expect = std::nullopt,
                  uint64_t job = kJob) {
    const ChunkState& e = expect ? *expect : s;
    Arrays b = untouched;
    RecordHeader h;
    const RecordReject r = decode_chunk_record(job, in, e, b.p, b.s0, b.s1, h);
    if (r != RecordReject::kNone) {
      EXPECT_TRUE(b == untouched) << record_reject_name(r);
    }
    return r;
  };
  // A header field changed and the header CRC made good again: past the checksum.
  auto with = [&](size_t at, std::byte v) {
    std::vector<std::byte> r = good;
    r[at] = v;
    const uint32_t crc = crc32c({r.data(), 60});
    for (int i = 0; i < 4; ++i) r[60 + i] = static_cast<std::byte>(crc >> (8 * i));
    return r;
  };
  auto flipped = [&](size_t at) {
    std::vector<std::byte> r = good;
    r[at] ^= std::byte{0x10};
    return r;
  };

  EXPECT_EQ(read(good), RecordReject::kNone);
  EXPECT_EQ(read({good.data(), 63}), RecordReject::kTruncated);
  EXPECT_EQ(read({good.data(), good.size() - 1}), RecordReject::kTruncated);
  EXPECT_EQ(read(flipped(0)), RecordReject::kBadMagic);
  EXPECT_EQ(read(with(4, std::byte{2})), RecordReject::kBadFormatVersion);
  EXPECT_EQ(read(flipped(24)), RecordReject::kBadHeaderChecksum);
  EXPECT_EQ(read(flipped(100)), RecordReject::kBadPayloadChecksum);
  EXPECT_EQ(read(with(5, std::byte{3})), RecordReject::kBadHeader);    // no such type
  EXPECT_EQ(read(with(6, std::byte{9})), RecordReject::kBadHeader);    // no such optimizer
  EXPECT_EQ(read(with(7, std::byte{4})), RecordReject::kBadHeader);    // unknown flag
  EXPECT_EQ(read(with(48, std::byte{1})), RecordReject::kBadHeader);   // state arrays
  EXPECT_EQ(read(with(32, std::byte{17})), RecordReject::kBadHeader);  // length disagrees
  EXPECT_EQ(read(with(56, std::byte{1})), RecordReject::kBadHeader);   // reserved
  EXPECT_EQ(read(good, s, kJob + 1), RecordReject::kWrongJob);
  EXPECT_EQ(read(with(6, std::byte{2})), RecordReject::kBadHeader);  // momentum's length differs
  ChunkState other = s;
  other.key = 4;
  EXPECT_EQ(read(good, other), RecordReject::kWrongChunk);
  other = s;
  other.offset = 0;
  EXPECT_EQ(read(good, other), RecordReject::kWrongChunk);
  other = s;
  other.decoupled_weight_decay = true;
  EXPECT_EQ(read(good, other), RecordReject::kWrongOptimizer);
  Arrays shorter(kind, 15, 0.0f);
  RecordHeader h;
  EXPECT_EQ(decode_chunk_record(kJob, good, s, shorter.p, shorter.s0, shorter.s1, h),
            RecordReject::kWrongChunk);
  // A hyperparameter record is not a chunk record.
  HyperparameterTable t(kind, false, {}, SettingsMode::kFromVersion);
  std::vector<std::byte> hyper(hyperparameter_record_bytes(t));
  encode_hyperparameter_record(kJob, t, hyper);
  EXPECT_EQ(read(hyper), RecordReject::kWrongType);
  HyperparameterTable into(kind, false, {}, SettingsMode::kFromVersion);
  EXPECT_EQ(decode_hyperparameter_record(kJob, good, into), RecordReject::kWrongType);
}

TEST(AggOptimizerState, HyperparameterRecordsRoundTripAndAreChecked) {
  HyperparameterTable t(OptimizerKind::kAdam, true, {.learning_rate = 0.5f, .weight_decay = 0.1f},
                        SettingsMode::kFromVersion);
  ASSERT_EQ(t.change(4, {.learning_rate = 0.25f, .beta2 = 0.99f}, 0, 0), Change::kAdded);
  ASSERT_EQ(t.change(9, {.learning_rate = 0.125f, .epsilon = 1e-6f}, 0, 0), Change::kAdded);
  std::vector<std::byte> out(hyperparameter_record_bytes(t));
  ASSERT_EQ(out.size(), 64u + 3 * 28u);
  ASSERT_EQ(encode_hyperparameter_record(kJob, t, out), out.size());

  HyperparameterTable back(OptimizerKind::kAdam, true, {}, SettingsMode::kFromVersion);
  ASSERT_EQ(decode_hyperparameter_record(kJob, out, back), RecordReject::kNone);
  EXPECT_TRUE(std::equal(t.entries().begin(), t.entries().end(), back.entries().begin(),
                         back.entries().end()));
  EXPECT_EQ(back.at(10).epsilon, 1e-6f);

  HyperparameterTable adam(OptimizerKind::kAdam, false, {}, SettingsMode::kFromVersion);
  EXPECT_EQ(decode_hyperparameter_record(kJob, out, adam), RecordReject::kWrongOptimizer);
  HyperparameterTable async(OptimizerKind::kAdam, true, {}, SettingsMode::kNextUpdate);
  EXPECT_EQ(decode_hyperparameter_record(kJob, out, async), RecordReject::kWrongOptimizer);
  EXPECT_EQ(decode_hyperparameter_record(kJob + 1, out, back), RecordReject::kWrongJob);

  // A negative learning rate, sealed with good CRCs: refused as values, nothing restored.
  std::vector<std::byte> bad = out;
  const float minus = -1.0f;
  std::memcpy(bad.data() + 64 + 28 + 4, &minus, 4);  // little-endian host
  const uint32_t pcrc = crc32c({bad.data() + 64, bad.size() - 64});
  for (int i = 0; i < 4; ++i) bad[52 + i] = static_cast<std::byte>(pcrc >> (8 * i));
  const uint32_t hcrc = crc32c({bad.data(), 60});
  for (int i = 0; i < 4; ++i) bad[60 + i] = static_cast<std::byte>(hcrc >> (8 * i));
  HyperparameterTable kept(OptimizerKind::kAdam, true, {}, SettingsMode::kFromVersion);
  EXPECT_EQ(decode_hyperparameter_record(kJob, bad, kept), RecordReject::kBadValues);
  EXPECT_EQ(kept.entries().size(), 1u);
}

// Stop a run, write every chunk and the settings out, read them into new
// memory and go on: the result is the uninterrupted run's, bit for bit.
TEST(AggOptimizerState, AResumedRunIsTheUninterruptedOne) {
  constexpr uint32_t kWorkers = 3, kChunk = 100, kChunks = 3, kSteps = 8, kStop = 4;
  constexpr uint32_t kElems = kChunk * kChunks - 17;  // the last chunk is short
  const OptimizerConfig config{.kind = OptimizerKind::kAdam,
                               .learning_rate = 0.01f,
                               .weight_decay = 0.05f,
                               .decoupled_weight_decay = true};
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<std::vector<float>> grads(kSteps * kWorkers, std::vector<float>(kElems));
  for (auto& g : grads) {
    for (float& f : g) f = d(rng);
  }
  struct Run {
    ShardOptimizer opt;
    std::vector<float> p, m, v;
    uint32_t version = 0;
  };
  auto fresh = [&] {
    Run r{ShardOptimizer(config, SettingsMode::kFromVersion), std::vector<float>(kElems, 0.5f),
          std::vector<float>(kElems), std::vector<float>(kElems)};
    return r;
  };
  auto step = [&](Run& r) {
    // A warm-up then a decay, set from each version as a trainer would.
    const float lr = r.version < 3 ? 0.01f * static_cast<float>(r.version + 1) / 3.0f
                                   : 0.01f / static_cast<float>(r.version);
    ASSERT_TRUE(accepted(r.opt.hyperparameters().change(
        r.version, {.learning_rate = lr, .weight_decay = 0.05f}, r.version, r.version)));
    for (uint32_t c = 0; c < kChunks; ++c) {
      const uint32_t first = c * kChunk, n = std::min(kChunk, kElems - first);
      const std::byte* src[kWorkers];
      for (uint32_t w = 0; w < kWorkers; ++w) {
        src[w] = reinterpret_cast<const std::byte*>(grads[r.version * kWorkers + w].data() + first);
      }
      reduce_apply(OptimizerKind::kAdam, Simd::kAuto, src, kWorkers, n, r.p.data() + first,
                   r.m.data() + first, r.v.data() + first,
                   r.opt.step_for(r.version, kWorkers, r.version + 1, 1.0f));
    }
    ++r.version;
  };
  Run straight = fresh();
  for (uint32_t i = 0; i < kSteps; ++i) step(straight);

  Run first = fresh();
  for (uint32_t i = 0; i < kStop; ++i) step(first);
  std::vector<std::byte> file;  // the settings, then each chunk
  auto append = [&](uint64_t bytes) {
    file.resize(file.size() + bytes);
    return std::span<std::byte>(file.data() + file.size() - bytes, bytes);
  };
  encode_hyperparameter_record(kJob, first.opt.hyperparameters(),
                               append(hyperparameter_record_bytes(first.opt.hyperparameters())));
  for (uint32_t c = 0; c < kChunks; ++c) {
    const uint32_t e = c * kChunk, n = std::min(kChunk, kElems - e);
    const ChunkState s{.key = 0,
                       .offset = e * 4,
                       .version = first.version,
                       .steps = first.version,
                       .kind = OptimizerKind::kAdam,
                       .decoupled_weight_decay = true};
    encode_chunk_record(kJob, s, {first.p.data() + e, n}, {first.m.data() + e, n},
                        {first.v.data() + e, n}, append(chunk_record_bytes(s.kind, n)));
  }

  Run resumed = fresh();
  std::span<const std::byte> in(file);
  ASSERT_EQ(decode_hyperparameter_record(kJob, in, resumed.opt.hyperparameters()),
            RecordReject::kNone);
  in = in.subspan(hyperparameter_record_bytes(first.opt.hyperparameters()));
  for (uint32_t c = 0; c < kChunks; ++c) {
    const uint32_t e = c * kChunk, n = std::min(kChunk, kElems - e);
    const ChunkState expect{
        .key = 0, .offset = e * 4, .kind = OptimizerKind::kAdam, .decoupled_weight_decay = true};
    RecordHeader h;
    ASSERT_EQ(decode_chunk_record(kJob, in, expect, {resumed.p.data() + e, n},
                                  {resumed.m.data() + e, n}, {resumed.v.data() + e, n}, h),
              RecordReject::kNone);
    resumed.version = h.version;
    EXPECT_EQ(h.steps, kStop);
    in = in.subspan(h.record_bytes());
  }
  EXPECT_TRUE(in.empty());
  for (uint32_t i = kStop; i < kSteps; ++i) step(resumed);
  EXPECT_EQ(resumed.p, straight.p);
  EXPECT_EQ(resumed.m, straight.m);
  EXPECT_EQ(resumed.v, straight.v);
  EXPECT_NE(resumed.p, fresh().p);  // it trained
}

}  // namespace
}  // namespace mercury::agg
