// One shard of a parameter server: the chunk table of the blocks it owns
// (lib/agg) and the fan-out of every updated chunk to every worker.
//
// contribute_st() takes one worker's packet (one chunk of one block, as
// the transport accepted it) and gives it to the ChunkTable, which holds the
// buffer until the chunk has every worker's contribution, then reduces them in
// rank order, applies the optimizer and calls back on_update(): the shard
// then submits the updated chunk to every worker as a slice of its block
// (Endpoint::send_slice: one payload, the shard's parameter memory, N
// headers), at the block's priority level. The buffers go back to their
// port's pool as soon as the update is applied.
//
// Initial parameters: initialize_st() hands one chunk of rank 0's kInit
// packets to ChunkTable::initialize, which copies it and emits it at
// version 0; the fan-out is the same as for an update. A gradient of
// iteration 0 then produces version 1 (agg::BspPolicy: a chunk's version is
// the number of updates applied, initial values are version 0).
//
// Threads: a Shard belongs to one lcore (the server's net core when shards
// run inline, or its own shard core fed by a ring); contribute_st() and the
// other _st functions but the admission side's run there (base/owner.h
// asserts it). The admission side (staging_room_st, reserve_staging_st,
// unreserve_staging_st, marks_in_flight_st) belongs to the server's net core,
// which owns the staging credits it takes, whichever core runs the shard. The
// endpoints it sends through may belong to other lcores: send_slice() is
// lock-free from any thread. Construction is control path
// (allocates, may throw). Costs: see agg::ChunkTable; the fan-out is one
// descriptor submission per worker per chunk update.
//
// A slice an endpoint does not queue (descriptors or ingress exhausted) is
// kept in a bounded backlog and resubmitted by retry_fanout_st(), from the
// table's memory, so an undersized endpoint slows the fan-out down instead
// of losing an update (which would stall that chunk's BSP set for good).
//
// Who gets an update (Fanout, from the job's training.sync): BSP sends it to
// every worker; ASP to the worker whose gradient it applied; SSP to that
// worker too, holding the answer while the slowest clock holds the worker
// back and sending it with the update that releases it (SspAnswers,
// fanout.h); PS+ the answer to the worker whose gradient it applied, and
// the chunk's newest version to every other worker as its link has room
// (the eager pull): each (chunk, worker) is owed at most one copy, sent
// from a snapshot of the newest version while fewer than kEagerWindowBytes
// of them are on the wire to that worker, at the lowest priority level, so
// versions made meanwhile merge into it (fanout_merged) and the copies take
// only link time that the answers the workers wait for leave. In the
// asynchronous modes every packet says whether it applied the recipient's
// own gradient and the chunk's slowest clock (wire::kAggYours).
//
// Bytes on the wire. BSP sends from the table's memory: a chunk's next
// update needs every worker's next gradient, which no worker sends before it
// has received this update (docs/server.md), so the bytes stay valid for the
// retransmissions. The asynchronous modes update a chunk while its previous
// version may still be on the wire, so each update is first copied into a
// snapshot (one chunk; the shard has `snapshots` of them, by default two per
// chunk it owns) that its sends share and that is free again once every one
// of them has ended (a reference count the endpoint's completions drop, on
// whichever core they run). With every snapshot on the wire the update's
// sends wait in the backlog (counted, snapshots_full) and go later from a
// snapshot of the chunk's newest version, which contains this update: a
// worker then receives a newer version, never a torn one, and never more
// than `snapshots` x chunk bytes are held. A copy that only brings a worker a
// newer version (not the answer to its own push: version 0 here; psplus's
// owed copies merge the same way, above) is not deferred when one to that
// worker for that chunk already waits (fanout_merged): that one will carry
// the newest. A worker has at most one push of a chunk waiting for its
// answer, so at most two entries per (chunk, worker) wait: the backlog holds
// 2 x chunks x workers and never overflows.
//
// Store-and-forward (training.aggregation: tensor, BSP only): the classical
// PS's behaviour, kept as a baseline. `unit_chunks` = n > 0 holds each
// updated chunk until every chunk of its unit (n consecutive chunks of a
// block, the last unit shorter; UINT32_MAX: the whole block) has a new
// version, then sends the unit's chunks to every worker in offset order. A
// chunk's bytes stay valid while held, as above: no worker has the update,
// so none can send the chunk's next gradient. Costs 5 B per chunk. Rank 0's
// initial values (version 0) are not an aggregate and go out chunk by chunk
// as under chunk aggregation: the baseline is how a PS aggregates gradients,
// and a job's start is not what it is compared on.
//
// Flow control (docs/server.md) reads three things the shard publishes for
// other cores: every buffer it frees (the table's releases, free_st), counted
// by port in releases(), which chunks' sets other ranks have started,
// in started() (server/started_sets.h: set when the table takes a
// contribution, cleared in on_update before the fan-out), and the staging
// credits it has given back (staging_room_st()).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/placement.h"
#include "base/owner.h"
#include "net/packet_port.h"
#include "server/buffer_releases.h"
#include "server/counters.h"
#include "server/fanout.h"
#include "server/replica.h"
#include "server/shard_task.h"
#include "server/snapshot.h"
#include "server/started_sets.h"
#include "transport/endpoint.h"

namespace mercury::server {

/// Where a worker's updates go: its endpoint and the peer index there.
struct FanOut {
  transport::Endpoint* endpoint = nullptr;
  uint16_t peer = 0;
};

class Shard final : public agg::ChunkSink {
 public:
  /// `placement` must outlive the shard. `fanout[r]` is worker rank r.
  /// `fanout_backlog`: slices kept for a retry when an endpoint refuses
  /// them (kNoDescriptor, kIngressFull); 0 = chunks x workers, the most BSP
  /// can need (one update per chunk per worker waits at a time).
  /// `rule`: kEvery for BSP, else the asynchronous modes' rule, which sends
  /// from `snapshots` snapshot chunks (0 = two per chunk of the shard).
  /// `unit_chunks`: 0 sends each update at once; else store-and-forward
  /// (above), only with kEvery. `staleness_bound`: kSlowest's
  /// (fanout_recipients). `buffers`: how to free and read the marks of the
  /// received buffers contribute_st() is given (the node's ports' own).
  Shard(const agg::Placement& placement, const agg::ShardConfig& config,
        std::unique_ptr<agg::SyncPolicy> policy, std::vector<FanOut> fanout,
        const net::BufferOps& buffers, uint64_t fanout_backlog = 0, Fanout rule = Fanout::kEvery,
        uint64_t snapshots = 0, uint32_t unit_chunks = 0, uint32_t staleness_bound = 0);

  /// One chunk of worker `rank`'s gradient. True when the table took the
  /// buffer (it frees it later); false leaves the buffer with the caller,
  /// also when the table took a copy. `copy`: the packet came with a
  /// staging credit (reserve_staging_st): the table copies it rather than
  /// hold the buffer, and the credit comes back when the copy's set
  /// completes, or at once if no copy was made.
  /// `clock`: the push's wire param_version (agg::Contribution::clock).
  bool contribute_st(uint16_t rank, uint32_t key, uint32_t offset, uint32_t iteration,
                     uint32_t clock, std::span<const std::byte> payload, net::PacketBuf* buf,
                     bool copy = false);
  bool contribute_st(uint16_t rank, const wire::HeaderFields& h, std::span<const std::byte> payload,
                     net::PacketBuf* buf, bool copy = false) {
    return contribute_st(rank, h.block_key, h.offset, h.iteration, h.param_version, payload, buf,
                         copy);
  }

  /// Staging credits (flow control, docs/server.md): one per staging chunk
  /// of the table. The node's net core takes one for each packet it marks
  /// `copy`, and only while staging_room_st() > 0, so a marked packet always
  /// finds a free staging chunk. Net core only.
  [[nodiscard]] uint64_t staging_room_st() const {
    MERCURY_OWNED(admission_);
    const uint64_t out = staging_taken_ - staging_returned_.load(std::memory_order_relaxed);
    return staging_chunks_ > out ? staging_chunks_ - out : 0;
  }
  void reserve_staging_st() {
    MERCURY_OWNED(admission_);
    ++staging_taken_;
  }
  /// The net core gives a credit back for a marked packet it never handed over.
  void unreserve_staging_st() {
    MERCURY_OWNED(admission_);
    --staging_taken_;
  }
  /// Net core: marked packets handed over that the shard has not taken yet
  /// (queued to its shard core; 0 for an inline shard between packets).
  [[nodiscard]] uint64_t marks_in_flight_st() const {
    MERCURY_OWNED(admission_);
    return staging_taken_ - marks_done_.load(std::memory_order_relaxed);
  }
  /// True when the table can stage every contribution a set may hold
  /// (chunks x (N - 1)): then a marked packet never holds a buffer.
  [[nodiscard]] bool stages_every_set() const {
    return staging_chunks_ != 0 && staging_chunks_ == table_->chunks() * (table_->workers() - 1);
  }

  /// One chunk of rank 0's initial parameters (a kInit packet): adopted by
  /// the table (copied; the caller keeps the buffer) and sent to every worker
  /// as version 0 of the chunk. False when refused (counted).
  bool initialize_st(uint32_t key, uint32_t offset, std::span<const std::byte> payload);

  /// Runs a settings or checkpoint task on the shard's thread (shard_task.h)
  /// and marks it done. A restored chunk goes to every worker as rank 0's
  /// initial values do, at its version. Control path.
  void run_task_st(ShardTask& task);

  /// Rank `rank` left the job (docs/membership.md; on the shard's thread
  /// through a kRemove task): nothing more is sent to it (its deferred
  /// slices, owed SSP answers and owed PS+ copies are dropped, counted in
  /// removed_dropped). Asynchronous modes: the slowest clock leaves it out
  /// (agg::ChunkTable::remove_rank), and the SSP answers that clock now
  /// lets go are sent; its contributions still in flight apply as before.
  /// BSP (training.on_worker_loss shrink): every set from now on needs the
  /// other ranks only, and the sets that hold all of theirs complete now
  /// (agg::ChunkTable::remove_rank: a contribution of the rank a set holds
  /// counts). Control path: a scan of the shard's chunks.
  void remove_rank_st(uint16_t rank);
  /// A new process of removed rank `rank` joined the job (docs/membership.md;
  /// asynchronous modes, through a kJoin task), reached at `to` (its own
  /// node, or a spare that took the rank over): it is sent updates again,
  /// its clock of each chunk is the slowest clock of the ranks in the job
  /// (agg::ChunkTable::join_rank), and it is owed every chunk's newest
  /// version (counted in join_owed), sent as
  /// psplus's eager copies are: at the lowest priority level, within the
  /// eager window, after the answers the other ranks wait for. Nothing
  /// happens under BSP or for a rank that is in the job. Control path.
  void join_rank_st(uint16_t rank, FanOut to);

  // ---- BSP, training.on_worker_loss wait (docs/membership.md) ----
  /// Control path, before the shard runs: every update's bytes (in the
  /// block's dtype) are copied aside as well, two versions per chunk (the
  /// newest and the one before), so that a new process of a lost rank can
  /// be sent the version its iteration in progress came from. Costs
  /// 2 x the shard's wire bytes (+ 8 B per chunk) and a copy of each
  /// update. Throws std::invalid_argument under another fan-out rule.
  void keep_versions();
  /// Rank `rank` is lost and waited for (a kSuspend task): nothing is sent
  /// to it (its deferred slices dropped, removed_dropped); its sets keep
  /// what it gave and wait for the rest. BSP only.
  void suspend_rank_st(uint16_t rank);
  /// Its new process joined at `version`, the iteration in progress (a
  /// kRejoin task): it is sent updates again, and every chunk at `version`
  /// (a chunk one past it from its kept copy; counted in join_owed); a
  /// slice the endpoint refuses waits in the backlog. Its push of `version`
  /// to a chunk one past it is refused as stale and answered with the
  /// chunk (answered_again). BSP only, after keep_versions().
  void rejoin_rank_st(uint16_t rank, uint32_t version);

  // ---- Several servers, one resumed (docs/durability.md) ----
  /// A running server rolls back to `version` (a kRewind task, then
  /// kRollBack's restore): the slices the fan-out still owes (versions the
  /// rollback takes back) are dropped (counted in rewound), the table gives
  /// back every contribution it holds (agg::ChunkTable::rewind: buffers
  /// freed, staging chunks and their credits back), the started sets are
  /// cleared, and a checkpoint being filled is abandoned (its versions
  /// come again). BSP only. Control path: a scan of the shard's chunks.
  void rewind_st(uint32_t version);

  /// Resubmits the slices an endpoint refused, oldest first, until one is
  /// refused again; returns how many went. Called by the shard's owner
  /// whenever fanout_pending() (the inline loop, or the shard core's).
  uint32_t retry_fanout_st();
  [[nodiscard]] bool fanout_pending() const {
    return backlog_count_ != 0 || eager_pending_ != 0 ||
           (replica_retry_count_ != 0 && !standby_failed_);
  }

  /// The shard's owner: frees a buffer of a packet handed to it that the
  /// table did not take (counted for flow control, as the table's releases).
  void free_st(net::PacketBuf* b) {
    MERCURY_OWNED(owner_);
    releases_.free_st(b);
  }
  /// Any thread: what the shard has freed, per port of the node (flow control).
  [[nodiscard]] const BufferReleases& releases() const { return releases_; }
  /// The shard moves to another thread (attached to its shard core, or
  /// drained by the control path once that core stopped).
  void hand_over() {
    owner_.hand_over();
    releases_.hand_over();
    started_.hand_over();
    if (snapshot_ != nullptr) snapshot_->hand_over();
  }
  /// Control path, before the shard runs: background checkpoints copy each
  /// chunk into `s` at a checkpoint version (snapshot.h), in on_update
  /// before the fan-out. `s` must outlive the shard's updates.
  void set_snapshot(ShardSnapshot* s) { snapshot_ = s; }
  /// Any thread: which chunks' sets hold a contribution (flow control).
  [[nodiscard]] const StartedSets& started() const { return started_; }

  // ---- A hot standby (replica.h, shard_replica.cpp; BSP, inline shards) ----
  /// Control path, before the shard runs. Primary: every update is sent
  /// to `standby` first (its parameters and optimizer state, at the block's
  /// priority level: the answers' order is kept) and goes to the workers
  /// once the standby acknowledged it. Throws std::invalid_argument under
  /// another fan-out rule or with store-and-forward.
  void replicate_to(FanOut standby);
  /// Control path, before the shard runs: the shard is a standby's, fed by
  /// take_replica_st() until promote_st(). Allocates its assembly memory.
  void stand_by();
  /// Standby: one replica packet (replica.h) of the chunk at (key, offset)
  /// at `version`; false when dropped (counted: replica_dropped).
  bool take_replica_st(uint32_t key, uint32_t offset, uint32_t version, uint32_t tag,
                       std::span<const std::byte> payload);
  /// Standby: it serves from now on. A push of the version before a
  /// chunk's (its worker resends what the lost primary had not answered)
  /// is answered with the chunk, not aggregated again.
  void promote_st();
  /// Primary: the standby is lost; every update waiting for it goes out
  /// now, and later ones are no longer replicated.
  void standby_lost_st();
  /// Primary: a replica failed (the standby's transport peer is dead).
  /// Nothing goes out unreplicated until the node calls standby_lost_st()
  /// (once every worker knows the standby is lost): the updates wait.
  [[nodiscard]] bool standby_failed() const { return standby_failed_; }
  /// The newest version of the shard's chunks (a scan; control path).
  [[nodiscard]] uint32_t newest_version() const { return table_->version_range().second; }

  [[nodiscard]] const agg::ChunkTable& table() const { return *table_; }
  [[nodiscard]] const ShardCounters& counters() const { return counters_; }

  // agg::ChunkSink, called from inside contribute_st().
  void on_update(const agg::Update& u) override;
  void release(void* const* tokens, uint32_t count) override;

 private:
  // One slice an endpoint refused (or, asynchronous, that found no free
  // snapshot). Its bytes stay in the table: under BSP the chunk cannot move
  // on before this worker has had this version; asynchronous modes send the
  // chunk's newest version instead, which contains this one.
  struct Deferred {
    uint32_t key;
    uint32_t offset;
    uint32_t version;
    uint16_t rank;
    uint8_t priority;
    uint8_t yours;  // asynchronous: the update applied this rank's gradient
  };
  static_assert(sizeof(Deferred) == 16);
  bool send_st(uint16_t rank, const std::byte* data, uint32_t bytes, uint32_t key, uint32_t offset,
               uint32_t version, uint8_t priority, uint32_t tag = 0,
               const transport::Completion& done = {});
  void defer_st(const Deferred& d);
  // The backlog's oldest entry is gone (sent or lost).
  void pop_backlog_st();
  // Per (chunk, rank) tables (waiting_, owed_): the entry of `rank` for
  // the chunk at `offset` of `key`.
  [[nodiscard]] uint64_t pair_index(uint32_t key, uint32_t offset, uint16_t rank) const {
    return static_cast<uint64_t>(started_.index(key, offset)) * fanout_.size() + rank;
  }
  [[nodiscard]] uint64_t waiting_index(const Deferred& d) const {
    return pair_index(d.key, d.offset, d.rank);
  }
  void fanout_async_st(const agg::Update& u);
  // psplus: `rank` is owed the newest version of the chunk (one pending
  // copy per chunk and worker; a newer version merges into it).
  void owe_eager_st(uint16_t rank, uint32_t key, uint32_t offset);
  // Sends owed copies while each worker's window has room; the count sent.
  uint32_t send_eager_st();
  // Asynchronous: sends `rank` the chunk's newest version from a fresh
  // snapshot (a deferred copy, or with `eager` an owed one, counted in the
  // worker's window), tagged `yours` or not.
  enum class Newest : uint8_t { kSent, kNoSnapshot, kRefused };
  Newest send_newest_st(uint16_t rank, uint32_t key, uint32_t offset, uint8_t priority, bool yours,
                        bool eager);
  static void on_eager_sent(void* self, const transport::SendResult& r);
  // Hot standby (shard_replica.cpp): sends chunk `index`'s arrays from
  // `array` on; returns the first not queued (arrays_ when all were).
  uint32_t send_replica_st(uint64_t index, uint32_t array);
  static void on_replica_sent(void* self, const transport::SendResult& r);
  // The chunk's update to the workers, from the table (its gate opened).
  void release_chunk_st(uint64_t index);
  // Standby, promoted: a push the chunk is one version past, answered.
  void answer_again_st(uint16_t rank, uint32_t key, uint32_t offset);
  // keep_versions(): chunk `index` at `version`, if kept (else null).
  [[nodiscard]] const std::byte* kept_st(int64_t index, uint32_t version) const {
    if (index < 0 || kept_.empty()) return nullptr;
    const uint64_t slot = static_cast<uint64_t>(index) * 2 + (version & 1);
    return kept_version_[slot] == version ? kept_.data() + slot * chunk_bytes_ : nullptr;
  }
  // BSP: send every worker the chunk at `offset` of `key` from the table.
  void fanout_chunk_st(uint32_t key, uint32_t offset, uint32_t bytes, const std::byte* data,
                       uint32_t version, uint8_t priority);
  // Store-and-forward: hold u; when its unit is complete, send the unit.
  void hold_st(const agg::Update& u);
  // A free snapshot's index, or snapshot_count_ when every one is on the wire.
  uint64_t take_snapshot_st();
  static void on_snapshot_sent(void* self, const transport::SendResult& r);
  [[nodiscard]] std::byte* snapshot(uint64_t i) const {
    return snapshot_mem_.get() + i * chunk_bytes_;
  }

  const agg::Placement& placement_;
  std::vector<FanOut> fanout_;
  uint32_t chunk_bytes_;
  ShardCounters counters_;
  std::vector<Deferred> backlog_;  // a ring, allocated once
  uint64_t backlog_head_ = 0;
  uint64_t backlog_count_ = 0;
  StartedSets started_;
  Fanout rule_;
  uint32_t staleness_bound_ = 0;
  uint64_t snapshot_count_ = 0;
  uint64_t snapshot_cursor_ = 0;
  std::unique_ptr<std::byte[]> snapshot_mem_;
  // Sends of each snapshot not ended yet: set by the owner, dropped by the
  // endpoints' completions (any core); 0 = free.
  std::unique_ptr<std::atomic<uint32_t>[]> snapshot_refs_;
  // Store-and-forward: the unit in chunks (0: off); per chunk of the shard,
  // whether it has a held update, and at each unit's first chunk how many
  // of its chunks do.
  uint32_t unit_chunks_ = 0;
  std::vector<uint8_t> held_;
  std::vector<uint32_t> unit_held_;
  // Asynchronous: per (chunk, rank), the backlog entries waiting.
  std::vector<uint8_t> waiting_;
  // psplus, the eager pull (and in every asynchronous mode a joining
  // rank's first pull): per (chunk, rank), whether the worker is owed
  // the chunk's newest version; per rank, those chunks in the order they
  // became owed (a ring of `chunks` entries each), and how many copies to
  // it are on the wire (the endpoint's completions drop it, any core).
  struct Owed {
    uint32_t key;
    uint32_t offset;
  };
  // The eager copies on the wire to one worker, at most, per shard: enough
  // to keep a link busy for a few RTTs, few enough that the snapshots stay
  // free for the answers and that versions made meanwhile merge.
  static constexpr uint64_t kEagerWindowBytes = 1 << 20;
  // Their priority level, below every tensor's but those that share it (a
  // model with 64 priorities or more puts its last tensors there, where an
  // answer queues behind at most the window).
  static constexpr uint8_t kEagerLevel = sched::kPriorityLevels - 1;
  std::vector<uint8_t> owed_;
  std::vector<Owed> eager_ring_;
  std::vector<uint64_t> eager_head_, eager_count_;
  std::unique_ptr<std::atomic<uint32_t>[]> eager_out_;
  uint32_t eager_window_ = 0;  // copies on the wire per worker
  uint64_t eager_pending_ = 0;
  // SSP: the answers owed (fanout.h).
  SspAnswers ssp_;
  // The ranks still in the job (remove_rank_st; BSP wait: suspend_rank_st).
  uint64_t live_ = 0;
  // keep_versions(): per chunk, two slots of its bytes (version parity),
  // and the version each holds (UINT32_MAX: none).
  std::vector<std::byte> kept_;
  std::vector<uint32_t> kept_version_;
  // Hot standby. Primary: the standby (endpoint null: none, or lost), the
  // gates, and the chunks whose replica the endpoint refused (a ring of
  // chunk index << 2 | next array, one entry per chunk at most). Standby:
  // the assembly, and whether it serves (promoted).
  FanOut standby_{};
  ReplicaGates gates_;
  std::vector<uint64_t> replica_retry_;
  uint64_t replica_retry_head_ = 0, replica_retry_count_ = 0;
  uint32_t arrays_ = 1;          // 1 + the optimizer's state arrays
  bool standby_failed_ = false;  // a replica failed: no more are sent, the updates wait
  bool standing_by_ = false;
  bool promoted_ = false;
  ReplicaAssembly assembly_;
  // Staging credits: taken by the net core (its own counter), returned by
  // the shard's owner (one writer, relaxed: a stale read sees fewer returns,
  // so it can only underestimate the room).
  uint64_t staging_chunks_ = 0;
  alignas(64) uint64_t staging_taken_ = 0;
  alignas(64) std::atomic<uint64_t> staging_returned_{0};
  uint64_t marks_returned_ = 0;             // marked packets the table did not copy (owner)
  std::atomic<uint64_t> marks_done_{0};     // marked packets contributed (owner writes)
  BufferReleases releases_;                 // before table_: its destructor releases into it
  base::Owner owner_;                       // the shard's core
  base::Owner admission_;                   // the net core (staging credits)
  ShardSnapshot* snapshot_ = nullptr;       // background checkpoints (null: off)
  std::unique_ptr<agg::ChunkTable> table_;  // last: its destructor releases through this sink
};

}  // namespace mercury::server
