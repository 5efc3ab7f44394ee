// PullTracker and PushTracker: the net core's bookkeeping, per tensor, of the
// aggregated chunks arriving (which versions are in) and of the pushes in
// flight (whose Handles they complete).
//
// What it is for. The server sends each aggregated chunk on its own, as soon
// as it is updated (docs/agg.md): one packet = one chunk, named on the wire by
// (block_key, offset) and stamped with the chunk's new version. The worker's
// net core hands every such packet to PullTracker::deliver_st(), which
//  * checks it against the geometry (unknown key, offset not on a chunk
//    boundary inside the block, wrong length: each counted, dropped);
//  * checks its version against the tensor's window of outstanding versions
//    [awaited, awaited + window): older is stale, newer than the window is
//    too new (both counted, dropped, the buffer untouched);
//  * records it in the bitmap of its (tensor, version) exactly once (a
//    duplicate is counted and dropped);
//  * copies the payload straight into the trainer's buffer (the one given
//    to TensorTable::declare; elements of the tensor's dtype, as they
//    arrive: a chunk of a bfloat16 tensor is chunk_bytes / 2 elements from
//    byte offset 2 x its first element) unless a newer version of the same
//    chunk is already there;
//  * and when every chunk of every block of the tensor at the awaited
//    version is in, moves the window on: awaited_st() then says the version
//    is complete, which is how the net core completes pulls (net_core.h).
// Chunks may arrive before anyone pulls (the server fans every update out to
// every worker): they are recorded all the same. Versions start at
// PullTrackerConfig::first_version (0: rank 0's initial parameters).
//
// The asynchronous modes (PullTrackerConfig::async: ASP, SSP, PS+) have no
// version common to a tensor's chunks: each chunk moves on whenever some
// worker's gradient is applied to it. deliver_async_st() then keeps, per
// chunk, the newest version placed (an older one arriving later is outrun,
// never copied over it) and the newest slowest clock heard, and per tensor
// how many packets answered this worker's own pushes (wire::kAggYours: the
// server sends exactly one per chunk per push it applied) and the least
// version and slowest clock over its chunks (kept incrementally: a rescan
// of the tensor's chunks only when the least one moves). awaited_st() is 1
// once every chunk of the tensor has arrived at least once, so the start-up
// (version 0 of every tensor) reads the same in every mode.
//
// PushTracker counts the blocks of a push that the transport has
// settled (each block is one message) and completes the push Handle when
// the last one is, successfully or with the first failure's text.
//
// Threads. Both trackers belong to the net core (asserted: base/owner.h): every *_st method must be
// called from that one thread; they copy what they need from the table at
// construction and never call into it afterwards (trainer threads reach the
// net core through its request queue, carrying the Handle they already
// returned to the trainer). The table must be frozen, must outlive the
// trackers, and the trainer's buffers must stay valid while a chunk can land
// in them.
//
// Costs. Construction (control path) allocates everything and may throw.
// After that no method allocates, locks, logs or throws: deliver_st() is a
// few array lookups, one bit test and set, a memcpy of the payload, the
// window - 1 bit tests of the newer versions, and, when it completes a
// version, a store fence and clearing that version's bitmap (chunks / 64
// words). Memory, bounded by the table and the configuration, never by
// traffic: window x ceil(chunks / 64) x 8 B of bitmaps per tensor, window x
// 4 B of counts + 32 B per tensor, 24 B per block. ResNet-50 at MTU 1500
// with window 2: about 20 KB of bitmaps.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/owner.h"
#include "worker/handle.h"
#include "worker/tensor_table.h"

namespace mercury::worker {

/// What deliver_st() did with a chunk. From kDuplicate on, nothing was
/// recorded and the trainer's buffer was not touched.
enum class ChunkVerdict : uint8_t {
  kPlaced,      ///< recorded and copied into the trainer's buffer
  kOutrun,      ///< recorded; not copied, a newer version of the chunk is already there
  kDuplicate,   ///< this chunk of this version was already recorded
  kStale,       ///< its version is older than the one awaited (already complete)
  kTooNew,      ///< its version is past the window of outstanding versions
  kUnknownKey,  ///< no such block
  kBadOffset,   ///< offset not a chunk boundary inside the block
  kBadLength,   ///< payload length is not the chunk's length
};
inline constexpr size_t kChunkVerdictCount = static_cast<size_t>(ChunkVerdict::kBadLength) + 1;
std::string_view chunk_verdict_name(ChunkVerdict v);

struct PullTrackerConfig {
  /// Versions of one tensor that can be received at once, 1..64. BSP needs
  /// 1 (a worker cannot receive version v + 1 before it has pushed the
  /// gradient computed from version v); 2 leaves room for one more.
  uint32_t window = 2;
  /// The first version awaited: 0, rank 0's initial parameters.
  uint32_t first_version = 0;
  /// The asynchronous modes' bookkeeping (see the file comment) instead of
  /// the version window: deliver_async_st() instead of deliver_st().
  bool async = false;
};

struct PullCounters {
  std::array<uint64_t, kChunkVerdictCount> verdicts{};  ///< per ChunkVerdict, by deliver_st()
  /// Bad chunks reported by destination_st(), by verdict (only the three geometry ones).
  std::array<uint64_t, kChunkVerdictCount> destination_refused{};
  uint64_t versions_completed = 0;  ///< (tensor, version) pairs fully received
  uint64_t bytes_placed = 0;
  [[nodiscard]] uint64_t count(ChunkVerdict v) const { return verdicts[static_cast<size_t>(v)]; }
};

class PullTracker {
 public:
  /// `table` must be frozen. Throws UsageError (not frozen, bad window).
  explicit PullTracker(const TensorTable& table, const PullTrackerConfig& config = {});
  PullTracker(const PullTracker&) = delete;
  PullTracker& operator=(const PullTracker&) = delete;

  /// The bytes of the trainer's buffer where the chunk (key, offset) of
  /// `bytes` bytes goes, or an empty span for a bad chunk (unknown key,
  /// offset not on a chunk boundary, wrong length; counted in
  /// counters().destination_refused). Geometry only: it knows nothing of
  /// versions, so a caller that copies there itself could overwrite newer
  /// parameters with a stale chunk; the net core should use deliver_st().
  std::span<std::byte> destination_st(uint32_t key, uint32_t offset, uint32_t bytes);

  /// The receive path for one aggregated chunk: see the file comment.
  ChunkVerdict deliver_st(uint32_t key, uint32_t offset, uint32_t version,
                          std::span<const std::byte> payload);

  /// The asynchronous receive path for one chunk: `tag` is the packet's
  /// wire iteration (wire::kAggYours | slowest clock). See the file comment.
  ChunkVerdict deliver_async_st(uint32_t key, uint32_t offset, uint32_t version, uint32_t tag,
                                std::span<const std::byte> payload);
  /// Asynchronous: packets that answered this worker's pushes of `tensor`
  /// (chunks x pushes applied), the least version over its chunks (valid
  /// once awaited_st() is 1), and the least slowest clock over them.
  [[nodiscard]] uint64_t answers_st(TensorId tensor) const {
    MERCURY_OWNED(owner_);
    MERCURY_OWNED(owner_);
    return async_[tensor].answers;
  }
  [[nodiscard]] uint32_t least_version_st(TensorId tensor) const {
    MERCURY_OWNED(owner_);
    return async_[tensor].version.least - 1;
  }
  [[nodiscard]] uint32_t least_slowest_st(TensorId tensor) const {
    MERCURY_OWNED(owner_);
    return async_[tensor].slowest.least;
  }
  /// Asynchronous: the largest slowest clock heard of any chunk of any
  /// tensor (a scan: control path).
  [[nodiscard]] uint32_t most_slowest_st() const {
    MERCURY_OWNED(owner_);
    return slowest_.empty() ? 0 : *std::max_element(slowest_.begin(), slowest_.end());
  }
  /// Asynchronous: the staleness of a push of `tensor` whose gradient came
  /// from version `base`, as this worker sees it when the push goes: the
  /// versions every chunk has moved on since (the newest it knows, least over
  /// the chunks, minus the base). The server's count for the same update is
  /// the chunk's version when it applies it minus the base: the same when
  /// nothing else was applied in between.
  [[nodiscard]] uint32_t staleness_st(TensorId tensor, uint32_t base) const {
    return least_version_st(tensor) - base;
  }
  /// Chunks per tensor.
  [[nodiscard]] uint32_t chunks_st(TensorId tensor) const {
    MERCURY_OWNED(owner_);
    return tensors_[tensor].chunks;
  }

  /// The oldest version of `tensor` not yet complete: every version before
  /// it is in the trainer's buffer (the fence is done). Asynchronous: 1 once
  /// every chunk arrived, else 0.
  [[nodiscard]] uint32_t awaited_st(TensorId tensor) const {
    if (config_async_) return async_[tensor].version.least != 0 ? 1 : 0;
    return tensors_[tensor].awaited;
  }
  /// Chunks of `version` of `tensor` recorded so far (0 outside the window).
  [[nodiscard]] uint32_t arrived_st(TensorId tensor, uint32_t version) const;
  /// The tensor of block `key`, which deliver_st() has just placed (so valid).
  [[nodiscard]] TensorId tensor_of_st(uint32_t key) const {
    MERCURY_OWNED(owner_);
    return keys_[key].tensor;
  }
  [[nodiscard]] const PullCounters& counters_st() const {
    MERCURY_OWNED(owner_);
    return counters_;
  }
  /// Bytes of bitmaps, counts and geometry allocated at construction.
  [[nodiscard]] uint64_t memory_bytes() const;

 private:
  struct KeyEntry {
    std::byte* base = nullptr;  // the block's first byte in the trainer's buffer
    uint32_t tensor = 0;
    uint32_t first_chunk = 0;  // the block's first chunk among the tensor's
    uint32_t bytes = 0;        // block bytes
  };
  struct TensorState {
    uint32_t awaited = 0;     // oldest incomplete version
    uint32_t head = 0;        // slot of `awaited`
    uint32_t chunks = 0;      // to receive per version
    uint32_t words = 0;       // bitmap words per slot
    uint64_t first_word = 0;  // into bits_: slot s at first_word + s x words
    uint32_t first_slot = 0;  // into arrived_: window entries
    uint32_t pad = 0;
  };
  ChunkVerdict locate(uint32_t key, uint32_t offset, size_t bytes, const KeyEntry*& entry) const;
  uint32_t slot_of(const TensorState& t, uint32_t distance) const {
    return (t.head + distance) % window_;
  }
  bool test(const TensorState& t, uint32_t slot, uint32_t chunk) const;
  void advance(TensorState& t);
  // The least of a tensor's per-chunk values, which only grow: how many
  // chunks hold it; when none does any more, a rescan finds the new least.
  struct Least {
    uint32_t least = 0;
    uint32_t at_least = 0;
  };
  struct AsyncTensor {
    uint64_t answers = 0;
    uint64_t first = 0;  // the tensor's first chunk in newest_ and slowest_
    Least version;       // over newest_ (version + 1; 0 = nothing yet)
    Least slowest;       // over slowest_
  };
  // A chunk's value went from `before` up to `after`: keeps `l` right.
  // Returns true when the least moved.
  static bool raise(Least& l, const uint32_t* values, uint32_t chunks, uint32_t before,
                    uint32_t after);

  uint32_t window_;
  bool config_async_ = false;
  std::vector<AsyncTensor> async_;
  std::vector<uint32_t> newest_;  // per chunk of the model, tensor by tensor
  std::vector<uint32_t> slowest_;
  uint32_t chunk_bytes_;
  std::vector<KeyEntry> keys_;
  std::vector<TensorState> tensors_;
  std::vector<uint64_t> bits_;
  std::vector<uint32_t> arrived_;  // tensors x window
  PullCounters counters_;
  base::Owner owner_;  // the net core
};

/// What PushTracker::start_st() did with a push's Handle.
enum class StartResult : uint8_t {
  kStarted,  ///< stored; completes when every block is settled
  kBusy,     ///< a push of this tensor is still in flight; not touched
};

struct PushCounters {
  uint64_t pushes_started = 0;
  uint64_t pushes_completed = 0;
  uint64_t pushes_failed = 0;
  uint64_t blocks_acked = 0;
  uint64_t blocks_failed = 0;
  uint64_t unexpected = 0;  ///< settled() for a key with no push in flight (or unknown)
};

class PushTracker {
 public:
  /// `table` must be frozen. Throws UsageError.
  explicit PushTracker(const TensorTable& table);

  /// A push of `tensor` begins: its blocks are about to be sent.
  StartResult start_st(TensorId tensor, const Handle& push);
  /// The transport settled block `key` of the push in flight:
  /// `delivered`, or failed with `error` (e.g. the endpoint's text naming the
  /// peer). The handle completes when the tensor's last block is
  /// settled: ok if all were delivered, else failed with the first error.
  void settled_st(uint32_t key, bool delivered, std::string_view error = {});
  /// Pushes in flight.
  [[nodiscard]] uint32_t in_flight_st() const {
    MERCURY_OWNED(owner_);
    return in_flight_;
  }
  /// The tensor of block `key`, or kNoTensor for a key no tensor has.
  static constexpr TensorId kNoTensor = UINT32_MAX;
  [[nodiscard]] TensorId tensor_of_st(uint32_t key) const {
    MERCURY_OWNED(owner_);
    return key < key_tensor_.size() ? key_tensor_[key] : kNoTensor;
  }
  /// Whether a push of `tensor` is in flight (started, not every block settled).
  [[nodiscard]] bool busy_st(TensorId tensor) const {
    MERCURY_OWNED(owner_);
    return flights_[tensor].handle.has_value();
  }
  [[nodiscard]] const PushCounters& counters_st() const {
    MERCURY_OWNED(owner_);
    return counters_;
  }

 private:
  struct Flight {
    std::optional<Handle> handle;
    uint32_t remaining = 0;
    uint32_t error_len = 0;  // > 0: a block failed; its text is in errors_
  };
  // Copied from the table at construction, so that the net core never calls
  // into it (its readers throw once the trainer has shut the worker down).
  std::vector<uint32_t> key_tensor_;                      // per key
  std::vector<uint32_t> blocks_;                          // per tensor
  std::vector<Flight> flights_;                           // per tensor
  std::vector<std::array<char, kMaxErrorBytes>> errors_;  // per tensor, the first failure
  uint32_t in_flight_ = 0;
  PushCounters counters_;
  base::Owner owner_;  // the net core
};

}  // namespace mercury::worker
