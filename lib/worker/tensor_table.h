// TensorTable: the tensors a trainer declared, and where each one's bytes
// travel once the job's shard count and packet size are known.
//
// What it is for. The trainer declares every parameter tensor once
// (declare(name, params, priority) for float32, or with a dtype and a buffer
// of its elements for bfloat16 and float16); the worker then freezes the table with
// the job's global shard count and chunk size, which computes the same
// agg::Placement as every other node (blocks, keys, owning shards) and,
// per tensor, the geometry the net core works with: its blocks (key,
// element range, shard), the chunks of each block, and the scheduler
// level its packets travel at. After freeze() the table is immutable.
//
// Priorities and levels. A priority is any int >= 0, 0 the most urgent (the
// first layer of the forward pass); the default (-1) is the declaration
// index. The port scheduler has sched::kPriorityLevels (64) levels, so the D
// distinct priorities are ranked (rank 0 = the most urgent) and rank r goes
// to level floor(r x 64 / max(D, 64)): with D <= 64 each priority keeps its
// own level (level = rank); with more, consecutive ranks share a level in
// groups of D / 64 (ResNet-50's 161 tensors: 2 or 3 per level). The map is
// monotone (a more urgent tensor never gets a later level), the most urgent
// priority always gets level 0, and with D >= 64 the least urgent gets
// level 63. The level is what the placement and the wire carry as the
// tensor's priority.
//
// Element types. A tensor's dtype (float32, bfloat16 or float16) is what
// its buffer holds and what travels: its pushes, the updates written into
// its buffer and the placement are all in it (2-byte elements: half the
// bytes, twice the elements per chunk). Nothing converts on the worker; a
// push or pull whose buffer is of another dtype is refused.
//
// Misuse. Every misuse raises UsageError (a std::logic_error) whose message
// names the call, the tensor and what was wrong: a duplicate or empty name,
// an empty tensor, a dtype that is not a tensor dtype or a buffer that is not
// a whole number of its elements, a negative priority other than -1,
// declare() after freeze(), freeze() twice or with nothing declared, a bad
// shard count or chunk size, an unknown id or name, a push/pull buffer whose
// dtype or element count is not the tensor's, geometry asked for before
// freeze(), and any call after shutdown().
//
// Threads and costs. declare(), freeze() and shutdown() are control path:
// they allocate, take an internal mutex (so several threads may declare at
// once; the default priority is then the order in which the mutex was
// taken) and may throw. freeze() costs the placement's O(P log P) for P
// blocks plus O(T log T) for T tensors. After freeze() every reader
// (tensor(), find(), blocks(), check_push(), check_pull(), placement())
// is lock-free and may run on any number of threads at once: O(1), except
// find(), one hash lookup. Memory: the names, one TensorInfo per tensor, one
// BlockGeometry per block, one key entry per block, the
// placement.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agg/placement.h"
#include "mercury/worker_errors.h"
#include "wire/dtype.h"

namespace mercury::worker {

/// The index of a tensor in declaration order.
using TensorId = uint32_t;

/// One block of a tensor: the unit pushed and pulled as one message.
struct BlockGeometry {
  uint32_t key = 0;            ///< wire block_key
  uint32_t shard = 0;          ///< global shard id that owns it
  uint64_t first_element = 0;  ///< first element of the range within the tensor
  uint64_t elements = 0;
  uint32_t chunks = 0;       ///< packets of chunk_bytes (the last may be shorter)
  uint32_t first_chunk = 0;  ///< index of its first chunk among the tensor's chunks
  wire::Dtype dtype = wire::Dtype::kFloat32;  ///< the tensor's
  /// Offset of its first byte in the tensor's buffer.
  [[nodiscard]] uint64_t first_byte() const { return first_element * wire::element_bytes(dtype); }
  /// Its bytes on the wire and in the buffer: the message's length.
  [[nodiscard]] uint64_t bytes() const { return elements * wire::element_bytes(dtype); }
};

/// One declared tensor and, after freeze(), its geometry.
struct TensorInfo {
  std::string name;
  wire::Dtype dtype = wire::Dtype::kFloat32;
  /// The trainer's buffer, elements x wire::element_bytes(dtype) bytes:
  /// pulled parameters land here.
  std::span<std::byte> buffer;
  uint64_t elements = 0;
  /// The same buffer as float32 elements, for a float32 tensor; empty for
  /// the other dtypes.
  std::span<float> params;
  int priority = 0;  ///< as given (or the declaration index)
  /// How the servers make its versions (agg::UpdateRule: the job's optimizer,
  /// or the pushes' average or rank 0's push).
  agg::UpdateRule update = agg::UpdateRule::kOptimizer;
  // ---- set by freeze() ----
  uint8_t level = 0;       ///< scheduler level, < sched::kPriorityLevels
  uint32_t first_key = 0;  ///< keys first_key .. first_key + blocks - 1
  uint32_t blocks = 0;
  uint32_t chunks = 0;                ///< over all its blocks
  uint32_t first_block_geometry = 0;  ///< index into TensorTable's block list
};

class TensorTable {
 public:
  TensorTable() = default;
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  /// Declares a float32 tensor; `params` must stay valid for the table's
  /// lifetime (received parameters are written there). `priority` >= 0, 0 =
  /// most urgent, or -1 = the declaration index. Returns its id (declaration
  /// index). Throws UsageError (see the file comment).
  TensorId declare(std::string_view name, std::span<float> params, int priority = -1,
                   agg::UpdateRule update = agg::UpdateRule::kOptimizer);
  /// Declares a tensor of `dtype` (float32, bfloat16 or float16) whose
  /// elements are the bytes of `buffer` (little-endian, a whole number of
  /// wire::element_bytes(dtype)); otherwise as above.
  TensorId declare(std::string_view name, wire::Dtype dtype, std::span<std::byte> buffer,
                   int priority = -1, agg::UpdateRule update = agg::UpdateRule::kOptimizer);

  /// Computes the placement on `shards` global shards with chunks of
  /// `chunk_bytes` (net::payload_per_packet(mtu); a multiple of 4 in
  /// [4, 65532]) and every tensor's geometry and level. Throws UsageError.
  void freeze(uint32_t shards, uint32_t chunk_bytes, const agg::PlacementOptions& options = {});

  /// After this every call throws UsageError ("... after shutdown").
  void shutdown();

  [[nodiscard]] bool frozen() const { return frozen_.load(std::memory_order_acquire); }
  [[nodiscard]] bool is_shut_down() const { return shut_down_.load(std::memory_order_acquire); }
  /// Tensors declared so far.
  [[nodiscard]] uint32_t size() const;
  /// The dtype tensor `id` was declared with, before or after freeze() (it
  /// takes the mutex until then). Throws UsageError for an unknown id.
  [[nodiscard]] wire::Dtype dtype(TensorId id) const;

  // ---- after freeze(): lock-free, any thread ----

  [[nodiscard]] const TensorInfo& tensor(TensorId id) const;
  /// The id of the tensor declared as `name`.
  [[nodiscard]] TensorId find(std::string_view name) const;
  /// The tensor's blocks in key order.
  [[nodiscard]] std::span<const BlockGeometry> blocks(TensorId id) const;
  /// Throws UsageError unless the tensor is float32 and `grad` has its
  /// element count.
  void check_push(TensorId id, std::span<const float> grad) const;
  /// Throws UsageError unless the tensor is float32 and `out` has its
  /// element count.
  void check_pull(TensorId id, std::span<const float> out) const;
  /// The same for a buffer of `elements` elements of `dtype`: throws
  /// UsageError unless both are the tensor's.
  void check_push(TensorId id, wire::Dtype dtype, uint64_t elements) const;
  void check_pull(TensorId id, wire::Dtype dtype, uint64_t elements) const;
  [[nodiscard]] const agg::Placement& placement() const;
  /// The placement's fingerprint: the worker compares it with the server's.
  [[nodiscard]] uint64_t fingerprint() const { return placement().fingerprint(); }
  /// The declarations as the placement saw them (priority = level, the
  /// dtype): what a worker tells the server so that both compute the same
  /// placement.
  [[nodiscard]] const std::vector<agg::TensorDecl>& declarations() const;
  [[nodiscard]] uint32_t chunk_bytes() const;
  [[nodiscard]] uint32_t shards() const;
  [[nodiscard]] uint32_t tensors() const;
  /// The tensor owning block `key`, or nullopt for an unknown key.
  [[nodiscard]] std::optional<TensorId> tensor_of_key(uint32_t key) const;

  /// The level rule (file comment): one level per entry of `priorities`
  /// (each >= 0), in the same order. Pure.
  static std::vector<uint8_t> levels_for(std::span<const int> priorities);

 private:
  void check_live(std::string_view call) const;
  void check_frozen(std::string_view call) const;
  const TensorInfo& checked(TensorId id, std::string_view call) const;
  void check_buffer(TensorId id, wire::Dtype dtype, uint64_t elements, std::string_view call) const;

  mutable std::mutex mutex_;  // declare/freeze/shutdown against each other
  std::atomic<bool> frozen_{false};
  std::atomic<bool> shut_down_{false};
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, TensorId> by_name_;
  std::vector<BlockGeometry> geometry_;
  std::vector<agg::TensorDecl> decls_;
  std::optional<agg::Placement> placement_;
  uint32_t chunk_bytes_ = 0;
  uint32_t shards_ = 0;
};

}  // namespace mercury::worker
