// The optimizer state as bytes: one chunk's parameters, optimizer state,
// version and step count, or one shard's hyperparameter table, in a
// versioned record that a checkpoint file is a sequence of.
//
// What it is for. Checkpoints of a job hold every shard's state (a resumed
// run must be the run that stopped), and a server that restarts reads its
// own back (docs/agg.md, "Optimizer state as bytes"). This file is the
// format and its codec: which records a file holds and where it is written
// is the caller's business.
//
// Format (version 1). Every field is little-endian, whatever the host;
// floats are IEEE-754 binary32. A record is a 64-byte header and a payload:
//
//   offset size  field
//    0     4     magic "MSTA"
//    4     1     format version (1)
//    5     1     record type: 1 chunk, 2 hyperparameters
//    6     1     optimizer: 0 sum-only, 1 sgd, 2 momentum, 3 adam
//    7     1     flags: bit 0 decoupled weight decay (AdamW); bit 1 (type 2)
//                the table applies from each chunk's next update; others 0
//    8     8     job fingerprint (the caller's; a record of another job is refused)
//   16     8     payload bytes
//   24     4     type 1: block key;             type 2: 0
//   28     4     type 1: byte offset in block;   type 2: 0
//   32     4     type 1: elements;               type 2: entries
//   36     4     type 1: version;                type 2: 0
//   40     8     type 1: optimizer steps (Adam's t of the last update); type 2: 0
//   48     4     state arrays per element (type 1: 0, 1 or 2); type 2: 0
//   52     4     payload CRC-32C
//   56     4     0 (reserved)
//   60     4     header CRC-32C (of bytes 0..59)
//
//   payload, type 1: parameters[elements], then the state arrays in order
//     (momentum: u; Adam: m, then v), each elements x float32
//   payload, type 2: entries x 28 bytes: from version (u32), learning_rate,
//     momentum, weight_decay, beta1, beta2, epsilon (float32 each)
//
// CRC-32C is the Castagnoli polynomial (0x1EDC6F41, reflected, initial and
// final XOR 0xFFFFFFFF: "123456789" gives 0xE3069283), as SSE4.2's crc32
// instruction computes it.
//
// Threads and costs. Pure functions over caller memory, any thread; the
// encoders and decoders touch each byte once (two passes with the CRC).
// Control path: encoders throw std::invalid_argument for inconsistent
// arguments; decoders never throw, they return a reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "agg/hyperparameters.h"
#include "agg/optimizer.h"

namespace mercury::agg {

inline constexpr uint32_t kStateHeaderBytes = 64;
inline constexpr uint8_t kStateFormatVersion = 1;
inline constexpr uint32_t kHyperparameterEntryBytes = 28;

enum class RecordType : uint8_t { kChunk = 1, kHyperparameters = 2 };

/// Why a record was refused.
enum class RecordReject : uint8_t {
  kNone,                ///< accepted
  kTruncated,           ///< shorter than its header or its payload says
  kBadMagic,            ///< not a Mercury state record
  kBadFormatVersion,    ///< written by another format version
  kBadHeaderChecksum,   ///< the header is corrupt
  kBadHeader,           ///< a field out of range (type, optimizer, flags, sizes)
  kBadPayloadChecksum,  ///< the payload is corrupt
  kWrongJob,            ///< the job fingerprint differs
  kWrongType,           ///< another record type than asked for
  kWrongOptimizer,      ///< another optimizer (kind or decay coupling) than the target's
  kWrongChunk,          ///< another key, offset or element count than the target's
  kBadValues,           ///< type 2: the entries cannot drive the optimizer
};
std::string_view record_reject_name(RecordReject reject);

/// A record's header, decoded.
struct RecordHeader {
  RecordType type = RecordType::kChunk;
  OptimizerKind kind = OptimizerKind::kSgd;
  bool decoupled_weight_decay = false;
  bool next_update = false;  ///< type 2: SettingsMode::kNextUpdate
  uint64_t job = 0;
  uint64_t payload_bytes = 0;
  uint32_t key = 0;
  uint32_t offset = 0;
  uint32_t count = 0;  ///< type 1: elements; type 2: entries
  uint32_t version = 0;
  uint64_t steps = 0;
  uint32_t state_arrays = 0;
  uint32_t payload_crc = 0;
  /// The whole record's length.
  [[nodiscard]] uint64_t record_bytes() const { return kStateHeaderBytes + payload_bytes; }
};

/// Which chunk a record holds and what its optimizer has done to it. The
/// arrays travel beside it: the parameters and the state arrays
/// (state_floats_per_element(kind) of them, each as long as the parameters;
/// the others empty).
struct ChunkState {
  uint32_t key = 0;
  uint32_t offset = 0;  ///< byte offset of the chunk in its block
  uint32_t version = 0;
  uint64_t steps = 0;
  OptimizerKind kind = OptimizerKind::kSgd;
  bool decoupled_weight_decay = false;
};

/// Bytes of a chunk record of `elements` elements for this optimizer.
uint64_t chunk_record_bytes(OptimizerKind kind, uint32_t elements);

/// Writes a chunk record at the start of `out`; returns its length. Throws
/// std::invalid_argument if `out` is too short or a span's length is not
/// what `state.kind` needs.
uint64_t encode_chunk_record(uint64_t job, const ChunkState& state, std::span<const float> params,
                             std::span<const float> state0, std::span<const float> state1,
                             std::span<std::byte> out);

/// Decodes and checks the header at the start of `in` (magic, format,
/// header CRC, field ranges, length against `in`). Does not read the payload.
RecordReject decode_record_header(std::span<const std::byte> in, RecordHeader& out);

/// Reads a chunk record into the caller's arrays after checking everything:
/// the header, the job, that it is `expect`'s chunk (key, offset, elements =
/// params.size()) and optimizer, and the payload's CRC. Nothing is written
/// unless it returns kNone; then `out` holds the header (version, steps).
RecordReject decode_chunk_record(uint64_t job, std::span<const std::byte> in,
                                 const ChunkState& expect, std::span<float> params,
                                 std::span<float> state0, std::span<float> state1,
                                 RecordHeader& out);

/// Bytes of the hyperparameter record of `table`.
uint64_t hyperparameter_record_bytes(const HyperparameterTable& table);
/// Writes `table` as a hyperparameter record; returns its length. Throws
/// std::invalid_argument if `out` is too short.
uint64_t encode_hyperparameter_record(uint64_t job, const HyperparameterTable& table,
                                      std::span<std::byte> out);
/// Checks a hyperparameter record against `table`'s optimizer and mode and
/// restores the table from it. Nothing changes unless it returns kNone.
RecordReject decode_hyperparameter_record(uint64_t job, std::span<const std::byte> in,
                                          HyperparameterTable& table);

/// CRC-32C of `bytes`, continuing from `crc` (0 to start). SSE4.2's
/// instruction where compiled in, else the portable table.
uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc = 0);
/// The same, always through the portable table (tests compare the two).
uint32_t crc32c_portable(std::span<const std::byte> bytes, uint32_t crc = 0);

}  // namespace mercury::agg
