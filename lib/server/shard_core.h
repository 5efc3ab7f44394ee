// A shard core: one EAL lcore running one Shard on a node::Loop, fed by the
// server's net core through a single-producer / single-consumer ring
// (node::SpscRing; docs/architecture.md,
// "Threads and ownership": a dispatch ring; DPDK's flow steering is not
// available on the vdevs this project runs on, so the dispatch-core path is
// the one that runs).
//
// What crosses the ring. One ShardItem (32 bytes) per accepted packet: the
// buffer, where its payload starts, and the parsed fields the chunk table needs
// (key, offset, iteration, rank, gradient or initial values); and the
// control path's tasks (settings, checkpoints: shard_task.h), which run
// between the packets before and after them. The net core
// has already handed the packet to the transport's acknowledgement state, so
// an item must never be refused: the ring has room for every buffer of the
// node's RX pools (ServerNodeConfig::shard_core.ring_entries), hence it cannot
// fill up. The shard core then calls Shard::contribute_st (or initialize_st)
// exactly as the net core does when shards run inline, and frees the buffers
// the table did not take (Shard::free_st, counted for flow control). The
// fan-out goes straight from the shard core through Endpoint::send_slice
// (lock-free from any thread).
//
// Threads. The constructor and stop() are control path and run on the EAL
// main lcore (EAL's rule for launching an lcore); attach() is called once, by the
// net core, to hand over the shard when the placement exists (a release store
// the shard core's acquire load pairs with). enqueue_st() belongs to the net
// core (the ring's single producer, asserted). Everything else runs on the
// shard core's loop,
// which publishes its counters after every burst with relaxed stores (each
// field has one writer and is read as a monotonic value), so stats() may be
// read from any thread.
//
// Idle policy: the loop's, with ShardCoreOptions::idle (the node's poll
// mode: busy for a dedicated core, adaptive where CPUs are shared).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "agg/chunk_table.h"
#include "base/published.h"
#include "net/packet_port.h"
#include "node/idle.h"
#include "node/loop.h"
#include "node/spsc_ring.h"
#include "server/shard.h"

namespace mercury::server {

/// One packet for a shard core, or a task (shard_task.h).
struct ShardItem {
  enum Kind : uint8_t {
    kGradient = 0,  ///< a gradient (kData)
    kInit = 1,      ///< rank 0's initial values (kInit)
    kTask = 2,      ///< `task`: settings or checkpoint work; no packet
  };
  union {
    net::PacketBuf* buf;  ///< kGradient, kInit
    ShardTask* task;      ///< kTask: the net core's, until it is done
  };
  uint32_t key;
  uint32_t offset;
  uint32_t iteration;
  uint16_t payload_at;  ///< payload start, in bytes from net::BufferOps::data(buf)
  uint16_t payload_len;
  uint16_t rank;
  uint8_t kind;    ///< a Kind
  uint8_t copy;    ///< 1: a gradient with a staging credit (Shard::contribute_st's `copy`)
  uint32_t clock;  ///< the push's wire param_version (asynchronous modes' clock)
};
static_assert(sizeof(ShardItem) == 32);

struct ShardCoreOptions {
  uint32_t ring_entries = 1 << 14;  ///< at least the buffers of every RX pool feeding the node
  node::IdleOptions idle;           ///< the loop's idle policy (node/idle.h)
};

/// What a shard core has done, as last published.
struct ShardStats {
  ShardCounters shard;
  agg::ChunkTableCounters table;
  uint64_t held = 0;   ///< contributions the table holds
  uint64_t items = 0;  ///< ring items processed
  uint64_t sleeps = 0;
};

class ShardCore {
 public:
  /// Creates the ring and launches `lcore` (an enabled, idle worker lcore;
  /// the caller runs on the main lcore). `buffers`: the node's ports' buffer
  /// functions (where a payload starts). Throws std::invalid_argument or
  /// std::runtime_error naming the lcore.
  ShardCore(unsigned lcore, uint32_t shard_id, const ShardCoreOptions& options,
            const net::BufferOps& buffers);
  ~ShardCore();
  ShardCore(const ShardCore&) = delete;
  ShardCore& operator=(const ShardCore&) = delete;

  /// Net core, once: the shard this core runs from now on (outlives stop()).
  void attach(Shard* shard) { shard_.store(shard, std::memory_order_release); }

  /// Net core: queues `n` items; returns how many went in (all, when the
  /// ring is sized as above).
  uint32_t enqueue_st(const ShardItem* items, uint32_t n);

  /// Control path, main lcore: stops the loop, waits for the lcore and
  /// frees the buffers of items still in the ring (a task still there is
  /// done, failed). Idempotent.
  void stop();

  [[nodiscard]] unsigned lcore() const { return lcore_; }
  /// Any thread: the counters as last published (exact after stop()).
  [[nodiscard]] ShardStats stats() const;

 private:
  class Consumer;  // the ring's consumer, the loop's poller
  static int main(void* self);
  void run();
  // One pass of the shard core's loop: the backlog, then a burst of the ring.
  uint32_t poll_st();
  void publish(const Shard& shard);

  // Fields the net core and the shard core both touch, then the published
  // counters on lines of their own.
  node::SpscRing<ShardItem> ring_;
  const net::BufferOps* buffers_;
  unsigned lcore_;
  uint32_t shard_id_;
  ShardCoreOptions options_;
  bool launched_ = false;
  alignas(64) std::atomic<Shard*> shard_{nullptr};
  std::atomic<bool> stop_{false};
  // The shard core's own (then, after stop(), the control path's).
  uint64_t items_ = 0;
  uint64_t sleeps_ = 0;               // as of the end of the core's loop
  const node::Loop* loop_ = nullptr;  // while it runs
  alignas(64) base::Published<ShardStats> published_;
};

}  // namespace mercury::server
