#include "agg/optimizer_state.h"

#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace mercury::agg {

namespace {

constexpr std::array<std::byte, 4> kMagic = {std::byte{'M'}, std::byte{'S'}, std::byte{'T'},
                                             std::byte{'A'}};
constexpr uint8_t kFlagDecoupled = 1;
constexpr uint8_t kFlagNextUpdate = 2;

// Header field offsets (optimizer_state.h).
enum : uint32_t {
  kOffVersion = 4,
  kOffType = 5,
  kOffKind = 6,
  kOffFlags = 7,
  kOffJob = 8,
  kOffPayloadBytes = 16,
  kOffKey = 24,
  kOffOffset = 28,
  kOffCount = 32,
  kOffChunkVersion = 36,
  kOffSteps = 40,
  kOffStateArrays = 48,
  kOffPayloadCrc = 52,
  kOffReserved = 56,
  kOffHeaderCrc = 60,
};

template <class T>
void put(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

template <class T>
T get(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(std::to_integer<T>(p[i]) << (8 * i));
  return v;
}

void put_floats(std::byte* p, std::span<const float> v) {
  if constexpr (std::endian::native == std::endian::little) {
    if (!v.empty()) std::memcpy(p, v.data(), v.size_bytes());
  } else {
    for (size_t i = 0; i < v.size(); ++i) put(p + 4 * i, std::bit_cast<uint32_t>(v[i]));
  }
}

void get_floats(const std::byte* p, std::span<float> v) {
  if constexpr (std::endian::native == std::endian::little) {
    if (!v.empty()) std::memcpy(v.data(), p, v.size_bytes());
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::bit_cast<float>(get<uint32_t>(p + 4 * i));
  }
}

// The format's optimizer numbers are the format's, not the enum's.
constexpr uint8_t kind_code(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSumOnly:
      return 0;
    case OptimizerKind::kSgd:
      return 1;
    case OptimizerKind::kMomentum:
      return 2;
    case OptimizerKind::kAdam:
      return 3;
  }
  return 0xff;
}

bool kind_of(uint8_t code, OptimizerKind& kind) {
  constexpr OptimizerKind kKinds[] = {OptimizerKind::kSumOnly, OptimizerKind::kSgd,
                                      OptimizerKind::kMomentum, OptimizerKind::kAdam};
  if (code >= std::size(kKinds)) return false;
  kind = kKinds[code];
  return true;
}

// Fills the header common to both types, except the CRCs and type fields.
void put_header(std::byte* h, RecordType type, OptimizerKind kind, uint8_t flags, uint64_t job,
                uint64_t payload_bytes) {
  std::memset(h, 0, kStateHeaderBytes);
  std::memcpy(h, kMagic.data(), kMagic.size());
  h[kOffVersion] = std::byte{kStateFormatVersion};
  h[kOffType] = static_cast<std::byte>(type);
  h[kOffKind] = std::byte{kind_code(kind)};
  h[kOffFlags] = std::byte{flags};
  put(h + kOffJob, job);
  put(h + kOffPayloadBytes, payload_bytes);
}

// Seals a record whose header and payload are written: both CRCs.
void seal(std::byte* h, uint64_t payload_bytes) {
  put(h + kOffPayloadCrc, crc32c({h + kStateHeaderBytes, payload_bytes}));
  put(h + kOffHeaderCrc, crc32c({h, kOffHeaderCrc}));
}

void need_room(std::span<std::byte> out, uint64_t bytes, const char* what) {
  if (out.size() < bytes) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(out.size()) +
                                " bytes of room for a record of " + std::to_string(bytes));
  }
}

bool payload_intact(std::span<const std::byte> in, const RecordHeader& h) {
  return crc32c(in.subspan(kStateHeaderBytes, h.payload_bytes)) == h.payload_crc;
}

// The reflected Castagnoli table, built at compile time.
constexpr std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = crc_table();

}  // namespace

std::string_view record_reject_name(RecordReject reject) {
  switch (reject) {
    case RecordReject::kNone:
      return "none";
    case RecordReject::kTruncated:
      return "truncated";
    case RecordReject::kBadMagic:
      return "bad_magic";
    case RecordReject::kBadFormatVersion:
      return "bad_format_version";
    case RecordReject::kBadHeaderChecksum:
      return "bad_header_checksum";
    case RecordReject::kBadHeader:
      return "bad_header";
    case RecordReject::kBadPayloadChecksum:
      return "bad_payload_checksum";
    case RecordReject::kWrongJob:
      return "wrong_job";
    case RecordReject::kWrongType:
      return "wrong_type";
    case RecordReject::kWrongOptimizer:
      return "wrong_optimizer";
    case RecordReject::kWrongChunk:
      return "wrong_chunk";
    case RecordReject::kBadValues:
      return "bad_values";
  }
  return "?";
}

uint32_t crc32c_portable(std::span<const std::byte> bytes, uint32_t crc) {
  uint32_t c = ~crc;
  for (std::byte b : bytes) c = kCrcTable[(c ^ std::to_integer<uint32_t>(b)) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc) {
#if defined(__SSE4_2__)
  uint64_t c = ~crc;
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // the instruction takes the bytes in memory order (little-endian)
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, std::to_integer<uint8_t>(*p));
  return ~c32;
#else
  return crc32c_portable(bytes, crc);
#endif
}

uint64_t chunk_record_bytes(OptimizerKind kind, uint32_t elements) {
  return kStateHeaderBytes + uint64_t{1 + state_floats_per_element(kind)} * elements * 4;
}

uint64_t encode_chunk_record(uint64_t job, const ChunkState& s, std::span<const float> params,
                             std::span<const float> state0, std::span<const float> state1,
                             std::span<std::byte> out) {
  const uint32_t arrays = state_floats_per_element(s.kind);
  const size_t elements = params.size();
  if (elements > UINT32_MAX || state0.size() != (arrays >= 1 ? elements : 0) ||
      state1.size() != (arrays >= 2 ? elements : 0)) {
    throw std::invalid_argument("chunk record: " + std::string(optimizer_name(s.kind)) + " needs " +
                                std::to_string(arrays) + " state arrays as long as the " +
                                std::to_string(elements) + " parameters");
  }
  if (s.decoupled_weight_decay && s.kind != OptimizerKind::kAdam) {
    throw std::invalid_argument("chunk record: a decoupled weight decay needs optimizer adam");
  }
  const uint64_t bytes = chunk_record_bytes(s.kind, static_cast<uint32_t>(elements));
  need_room(out, bytes, "chunk record");
  std::byte* h = out.data();
  const uint64_t payload = bytes - kStateHeaderBytes;
  put_header(h, RecordType::kChunk, s.kind, s.decoupled_weight_decay ? kFlagDecoupled : 0, job,
             payload);
  put(h + kOffKey, s.key);
  put(h + kOffOffset, s.offset);
  put(h + kOffCount, static_cast<uint32_t>(elements));
  put(h + kOffChunkVersion, s.version);
  put(h + kOffSteps, s.steps);
  put(h + kOffStateArrays, arrays);
  std::byte* p = h + kStateHeaderBytes;
  put_floats(p, params);
  put_floats(p + 4 * elements, state0);
  put_floats(p + 8 * elements, state1);
  seal(h, payload);
  return bytes;
}

RecordReject decode_record_header(std::span<const std::byte> in, RecordHeader& out) {
  if (in.size() < kStateHeaderBytes) return RecordReject::kTruncated;
  const std::byte* h = in.data();
  if (std::memcmp(h, kMagic.data(), kMagic.size()) != 0) return RecordReject::kBadMagic;
  if (std::to_integer<uint8_t>(h[kOffVersion]) != kStateFormatVersion) {
    return RecordReject::kBadFormatVersion;
  }
  if (crc32c({h, kOffHeaderCrc}) != get<uint32_t>(h + kOffHeaderCrc)) {
    return RecordReject::kBadHeaderChecksum;
  }
  RecordHeader r;
  const auto type = std::to_integer<uint8_t>(h[kOffType]);
  const auto flags = std::to_integer<uint8_t>(h[kOffFlags]);
  if (type != 1 && type != 2) return RecordReject::kBadHeader;
  if (!kind_of(std::to_integer<uint8_t>(h[kOffKind]), r.kind)) return RecordReject::kBadHeader;
  r.type = static_cast<RecordType>(type);
  r.decoupled_weight_decay = (flags & kFlagDecoupled) != 0;
  r.next_update = (flags & kFlagNextUpdate) != 0;
  r.job = get<uint64_t>(h + kOffJob);
  r.payload_bytes = get<uint64_t>(h + kOffPayloadBytes);
  r.key = get<uint32_t>(h + kOffKey);
  r.offset = get<uint32_t>(h + kOffOffset);
  r.count = get<uint32_t>(h + kOffCount);
  r.version = get<uint32_t>(h + kOffChunkVersion);
  r.steps = get<uint64_t>(h + kOffSteps);
  r.state_arrays = get<uint32_t>(h + kOffStateArrays);
  r.payload_crc = get<uint32_t>(h + kOffPayloadCrc);
  if (get<uint32_t>(h + kOffReserved) != 0) return RecordReject::kBadHeader;
  if (r.decoupled_weight_decay && r.kind != OptimizerKind::kAdam) return RecordReject::kBadHeader;
  if (r.type == RecordType::kChunk) {
    if ((flags & ~kFlagDecoupled) != 0 || r.state_arrays != state_floats_per_element(r.kind) ||
        r.payload_bytes != chunk_record_bytes(r.kind, r.count) - kStateHeaderBytes) {
      return RecordReject::kBadHeader;
    }
  } else {
    if ((flags & ~(kFlagDecoupled | kFlagNextUpdate)) != 0 || r.key != 0 || r.offset != 0 ||
        r.version != 0 || r.steps != 0 || r.state_arrays != 0 || r.count == 0 ||
        r.count > HyperparameterTable::kCapacity ||
        r.payload_bytes != uint64_t{r.count} * kHyperparameterEntryBytes) {
      return RecordReject::kBadHeader;
    }
  }
  if (in.size() < r.record_bytes()) return RecordReject::kTruncated;
  out = r;
  return RecordReject::kNone;
}

RecordReject decode_chunk_record(uint64_t job, std::span<const std::byte> in,
                                 const ChunkState& expect, std::span<float> params,
                                 std::span<float> state0, std::span<float> state1,
                                 RecordHeader& out) {
  RecordHeader h;
  if (const RecordReject r = decode_record_header(in, h); r != RecordReject::kNone) return r;
  if (h.type != RecordType::kChunk) return RecordReject::kWrongType;
  if (h.job != job) return RecordReject::kWrongJob;
  if (h.kind != expect.kind || h.decoupled_weight_decay != expect.decoupled_weight_decay) {
    return RecordReject::kWrongOptimizer;
  }
  const size_t elements = h.count;
  if (h.key != expect.key || h.offset != expect.offset || params.size() != elements ||
      state0.size() != (h.state_arrays >= 1 ? elements : 0) ||
      state1.size() != (h.state_arrays >= 2 ? elements : 0)) {
    return RecordReject::kWrongChunk;
  }
  if (!payload_intact(in, h)) return RecordReject::kBadPayloadChecksum;
  const std::byte* p = in.data() + kStateHeaderBytes;
  get_floats(p, params);
  get_floats(p + 4 * elements, state0);
  get_floats(p + 8 * elements, state1);
  out = h;
  return RecordReject::kNone;
}

uint64_t hyperparameter_record_bytes(const HyperparameterTable& table) {
  return kStateHeaderBytes + table.entries().size() * kHyperparameterEntryBytes;
}

uint64_t encode_hyperparameter_record(uint64_t job, const HyperparameterTable& table,
                                      std::span<std::byte> out) {
  const uint64_t bytes = hyperparameter_record_bytes(table);
  need_room(out, bytes, "hyperparameter record");
  std::byte* h = out.data();
  const uint64_t payload = bytes - kStateHeaderBytes;
  const uint8_t flags = (table.decoupled_weight_decay() ? kFlagDecoupled : 0) |
                        (table.mode() == SettingsMode::kNextUpdate ? kFlagNextUpdate : 0);
  put_header(h, RecordType::kHyperparameters, table.kind(), flags, job, payload);
  put(h + kOffCount, static_cast<uint32_t>(table.entries().size()));
  std::byte* p = h + kStateHeaderBytes;
  for (const HyperparameterTable::Entry& e : table.entries()) {
    put(p, e.from);
    const Hyperparameters& v = e.values;
    const float values[] = {v.learning_rate, v.momentum, v.weight_decay,
                            v.beta1,         v.beta2,    v.epsilon};
    put_floats(p + 4, values);
    p += kHyperparameterEntryBytes;
  }
  seal(h, payload);
  return bytes;
}

RecordReject decode_hyperparameter_record(uint64_t job, std::span<const std::byte> in,
                                          HyperparameterTable& table) {
  RecordHeader h;
  if (const RecordReject r = decode_record_header(in, h); r != RecordReject::kNone) return r;
  if (h.type != RecordType::kHyperparameters) return RecordReject::kWrongType;
  if (h.job != job) return RecordReject::kWrongJob;
  if (h.kind != table.kind() || h.decoupled_weight_decay != table.decoupled_weight_decay() ||
      h.next_update != (table.mode() == SettingsMode::kNextUpdate)) {
    return RecordReject::kWrongOptimizer;
  }
  if (!payload_intact(in, h)) return RecordReject::kBadPayloadChecksum;
  std::array<HyperparameterTable::Entry, HyperparameterTable::kCapacity> entries;
  const std::byte* p = in.data() + kStateHeaderBytes;
  for (uint32_t i = 0; i < h.count; ++i, p += kHyperparameterEntryBytes) {
    std::array<float, 6> v;
    get_floats(p + 4, v);
    entries[i] = HyperparameterTable::Entry{.from = get<uint32_t>(p),
                                            .values = {.learning_rate = v[0],
                                                       .momentum = v[1],
                                                       .weight_decay = v[2],
                                                       .beta1 = v[3],
                                                       .beta2 = v[4],
                                                       .epsilon = v[5]}};
  }
  try {
    table.restore({entries.data(), h.count});
  } catch (const std::invalid_argument&) {
    return RecordReject::kBadValues;
  }
  return RecordReject::kNone;
}

}  // namespace mercury::agg
