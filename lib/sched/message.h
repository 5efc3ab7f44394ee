// Message descriptors and the pool they come from.
//
// A Message is what a producer (a trainer thread pushing a gradient, a shard
// core fanning out an aggregated chunk, the transport queuing a control
// message) hands to a PortScheduler whole: a pointer to bytes it keeps alive
// until the completion fires, their length, the destination peer and a
// priority. The scheduler never copies or reads the payload; it carves packets
// out of it lazily, so a descriptor costs the same 128 bytes whether the
// message is 0 bytes or 4 GiB.
//
// Layout: the first cache line holds what the producer writes and what the
// transport reads to build a header; the second holds state that only the
// port's TX core (the scheduler's single consumer) touches, except for two
// links: submit() writes the ingress link before publishing the message, and
// the pool writes its free-list link while the descriptor is free. The
// consumer never writes the first line, so once a message is queued the
// producer's line is only ever read.
//
// MessagePool is a fixed-capacity free list of descriptors. alloc() and free()
// may be called from any thread, including threads that the OS can preempt
// at any instruction (trainer threads, TBB workers): both are lock-free (a
// tagged Treiber stack; one CAS each, uncontended), so a preempted thread
// never stalls another. Cost: one cache-line CAS per call. The pool
// allocates its storage once at construction (control path) and never again.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "sched/huge_array.h"

namespace mercury::sched {

/// Number of priority levels; level 0 is the most urgent.
inline constexpr unsigned kPriorityLevels = 64;
/// Largest number of peers one PortScheduler serves (PeerMask width).
inline constexpr unsigned kMaxPeers = 256;

class PortScheduler;
class MessagePool;

/// One message queued whole: see the file comment. Producers fill the public
/// fields, then submit(); they must not touch the message again until its
/// completion has fired (or submit() returned false).
struct alignas(64) Message {
  // ---- cache line 0: written by the producer, read by scheduler/transport ----
  const std::byte* data = nullptr;  ///< payload; never read by the scheduler
  uint32_t len = 0;                 ///< payload bytes; 0 is allowed (one empty packet)
  uint16_t peer = 0;                ///< destination, < the scheduler's num_peers
  uint8_t priority = 0;             ///< 0 = most urgent, < kPriorityLevels
  // Opaque to the scheduler: the transport/server fill and read these.
  uint8_t type = 0;
  uint8_t dtype = 0;
  uint32_t block_key = 0;
  uint32_t iteration = 0;
  uint32_t param_version = 0;
  uint32_t msg_id = 0;
  /// A slice of a larger logical message (the transport's send_slice): the
  /// byte offset of `data` in it. Lives in what was padding before `cookie`.
  uint32_t base_offset = 0;
  uint64_t cookie = 0;  ///< handed back in the completion
  /// A slice: the logical message's length (0: not a slice). Like the other
  /// opaque fields, MessagePool::alloc() does not reset these two; whoever
  /// fills a descriptor sets them.
  uint32_t logical_len = 0;

 private:
  friend class PortScheduler;
  friend class MessagePool;

  // ---- cache line 1: private to the scheduler's consumer (the TX core) ----
  // `next_` is also the ingress link: the producer writes it before the
  // release CAS that publishes the message, and the consumer reads it after
  // the acquire exchange that takes the ingress list (port_scheduler_queue.cpp).
  alignas(64) Message* next_ = nullptr;  ///< intrusive FIFO link (ingress, data FIFO)
  Message* ready_next_ = nullptr;        ///< partition mode: link in the ready FIFO
  uint32_t carved_ = 0;                  ///< bytes carved so far (next packet's offset)
  uint32_t acked_ = 0;                   ///< bytes acknowledged so far
  uint32_t parts_started_ = 0;           ///< partition mode: start controls emitted
  uint32_t parts_ready_ = 0;             ///< partition mode: partitions made ready
  uint32_t parts_sent_ = 0;              ///< partition mode: partitions fully carved
  uint32_t parts_acked_ = 0;             ///< partition mode: partitions whose credit returned
  uint32_t rtx_queued_ = 0;              ///< retransmissions of it still queued
  uint8_t state_ = 0;                    ///< PortScheduler::MsgState
  /// A 0-byte message: its one (empty) packet was acknowledged or failed.
  /// acked_ >= len says nothing for it, as 0 >= 0 before any ack.
  uint8_t empty_acked_ = 0;
  // Touched only by MessagePool; atomic because a stale pop may read it while
  // its owner rewrites it (the tag check then rejects that pop).
  std::atomic<uint32_t> pool_next_{0};
};

static_assert(sizeof(Message) == 128, "a descriptor is two cache lines, whatever the message size");
static_assert(alignof(Message) == 64);

/// Fixed-capacity, lock-free pool of Message descriptors.
class MessagePool {
 public:
  /// Control path: allocates `capacity` descriptors. Throws std::invalid_argument
  /// if capacity is 0 or does not fit a 32-bit index.
  explicit MessagePool(uint32_t capacity);
  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;

  /// Any thread, lock-free. Returns a descriptor with every public field reset,
  /// or nullptr when the pool is empty (counted in alloc_failed()).
  Message* alloc();
  /// Any thread, lock-free. `msg` must come from this pool and be owned by the
  /// caller (not queued anywhere). Normally called by PortScheduler once the
  /// message is fully acknowledged.
  void free(Message* msg);

  uint32_t capacity() const { return capacity_; }
  /// True if `msg` points at one of this pool's descriptors.
  bool owns(const Message* msg) const;
  /// Times alloc() found the pool empty (relaxed; for telemetry).
  uint64_t alloc_failed() const { return alloc_failed_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  static uint64_t pack(uint32_t index, uint32_t tag) { return uint64_t{tag} << 32 | index; }

  HugeArray<Message> slots_;  // 16 MB for a server port: faulted in 2 MB pages
  uint32_t capacity_;
  // Free-list head: low 32 bits the index of the top descriptor (kNil when
  // empty), high 32 bits a tag bumped by every successful pop and push, so a
  // pop that read a head, was preempted while that descriptor was popped and
  // pushed back, and then retries its CAS fails instead of installing a stale
  // `next` (ABA). On its own line: it is the only word producers contend on.
  alignas(64) std::atomic<uint64_t> head_;
  alignas(64) std::atomic<uint64_t> alloc_failed_{0};
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
};

}  // namespace mercury::sched
