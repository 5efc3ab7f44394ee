// The chunk table: one shard's owned parameters, cut into chunks, and the
// exactly-once, rank-ordered aggregation of the workers' contributions.
//
// What it is for. lib/server gives each shard core one ChunkTable. For every
// gradient packet the core calls contribute(); the table records the
// contribution at most once (a 64-bit bitmap per chunk, worker ranks < 64),
// holds the caller's buffer (an opaque token, e.g. the mbuf) until the set
// the sync policy asks for is complete, then reduces the held contributions
// in rank order with SIMD, applies the optimizer to the chunk's parameters,
// increments the chunk's version, gives the held buffers back through
// ChunkSink::release() and hands the updated chunk to ChunkSink::on_update()
// (one payload; the server fans it out to every worker). The server never
// waits for a whole tensor: each chunk completes on its own.
//
// Chunks and addressing. A chunk is one packet's worth of one block
// (placement.h): chunk j of block `key` covers bytes
// [j x chunk_bytes, min((j+1) x chunk_bytes, block bytes)). Use
// chunk_bytes = net::payload_per_packet(mtu) (1408 at MTU 1500), the same
// value on every node, so that a packet is exactly one chunk and the wire's
// (block_key, offset) name it: offset must be a multiple of chunk_bytes and
// the payload exactly the chunk's length.
//
// Element types. Each block has its tensor's dtype (placement.h): its
// contributions, initial values and updates are elements of that type, so a
// chunk of a bfloat16 or float16 block holds chunk_bytes / 2 elements, twice
// a float32 chunk's. Parameters and optimizer state are float32 for every
// block (master weights). A half-precision set is widened and summed in rank
// order into float32 (half.h: exact widening, float32 additions), then goes
// through the same optimizer kernel as a float32 set with the same 1/n, so
// its parameters are bit for bit those of a float32 block fed the widened
// contributions; the updated chunk is rounded once, to nearest even, into
// the dtype for on_update(). A half-precision set costs one more pass over
// the chunk in L1 (the float32 sum) and the rounding.
//
// Ownership of buffers. contribute() returning kHeld or kApplied means the
// table took the contribution: its token is released exactly once through
// ChunkSink::release() (for kApplied, before contribute() returns). Every
// other outcome leaves the buffer with the caller. The data must stay
// readable and unchanged until released. ~ChunkTable releases whatever is
// still held.
//
// Staging. A contribution marked `copy` that the set would hold is copied
// into one of the table's staging chunks instead (kCopied: the caller keeps
// its buffer and may free it at once); the staging chunk is free again when
// the set completes. The server marks the packets that arrive while a port's
// pool is nearly all held (docs/server.md, "Flow control"), so a worker that
// runs ahead costs a copy, not a refusal. ShardConfig::staging_chunks sets
// how many there are (kStagingMost: every held contribution of every set,
// chunks x (quorum - 1), trimmed to memory_limit_bytes); the memory is
// reserved at construction and touched (page-faulted) only as it is first
// used, most recently freed first. With none free, a marked contribution is
// held as usual (counted as staging_full).
//
// Start. Rank 0's initial parameters are adopted with initialize() (per
// chunk, as its packets arrive, or initialize_block() for a whole
// block on the control path); each adopted chunk is handed to on_update()
// at version 0 so the server can send it to every worker. After the first
// update of a chunk, initialize() is refused as stale. A job that resumes
// from a checkpoint restore()s each chunk instead (its values, optimizer
// state and version; shard_state.h reads and writes them as records).
//
// Update rules. A block's tensor may have a rule of its own instead of the
// optimizer (placement.h, UpdateRule): kAverage makes the chunk the pushes'
// average (reduced in rank order and scaled by 1/n as every set is),
// kRank0 rank 0's push (a set without it, in the asynchronous policies,
// leaves the values as they are), kOptimizerRank0 the optimizer applied to
// rank 0's push as the gradient (not averaged), or nothing when that push
// begins with the skip marker (kSkipStepFloat32: a skipped step, which Adam's
// t does not count; such chunks keep their skipped steps in a per-chunk
// count, 4 bytes each). Either way the chunk's version moves on and the
// update is emitted as any other.
//
// Threads. A ChunkTable belongs to the one lcore that owns its shard; no
// method may be called concurrently or from another thread (the sink is
// called on that thread, from inside contribute()/initialize()). Nothing is
// locked.
//
// Costs. Construction (control path) allocates everything once and throws
// std::invalid_argument for a bad configuration, std::length_error if the
// memory it needs exceeds memory_limit_bytes, std::bad_alloc if the system
// has not got it. After that no call allocates,
// throws, locks or logs. contribute() is O(1) (three array lookups, a
// multiply in place of a division, one bit test) plus, when it completes a
// set, one pass over the set's bytes (reduce_apply, optimizer.h); the
// sink's release() and on_update() are called once per update. Memory:
// memory_needed() bytes = parameters and optimizer state (4 B x (1 + state
// floats) per element, each array rounded up to 64 B, or to whole 2 MB pages
// from 2 MB up, which are asked for transparent huge pages) + 32 B per chunk +
// 16 B x N per chunk (held slots) + 4 B x N per chunk when the policy tracks
// rank iterations + 16 B per block of the job + 32 B per owned
// block + (chunk_bytes + 4 B) per staging chunk + 2 x chunk_bytes + 2 B per
// element (each part rounded to 64 B) when it owns a bfloat16 or float16
// block (one chunk's float32 sum, and every chunk's rounded update, kept
// until its next: the sink may send it by reference); plus, outside the table, at
// most max_held contributions held in the caller's buffers. A staged copy
// costs one memcpy of the chunk.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "agg/half.h"
#include "agg/hyperparameters.h"
#include "agg/optimizer.h"
#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "base/counter_list.h"
#include "wire/dtype.h"

namespace mercury::agg {

/// Largest worker count: one bit per rank in a 64-bit contribution bitmap.
inline constexpr uint32_t kMaxWorkers = 64;

/// What contribute() / initialize() did. Everything from kBadRank on is a
/// rejection: the caller keeps (and frees) the buffer, and it is counted.
enum class Outcome : uint8_t {
  kHeld,         ///< taken and held; the set is not complete yet
  kCopied,       ///< taken as a copy in a staging chunk; the caller keeps (and frees) the buffer
  kApplied,      ///< taken and it completed the set: the update has been applied and emitted
  kInitialized,  ///< initialize(): initial values adopted and emitted at version 0
  kBadRank,      ///< rank >= workers
  kUnknownKey,   ///< no such block in the placement
  kNotOwned,     ///< the block belongs to another shard
  kBadOffset,    ///< offset not a chunk boundary inside the block
  kBadLength,    ///< payload length is not the chunk's length
  kDuplicate,    ///< this rank's contribution for this iteration was already taken
  kStale,      ///< an iteration the chunk has moved past (policy), or initialize() after an update
  kFuture,     ///< computed from parameters the chunk has not reached (policy)
  kHoldLimit,  ///< max_held buffers are held already; retry later
};
inline constexpr size_t kOutcomeCount = static_cast<size_t>(Outcome::kHoldLimit) + 1;
std::string_view outcome_name(Outcome outcome);
/// True for kHeld, kCopied, kApplied, kInitialized.
constexpr bool taken(Outcome o) { return o <= Outcome::kInitialized; }

struct ShardConfig {
  uint32_t shard = 0;        ///< the global shard id this table serves
  uint32_t workers = 1;      ///< N, 1..kMaxWorkers; ranks are 0..N-1
  uint32_t chunk_bytes = 0;  ///< net::payload_per_packet(mtu); a multiple of 4 in [4, 65532]
  /// Applied per chunk update, with its initial hyperparameters: versioned
  /// settings from then on (optimizer(), hyperparameters.h; BSP from a
  /// version, the asynchronous policies from each chunk's next update).
  OptimizerConfig optimizer;
  /// Must be available (optimizer.h). kPortable also takes the portable
  /// half-precision kernels (half.h); anything else the fastest compiled in.
  Simd simd = Simd::kAuto;
  /// Construction fails if the table would need more (memory_needed()).
  uint64_t memory_limit_bytes = uint64_t{4} << 30;
  /// Cap on contributions held at once (caller buffers); 0 = chunks x (quorum - 1), the most
  /// that can ever be held, i.e. no cap. A contribution refused for it (kHoldLimit) is gone
  /// unless the caller has not acknowledged it yet: see docs/agg.md before setting one. The
  /// server leaves it at 0 and bounds the held buffers before its transport acknowledges
  /// them instead (docs/server.md "Flow control").
  uint64_t max_held = 0;
  /// Staging chunks for contributions marked `copy` (see Staging): 0 = none,
  /// kStagingMost = chunks x (quorum - 1), as many as fit in memory_limit_bytes
  /// next to the rest of the table; other values are capped at chunks x (quorum - 1).
  uint64_t staging_chunks = 0;
};
inline constexpr uint64_t kStagingMost = UINT64_MAX;

/// One gradient packet, as the server parsed it.
struct Contribution {
  uint32_t key = 0;        ///< wire block_key: the block
  uint32_t offset = 0;     ///< wire offset: byte offset in the block, a chunk boundary
  uint32_t iteration = 0;  ///< wire iteration: parameter version the gradient came from
  uint16_t rank = 0;       ///< the sending worker's rank, < workers (from its peer)
  /// Asynchronous policies (SyncPolicy::tracks_rank_iterations): the rank's
  /// clock, how many pushes of this tensor it made before this one (wire
  /// param_version of a push). Per (chunk, rank) a clock below the next one
  /// expected is a replay (kDuplicate); BSP ignores it.
  uint32_t clock = 0;
  const std::byte* data = nullptr;  ///< payload: elements of the block's dtype, any alignment
  uint32_t bytes = 0;               ///< payload length
  void* token = nullptr;            ///< handed back to ChunkSink::release() when taken
  bool copy = false;                ///< stage a copy rather than hold the buffer (see Staging)
};

/// An updated chunk, valid only during ChunkSink::on_update(): `data` points
/// into the table's memory, which the next update changes.
struct Update {
  uint32_t key = 0;
  uint32_t offset = 0;        ///< byte offset in the block
  uint32_t version = 0;       ///< the chunk's new version (0: initial); wire param_version
  uint8_t priority = 0;       ///< the tensor's priority
  uint32_t staleness = 0;     ///< of the oldest contribution in the update
  uint64_t contributors = 0;  ///< ranks whose contributions made the update (0 for init)
  /// Asynchronous policies: the chunk's slowest clock, the fewest
  /// contributions of any rank applied to it so far (0 under BSP). A rank
  /// whose own count is c is c - slowest iterations ahead of the slowest.
  uint32_t slowest = 0;
  /// Asynchronous policies: the contributor's clock after this update (its
  /// pushes of the chunk applied); 0 under BSP and for version 0.
  uint32_t clock = 0;
  /// Asynchronous policies: every rank's clock of this chunk, rank order
  /// (the table's own, valid only during on_update); nullptr under BSP.
  const uint32_t* clocks = nullptr;
  /// The chunk's parameters (sum-only: the averaged gradient) in the block's
  /// dtype, what the workers get: float32, the table's parameters
  /// themselves; bfloat16 or float16, those rounded once to nearest even
  /// (half.h) into the chunk's place in a buffer of the table's, unchanged
  /// until the chunk's next update (like the float32 parameters).
  const std::byte* data = nullptr;
  uint32_t bytes = 0;                         ///< the chunk's elements x wire::element_bytes(dtype)
  wire::Dtype dtype = wire::Dtype::kFloat32;  ///< the block's
};

/// Implemented by the caller (lib/server): where updates and buffers go.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  /// One updated chunk. Copy `u.data` before returning (e.g. into the one
  /// payload mbuf the fan-out shares). Must not call back into the table.
  virtual void on_update(const Update& u) = 0;
  /// These contributions' buffers are no longer needed (`count` >= 1
  /// tokens; one call per update, or per held buffer at destruction).
  virtual void release(void* const* tokens, uint32_t count) = 0;
};

// Every chunk table counter, once (base/counter_list.h).
#define MERCURY_CHUNK_TABLE_COUNTERS(X)                                                   \
  X(updates, "chunk updates applied (excluding initial values)")                          \
  X(gradient_bytes, "contribution bytes reduced")                                         \
  X(staging_full, "contributions marked copy held as buffers: no staging chunk was free") \
  X(steps_skipped, "optimizer_rank0 updates whose rank-0 push was the skip marker")       \
  X(rank0_differ, "optimizer_rank0 updates where another rank's push differed from rank 0's")

struct ChunkTableCounters {
  std::array<uint64_t, kOutcomeCount> outcomes{};  ///< per Outcome, indexed by its value
  MERCURY_CHUNK_TABLE_COUNTERS(MERCURY_COUNTER_DECLARE)
  [[nodiscard]] uint64_t count(Outcome o) const { return outcomes[static_cast<size_t>(o)]; }
  [[nodiscard]] uint64_t rejected() const;

  /// f(prefix, name, value) for every counter; outcomes as outcome_<name>.
  template <class F>
  void for_each(F&& f) const {
    base::visit_array(f, "outcome_", outcomes,
                      [](size_t i) { return outcome_name(static_cast<Outcome>(i)); });
    MERCURY_CHUNK_TABLE_COUNTERS(MERCURY_COUNTER_VISIT)
  }
  ChunkTableCounters& operator+=(const ChunkTableCounters& o) {
    base::add_array(outcomes, o.outcomes);
    MERCURY_CHUNK_TABLE_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

class ChunkTable {
 public:
  /// Builds the table for the blocks `placement` gives config.shard.
  /// `sink` must outlive the table. Throws (see Costs).
  ChunkTable(const Placement& placement, const ShardConfig& config,
             std::unique_ptr<SyncPolicy> policy, ChunkSink& sink);
  ~ChunkTable();
  ChunkTable(const ChunkTable&) = delete;
  ChunkTable& operator=(const ChunkTable&) = delete;

  /// Bytes the table would allocate for this placement, configuration and policy.
  static uint64_t memory_needed(const Placement& placement, const ShardConfig& config,
                                const SyncPolicy& policy);
  /// The staging chunks a table built with these arguments has (ShardConfig::staging_chunks
  /// resolved: capped, and kStagingMost trimmed to the memory limit).
  static uint64_t staging_for(const Placement& placement, const ShardConfig& config,
                              const SyncPolicy& policy);

  /// Records one contribution (see the file comment). Never throws.
  Outcome contribute(const Contribution& c);

  /// Adopts initial values for one chunk (rank 0's packet: elements of the
  /// block's dtype, widened exactly into the float32 parameters) and emits
  /// them at version 0. kDuplicate if the chunk was already initialised,
  /// kStale once it has been updated; the data is copied, the caller keeps
  /// its buffer.
  Outcome initialize(uint32_t key, uint32_t offset, const std::byte* data, uint32_t bytes);
  /// Control path: initialises every chunk of block `key` from `values`,
  /// the whole block's float32 parameters whatever its dtype (emitted as
  /// initialize() emits, so rounded into a half-precision dtype). Throws
  /// std::invalid_argument if the block is not owned here or the size is
  /// wrong.
  void initialize_block(uint32_t key, std::span<const float> values);

  /// The current float32 parameters of an owned block, whatever its dtype
  /// (sum-only: the last averaged gradient). Empty if not owned.
  [[nodiscard]] std::span<const float> parameters(uint32_t key) const;
  /// An owned block's values as the workers get them, its wire bytes: a
  /// float32 block's parameters; a bfloat16 or float16 block's, every
  /// chunk's last emitted version rounded into the dtype (unchanged until
  /// the chunk's next update, as the parameters are). What a fan-out sends
  /// again. Empty if not owned.
  [[nodiscard]] std::span<const std::byte> wire_values(uint32_t key) const;
  /// Version of the chunk at (key, offset); UINT32_MAX if it does not exist here.
  [[nodiscard]] uint32_t version(uint32_t key, uint32_t offset) const;
  /// The ranks whose contributions the chunk at (key, offset) holds now
  /// (bit r = rank r), 0 if it does not exist here.
  [[nodiscard]] uint64_t held_ranks(uint32_t key, uint32_t offset) const;
  /// Asynchronous policies: the least over the ranks of the next clock the
  /// chunk at (key, offset) accepts (Update::slowest). 0 under BSP or for a
  /// chunk that does not exist here.
  [[nodiscard]] uint32_t slowest(uint32_t key, uint32_t offset) const;
  /// Asynchronous policies: every rank's next clock of chunk `index` (<
  /// chunks(), rank order); empty under BSP.
  [[nodiscard]] std::span<const uint32_t> clocks(uint64_t index) const;

  // ---- membership (docs/membership.md): control path, the owner's thread ----
  /// Rank `rank` left the job (docs/membership.md). Asynchronous policies:
  /// from now on the slowest clock of every chunk is the least over the
  /// other ranks, so SSP's bound no longer waits for it; its contributions
  /// still apply (one already acknowledged is never lost). BSP (a job that
  /// shrinks): every set from now on needs only the ranks still in the job;
  /// a set holding the rank's contribution keeps it and counts it (1/n over
  /// the contributions it holds), and every set that now holds every other
  /// rank's completes at once (its update emitted from inside this call).
  /// The caller gives the table no contribution of the rank after this
  /// call (a later one would be counted). For a rank >= workers(), or one
  /// removed already, nothing changes. Control path: a scan of the chunks.
  void remove_rank(uint32_t rank);
  /// Asynchronous policies: a new process of removed rank `rank` joins the
  /// job. Each chunk takes its clock to be the slowest clock of the ranks in
  /// the job now (with none, the fastest), so SSP's bound neither waits for
  /// the newcomer nor lets it run ahead. Its first contribution to each
  /// chunk then sets its clock, whatever it is (its worker counts from the
  /// largest slowest clock its first pull carried, which a copy the server
  /// had queued for the old process can hold back: docs/membership.md,
  /// "Joining"); from then on a replay is kDuplicate as for any rank (8 B
  /// per chunk, allocated at the first join, beyond memory_needed()). The
  /// rank is no longer removed. Nothing happens under BSP, for a rank >=
  /// workers() or one that is not removed. Control path.
  void join_rank(uint32_t rank);
  /// The ranks removed (bit r = rank r).
  [[nodiscard]] uint64_t removed() const { return removed_; }

  // ---- settings and checkpoints: control path, the owner's thread ----
  /// The optimizer and its versioned hyperparameters (hyperparameters.h):
  /// a change is seen by the next update.
  [[nodiscard]] ShardOptimizer& optimizer() { return optimizer_; }
  [[nodiscard]] const ShardOptimizer& optimizer() const { return optimizer_; }
  /// The least and the greatest version of the table's chunks (a scan).
  [[nodiscard]] std::pair<uint32_t, uint32_t> version_range() const;
  /// Chunk `index` (< chunks(), in key and offset order) as a checkpoint
  /// holds it: where it is, its version, its parameters and optimizer
  /// state (state_floats_per_element() arrays; the others empty).
  struct ChunkView {
    uint32_t key = 0;
    uint32_t offset = 0;
    uint32_t version = 0;
    uint32_t steps = 0;        ///< optimizer steps taken: version less the skipped ones
    bool initialized = false;  ///< has values: initial, restored or updated
    std::span<const float> params, state0, state1;
  };
  [[nodiscard]] ChunkView chunk_view(uint64_t index) const;
  /// Adopts a checkpoint's chunk: its parameters, optimizer state and
  /// version (copied), and emits it at that version, as initialize() emits
  /// version 0. Refused (counted) as initialize() refuses: kUnknownKey,
  /// kNotOwned, kBadOffset, kBadLength (`params` is not the chunk's
  /// length, or a state array not as long, or `steps` (the optimizer
  /// steps taken, version by default) above version or, but for a
  /// kOptimizerRank0 chunk, below it), kDuplicate (the chunk has values
  /// already), kStale (it was updated).
  Outcome restore(uint32_t key, uint32_t offset, uint32_t version, std::span<const float> params,
                  std::span<const float> state0, std::span<const float> state1,
                  std::optional<uint32_t> steps = std::nullopt);

  /// A running server rolls back to a checkpoint (docs/durability.md,
  /// "Several servers"): every held contribution is given back (buffers
  /// through ChunkSink::release, staging chunks freed) and every chunk is
  /// left without values at version 0, so restore() takes each again.
  /// Returns the buffers released. Control path: a scan of the chunks.
  uint64_t rewind();

  /// The index of the chunk at (key, offset) among chunks() (chunk_view's
  /// numbering), or -1 when it does not exist here.
  [[nodiscard]] int64_t chunk_index(uint32_t key, uint32_t offset) const;
  /// A hot standby's copy (docs/durability.md, "A hot standby"): chunk
  /// `index` takes these parameters, optimizer state, version and steps as
  /// they are, whatever it held, and emits nothing (a standby serves its
  /// chunks only once promoted). kBadLength as restore() refuses lengths
  /// (the chunk is unchanged), else kInitialized. Never allocates or throws.
  Outcome replicate(uint64_t index, uint32_t version, uint32_t steps, std::span<const float> params,
                    std::span<const float> state0, std::span<const float> state1);

  [[nodiscard]] const ChunkTableCounters& counters() const { return counters_; }
  [[nodiscard]] const SyncPolicy& policy() const { return *policy_; }
  [[nodiscard]] uint32_t workers() const { return workers_; }
  [[nodiscard]] uint64_t chunks() const { return chunks_.size(); }
  /// Contributions currently held in the caller's buffers (not yet released).
  [[nodiscard]] uint64_t held() const { return held_; }
  /// Staging chunks: how many there are, how many hold a copy now, and how
  /// many have been freed since construction (monotonic).
  [[nodiscard]] uint64_t staging_chunks() const { return staging_capacity_; }
  [[nodiscard]] uint64_t staged() const { return staging_capacity_ - staging_free_.size(); }
  [[nodiscard]] uint64_t staging_released() const { return staging_released_; }
  [[nodiscard]] uint64_t max_held() const { return max_held_; }
  /// Bytes allocated by the table; equals memory_needed().
  [[nodiscard]] uint64_t memory_bytes() const;

 private:
  // Hot per-chunk state, 32 bytes so two share a cache line.
  struct Chunk {
    uint64_t have = 0;           // bit r: rank r's contribution is held
    uint64_t first_element = 0;  // into params_ (and each state array)
    uint32_t version = 0;        // updates applied
    uint32_t oldest = 0;         // oldest iteration among the held contributions
    uint32_t block = 0;          // index into local_
    uint16_t elements = 0;
    uint8_t initialized = 0;
    wire::Dtype dtype = wire::Dtype::kFloat32;  // the block's
  };
  static_assert(sizeof(Chunk) == 32);
  // A held contribution.
  struct Held {
    const std::byte* data;
    void* token;
  };
  struct LocalBlock {
    uint32_t key;
    uint32_t first_chunk;
    uint64_t first_element;
    uint64_t elements;
    uint8_t priority;
    UpdateRule update;  // the optimizer's, or a rule of its own (placement.h)
    wire::Dtype dtype;
  };
  static_assert(sizeof(LocalBlock) == 32);
  struct FreeDeleter {
    void operator()(float* p) const;
  };

  // memory_needed() without the staging chunks (throws for a bad chunk_bytes).
  static uint64_t base_memory(const Placement& placement, const ShardConfig& config,
                              const SyncPolicy& policy);
  // Finds the chunk for (key, offset, bytes) or says why not.
  [[gnu::always_inline]] inline Outcome locate(uint32_t key, uint32_t offset, uint32_t bytes,
                                               uint64_t& chunk) const;
  [[gnu::always_inline]] inline Outcome locate_contribution(const Contribution& c,
                                                            uint64_t& index) const;
  [[gnu::always_inline]] inline Outcome record(const Contribution& c, uint64_t index);
  void complete(uint64_t index);
  // Adopts version 0 of chunk `index` from wire elements (or, `master`, from
  // float32 values whatever the dtype) and emits it.
  Outcome adopt(uint64_t index, const std::byte* data, bool master);
  // A half-precision chunk's set into its float32 parameters, and its update
  // rounded into the dtype (out of line: the float32 path stays as small).
  // `kind` is the optimizer's or kSumOnly (the average rule); `state0`,
  // `state1` the chunk's optimizer state (or null).
  [[gnu::noinline]] void reduce_half(const Chunk& ch, const std::byte* const* src, uint32_t n,
                                     OptimizerKind kind, float* state0, float* state1,
                                     const StepParams& step);
  [[gnu::noinline]] const std::byte* narrow_half(const Chunk& ch);
  // The token of a staged copy: the table's own address, never a caller's buffer.
  [[nodiscard]] void* staged_token() const { return const_cast<ChunkTable*>(this); }
  void emit(uint64_t index, uint64_t contributors, uint32_t staleness);
  [[nodiscard]] uint32_t slowest_clock(uint64_t index) const;

  ChunkSink& sink_;
  std::unique_ptr<SyncPolicy> policy_;
  uint32_t workers_;
  uint32_t quorum_;
  uint32_t chunk_bytes_;
  uint64_t div_magic_;  // ceil(2^64 / chunk_bytes_): see locate()
  ShardOptimizer optimizer_;
  Simd simd_;
  bool track_ranks_;
  bool bsp_;  // the policy is BspPolicy: its admit() is inlined (the default mode's hot path)
  uint64_t max_held_ = 0;
  uint64_t held_ = 0;

  // Per global key, what contribute() needs in one load: the block's
  // first chunk and length (0 = owned by another shard), and its local index.
  struct KeyEntry {
    uint32_t first_chunk = 0;
    uint32_t bytes = 0;
    int32_t local = -1;
    uint32_t shift = 0;  // log2 of the block's element size on the wire
  };
  static_assert(sizeof(KeyEntry) == 16);
  std::vector<KeyEntry> keys_;
  std::vector<LocalBlock> local_;
  std::vector<Chunk> chunks_;
  std::vector<Held> slots_;           // chunks x workers
  std::vector<uint32_t> next_clock_;  // chunks x workers, when track_ranks_: next clock accepted
  uint64_t removed_ = 0;              // remove_rank: left out of the slowest clock
  uint64_t removed_bsp_ = 0;          // BSP: removed ranks, counted as in by every set
  std::vector<uint64_t> joined_;      // per chunk once a rank joined: bit r, its first push to come
  std::vector<uint32_t> skipped_;     // per chunk, with a kOptimizerRank0 block: steps skipped
  uint64_t elements_ = 0;
  uint32_t state_arrays_ = 0;
  std::unique_ptr<float[], FreeDeleter> params_;  // 64-byte aligned
  std::unique_ptr<float[], FreeDeleter> state0_;
  std::unique_ptr<float[], FreeDeleter> state1_;
  // Staging: capacity x chunk_bytes_, 64-byte aligned; the free chunks' indices, a stack.
  uint64_t staging_capacity_ = 0;
  uint64_t staging_released_ = 0;
  std::unique_ptr<float[], FreeDeleter> staging_;
  std::vector<uint32_t> staging_free_;
  // Half-precision blocks: each dtype's kernels (null for the others) and,
  // when the table owns such a block, one chunk's float32 sum and every
  // element's rounded update (2 B each, indexed as params_), 64-byte aligned.
  std::array<const HalfKernels*, wire::kDtypeCount> half_{};
  std::unique_ptr<float[], FreeDeleter> half_scratch_;
  float* half_sum_ = nullptr;
  std::byte* half_out_ = nullptr;
  ChunkTableCounters counters_;
};

}  // namespace mercury::agg
