// PortScheduler: the per-port packet scheduler, strict priority at packet
// granularity, with the classical baselines as modes of the same code.
//
// What it is for. Producers queue whole messages (a gradient push, an
// aggregated chunk, a control message); the port's TX core asks, packet by
// packet, "what goes next?". In `strict` mode (Mercury) the answer is always a
// packet of the most urgent message in the send buffer: a newly queued urgent
// message preempts a 256 MiB backlog at the next packet boundary, with no
// partitioning and no knobs. `fifo` (classical PS, ps-lite) and `partition`
// (P3 / ByteScheduler: partitions of S bytes, a start-up exchange per
// partition, a credit of C bytes) are kept as modes for side-by-side
// comparison. docs/sched.md derives the head-of-line bound and gives costs.
//
// Threads. One consumer, many producers:
//  * submit() may be called from any thread, preemptible ones included; it is
//    lock-free (one fetch_add and one CAS), never blocks, never allocates, and
//    returns false when the ingress is full or the message is invalid.
//  * every function ending in `_st` is for the single consumer thread (the
//    port's TX core) only; builds with owner checks assert that one thread
//    calls them all (base/owner.h), handed over only by hand_over_consumer().
//  * the constructor is control path: it allocates and may throw.
//
// Costs (consumer). drain_ingress_st(): O(messages drained), one atomic
// exchange. next_slice_st(): O(1) — a 64-bit bitmap of non-empty levels and,
// per level, a 256-bit bitmap of peers with work; it scans at most the
// non-empty levels whose queued peers are all ineligible (<= 64 word tests).
// next_slices_st(): that pick once per run of slices from one message, then a
// few stores per slice (the per-packet path of a TX burst). requeue_st(),
// on_acked_st(), partition_ready_st(): O(1). Memory: a fixed 128-byte
// descriptor per message whatever its size, plus tables sized at
// construction (64 levels x num_peers queue heads, max_retransmits slots).
//
// One class, several files, one concern each: port_scheduler.cpp (set-up,
// acknowledgement, completion, release), port_scheduler_levels.cpp (the
// LevelTable queues and bitmaps), port_scheduler_queue.cpp (ingress and the
// retransmission queue), port_scheduler_carve.cpp (picking and carving
// slices, one at a time or a burst), port_scheduler_partition.cpp (the
// partition baseline's start-ups and credit).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "base/owner.h"
#include "sched/message.h"
#include "sched/peer_mask.h"

namespace mercury::sched {

/// Scheduling discipline, chosen at construction (`network.scheduler`).
enum class Mode : uint8_t {
  kStrict,     ///< Mercury: most urgent level first, preempting at every packet boundary
  kFifo,       ///< classical PS: whole messages in arrival order per peer, priority ignored
  kPartition,  ///< P3/ByteScheduler: S-byte partitions by priority, credit C, start-up per
               ///< partition
};

/// "strict" | "fifo" | "partition" -> Mode; nullopt for anything else.
std::optional<Mode> parse_mode(std::string_view name);
std::string_view to_string(Mode mode);

enum class SliceKind : uint8_t {
  kData,            ///< bytes [offset, offset+len) of msg
  kPartitionStart,  ///< partition mode: start-up control for the partition at offset; len 0
};

/// One packet's worth of a message, as chosen by next_slice_st().
struct Slice {
  Message* msg = nullptr;
  uint32_t offset = 0;
  uint32_t len = 0;
  bool retransmit = false;  ///< came from requeue_st()
  SliceKind kind = SliceKind::kData;
  /// msg->peer, set by the scheduler on every slice it returns (requeue_st()
  /// ignores it), so a transport walking a burst need not load the message's
  /// line for it. Fits the padding: a Slice stays 24 bytes.
  uint16_t peer = 0;
};
static_assert(sizeof(Slice) == 24);

struct SchedulerConfig {
  Mode mode = Mode::kStrict;
  uint16_t num_peers = 1;              ///< 1..kMaxPeers; Message::peer must be below it
  uint32_t ingress_capacity = 4096;    ///< messages submitted and not yet drained
  uint32_t max_retransmits = 4096;     ///< requeued slices waiting; >= sum of peer windows
  uint32_t partition_bytes = 4 << 20;  ///< partition mode: S, bytes per partition (> 0)
  uint32_t credit_bytes = 8 << 20;     ///< partition mode: C >= S, bytes started and not acked
};

/// Called on the consumer thread when a message is fully acknowledged, just
/// before its descriptor returns to the pool. Must not block; must not touch
/// `msg` after returning. `cookie` and the other public fields are intact.
using CompletionFn = void (*)(void* context, const Message& msg);

struct SchedulerStats {
  // Producer side (relaxed atomics, incremented on failures only).
  uint64_t submit_full = 0;     ///< submit() refused: ingress_capacity reached
  uint64_t submit_invalid = 0;  ///< submit() refused: null, priority >= 64 or peer >= num_peers
  // Consumer side.
  uint64_t drained = 0;             ///< messages moved from ingress into the queues
  uint64_t data_slices = 0;         ///< new data slices carved
  uint64_t retransmit_slices = 0;   ///< requeued slices sent again
  uint64_t partition_starts = 0;    ///< kPartitionStart slices emitted
  uint64_t released = 0;            ///< messages completed and returned to the pool
  uint64_t requeue_full = 0;        ///< requeue_st() refused: max_retransmits slots in use
  uint64_t requeue_invalid = 0;     ///< requeue_st() refused: message not held by the scheduler
  uint64_t retransmit_skipped = 0;  ///< queued retransmission dropped: message already fully acked
  uint64_t release_refused = 0;     ///< release_st() refused: message still queued
};

class PortScheduler {
 public:
  /// Control path: the consumer thread has stopped; the next thread to call
  /// an _st function is the consumer from now on.
  void hand_over_consumer() { consumer_.hand_over(); }

  /// Control path. `pool` receives descriptors back when messages complete and
  /// must outlive the scheduler. Throws std::invalid_argument on a bad config.
  PortScheduler(const SchedulerConfig& config, MessagePool& pool,
                CompletionFn on_complete = nullptr, void* context = nullptr);
  PortScheduler(const PortScheduler&) = delete;
  PortScheduler& operator=(const PortScheduler&) = delete;

  /// Any thread, lock-free, never blocks. Queues `msg` whole. Returns false
  /// (and counts why) if the ingress holds ingress_capacity messages already,
  /// or if msg is null, msg->priority >= kPriorityLevels or msg->peer >=
  /// num_peers; the caller still owns msg then and may retry or report
  /// back-pressure. On true the scheduler owns msg until its completion.
  bool submit(Message* msg);

  /// Consumer. Moves every submitted message into the per-level, per-peer
  /// FIFOs in submission order. Returns how many moved. Call once per TX burst,
  /// before carving it: the head-of-line bound counts on that.
  size_t drain_ingress_st();

  /// Consumer. Picks the next packet for a peer in `eligible`: requeued
  /// retransmissions before new data of their level; the most urgent level
  /// first (strict); round-robin across peers within a level; FIFO within
  /// (level, peer). Data slices are at most max_payload bytes. A message whose
  /// last byte is carved leaves the queues; the caller keeps it referenced
  /// until on_acked_st() has released it. Returns false if nothing is eligible
  /// (or max_payload is 0).
  bool next_slice_st(const PeerMask& eligible, uint32_t max_payload, Slice& out);

  /// Consumer, burst form of next_slice_st(): carves up to n slices into
  /// out[0..n) and returns how many. The sequence is exactly what n calls of
  /// next_slice_st() with the same arguments would return (and the scheduler
  /// ends in the same state), but the level and peer are picked once per run
  /// of slices from one message and re-picked only when that message (or, in
  /// partition mode, its current partition) ends, when round-robin moves to
  /// another peer (several eligible peers with work at the level), or when a
  /// peer's room runs out. A more urgent level cannot become non-empty inside
  /// one call: only drain_ingress_st() and requeue_st() add work, and neither
  /// runs during it; call drain_ingress_st() before each burst, as for
  /// next_slice_st(). Returns 0 if nothing is eligible or max_payload is 0.
  size_t next_slices_st(const PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n);

  /// As above, with a packet budget per peer, for a transport whose peers have
  /// windows: room[p] is how many more packets peer p may take (every peer in
  /// `eligible` must have room[p] >= 1; room is indexed by peer, num_peers
  /// entries). Each slice handed out (data, retransmission or start-up
  /// control) takes one from its peer's room, and a peer whose room reaches 0
  /// is removed from `eligible` — exactly the loop "next_slice_st(); if the
  /// peer's window is now full, eligible.reset(peer)" in docs/sched.md.
  size_t next_slices_st(PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                        uint32_t* room);

  /// Consumer. Queues `slice` (returned earlier by next_slice_st and not yet
  /// acknowledged) to be sent again, ahead of new data of its message's level
  /// (strict) or of all new data (fifo, partition: the retransmission belongs
  /// to the transport under them). Returns false if max_retransmits slices are
  /// already waiting (requeue_full) or slice.msg is not held by this scheduler
  /// (requeue_invalid); the caller keeps the slice and retries later.
  bool requeue_st(const Slice& slice);

  /// Consumer, partition mode. The start-up exchange of msg's oldest started,
  /// not-yet-ready partition has completed: its bytes may now be carved.
  /// Readiness is granted in start order per message, so call it once per
  /// start-up control, on its first acknowledgement (a resent control's ack
  /// must not call it again). No-op in other modes or when msg has no
  /// partition waiting.
  void partition_ready_st(Message* msg);

  /// Consumer. `bytes` of msg's carved data were acknowledged for the first
  /// time (0 for a 0-byte message). Bytes are summed, so a transport that
  /// receives an ACK covering several packets of one message (a burst) adds up
  /// their payload bytes and calls this once per message per ACK, not once
  /// per packet. In
  /// partition mode a partition's credit returns when its last byte is acked.
  /// When every byte is acked and nothing of msg is still queued, the message
  /// completes: the completion runs and the descriptor returns to the pool.
  /// Returns true if msg was released (the caller must forget it).
  bool on_acked_st(Message* msg, uint32_t bytes);

  /// Consumer. Completes msg now (completion, then back to the pool) without
  /// waiting for acks, e.g. when the transport gives up on its peer. Refused
  /// (false, release_refused) while any part of msg is still queued.
  bool release_st(Message* msg);

  /// Consumer. True if a message or retransmission is queued (ingress excluded).
  bool has_work_st() const;
  /// Consumer. Partition mode: bytes of started partitions not yet acknowledged.
  uint64_t credit_in_use_st() const { return credit_used_; }
  /// Consumer (producer counters are read with relaxed loads).
  SchedulerStats stats_st() const;

  Mode mode() const { return config_.mode; }
  const SchedulerConfig& config() const { return config_; }

 private:
  enum MsgState : uint8_t { kIdle = 0, kQueued = 1, kCarved = 2 };
  static constexpr uint32_t kNil = UINT32_MAX;
  // Peers one next_slices_st() run carves in rotation; more take more runs.
  static constexpr unsigned kMaxLanes = 32;

  struct PeerQueue {
    Message* head = nullptr;
    Message* tail = nullptr;
    uint32_t rtx_head = kNil;
    uint32_t rtx_tail = kNil;
  };
  struct RetransmitSlot {
    Slice slice;
    uint32_t next = kNil;
  };
  struct Pick {
    unsigned level;
    unsigned peer;
    bool retransmit;
  };

  // Levels x peers of intrusive message FIFOs (linked through `link`) and
  // retransmission FIFOs, with the bitmaps that make picking O(1).
  class LevelTable {
   public:
    LevelTable(unsigned num_peers, Message* Message::*link);
    std::optional<Pick> pick(const PeerMask& eligible) const;
    void commit(const Pick& pick) { cursor_[pick.level] = static_cast<uint16_t>(pick.peer); }
    void push_message(unsigned level, Message* msg);
    Message* head(unsigned level, unsigned peer) const { return at(level, peer).head; }
    void pop_message(unsigned level, unsigned peer);
    void push_retransmit(unsigned level, unsigned peer, uint32_t slot,
                         std::vector<RetransmitSlot>& slots);
    uint32_t pop_retransmit(unsigned level, unsigned peer, std::vector<RetransmitSlot>& slots);
    bool empty() const { return active_ == 0; }
    /// True if `peer` is the only eligible peer with messages at `level`.
    bool sole_data_peer(unsigned level, unsigned peer, const PeerMask& eligible) const;
    /// The eligible peers with messages at `level` in the order round-robin
    /// serves them, starting at `first`: at most `max` into peers[]. Returns
    /// how many; `all` tells whether that is every such peer.
    unsigned rotation(unsigned level, unsigned first, const PeerMask& eligible, uint16_t* peers,
                      unsigned max, bool& all) const;

   private:
    PeerQueue& at(unsigned level, unsigned peer) { return queues_[level * num_peers_ + peer]; }
    const PeerQueue& at(unsigned level, unsigned peer) const {
      return queues_[level * num_peers_ + peer];
    }
    void refresh(unsigned level);
    int round_robin(const PeerMask& work, const PeerMask& eligible, unsigned level) const;

    uint64_t active_ = 0;      // bit l: level l has data or retransmissions queued
    uint64_t rtx_levels_ = 0;  // bit l: level l has retransmissions queued
    unsigned num_peers_;
    unsigned num_words_;  // PeerMask words that can hold a peer: ceil(num_peers / 64)
    Message* Message::*link_;
    std::vector<PeerMask> data_peers_;  // [level]: peers with messages queued
    std::vector<PeerMask> rtx_peers_;   // [level]: peers with retransmissions queued
    std::vector<uint16_t> cursor_;      // [level]: peer served last (round-robin)
    std::vector<PeerQueue> queues_;     // [level * num_peers + peer]
  };

  // port_scheduler.cpp.
  bool try_release(Message* msg);
  /// Every byte of msg acknowledged (or failed); for a 0-byte message, its
  /// empty packet.
  static bool all_acked(const Message& msg) {
    return msg.len == 0 ? msg.empty_acked_ != 0 : msg.acked_ >= msg.len;
  }
  // port_scheduler_queue.cpp.
  unsigned tx_level(const Message& msg) const;
  bool take_retransmit(const Pick& pick, Slice& out);
  // port_scheduler_carve.cpp.
  void carve(const Pick& pick, uint32_t max_payload, Slice& out);
  template <bool kRoom>
  size_t carve_burst(PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                     uint32_t* room);
  template <bool kRoom>
  size_t carve_run(const Pick& pick, PeerMask& eligible, uint32_t max_payload, Slice* out, size_t n,
                   uint32_t* room);
  // port_scheduler_partition.cpp.
  uint32_t partitions(const Message& msg) const;
  uint64_t partition_end(const Message& msg, uint32_t k) const;
  uint64_t partition_size(const Message& msg, uint32_t k) const;
  bool start_partition(const PeerMask& eligible, Slice& out);

  SchedulerConfig config_;
  MessagePool& pool_;
  CompletionFn on_complete_;
  void* context_;

  // Producer-shared words on their own line: every submit() touches both.
  struct alignas(64) Ingress {
    std::atomic<Message*> head{nullptr};  // Treiber stack, newest first
    std::atomic<uint32_t> count{0};       // submitted and not yet drained (upper bound)
  } ingress_;
  struct alignas(64) ProducerCounters {
    std::atomic<uint64_t> full{0};
    std::atomic<uint64_t> invalid{0};
  } producer_stats_;

  // Consumer-owned from here on.
  alignas(64) LevelTable tx_;  // what may be carved now (plus retransmissions)
  LevelTable pending_;         // partition mode: messages with partitions not yet started
  std::vector<RetransmitSlot> rtx_slots_;
  uint32_t rtx_free_ = kNil;  // free list of rtx_slots_, linked through next
  uint64_t credit_used_ = 0;
  SchedulerStats stats_{};
  base::Owner consumer_;  // the one _st thread (asserted: base/owner.h)
};

}  // namespace mercury::sched
