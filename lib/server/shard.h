// One shard of a parameter server: the chunk table of the blocks it owns
// (lib/agg) and the fan-out of every updated chunk to every worker.
//
// contribute_st() takes one worker's packet (one chunk of one block, as
// the transport accepted it) and gives it to the ChunkTable, which holds the
// mbuf until the chunk has every worker's contribution, then reduces them in
// rank order, applies the optimizer and calls back on_update(): the shard
// then submits the updated chunk to every worker as a slice of its block
// (Endpoint::send_slice: one payload, the shard's parameter memory, N
// headers), at the block's priority level. The mbufs go back to their
// pool as soon as the update is applied.
//
// Initial parameters: initialize_st() hands one chunk of rank 0's kInit
// packets to ChunkTable::initialize, which copies it and emits it at
// version 0; the fan-out is the same as for an update. A gradient of
// iteration 0 then produces version 1 (agg::BspPolicy: a chunk's version is
// the number of updates applied, initial values are version 0).
//
// Threads: a Shard belongs to one lcore (the server's net core when shards
// run inline, or its own shard core fed by a ring); contribute_st() runs
// there. The endpoints it sends through may belong to other lcores:
// send_slice() is lock-free from any thread. Construction is control path
// (allocates, may throw). Costs: see agg::ChunkTable; the fan-out is one
// descriptor submission per worker per chunk update.
//
// A slice an endpoint does not queue (descriptors or ingress exhausted) is
// kept in a bounded backlog and resubmitted by retry_fanout_st(), from the
// table's memory, so an undersized endpoint slows the fan-out down instead
// of losing an update (which would stall that chunk's BSP set for good).
//
// BSP keeps the update's bytes valid for its retransmissions: a chunk's next
// update needs every worker's next gradient, which no worker sends before it
// has received this update (docs/server.md). Asynchronous policies will need
// a copy per in-flight version.
//
// Flow control (docs/server.md) reads three things the shard publishes for
// other cores: every mbuf it frees (the table's releases, free_st), counted
// by port in releases(), which chunks' sets other ranks have started,
// in started() (server/started_sets.h: set when the table takes a
// contribution, cleared in on_update before the fan-out), and the staging
// credits it has given back (staging_room_st()).
#pragma once

#include <rte_mbuf.h>

#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/placement.h"
#include "server/counters.h"
#include "server/mbuf_releases.h"
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
  Shard(const agg::Placement& placement, const agg::ShardConfig& config,
        std::unique_ptr<agg::SyncPolicy> policy, std::vector<FanOut> fanout,
        uint64_t fanout_backlog = 0);

  /// One chunk of worker `rank`'s gradient. True when the table took the
  /// mbuf (it frees it later); false leaves the mbuf with the caller, also
  /// when the table took a copy. `copy`: the packet came with a staging
  /// credit (reserve_staging_st): the table copies it rather than hold the
  /// mbuf, and the credit comes back when the copy's set completes, or at
  /// once if no copy was made.
  bool contribute_st(uint16_t rank, uint32_t key, uint32_t offset, uint32_t iteration,
                     std::span<const std::byte> payload, rte_mbuf* mbuf, bool copy = false);
  bool contribute_st(uint16_t rank, const wire::HeaderFields& h, std::span<const std::byte> payload,
                     rte_mbuf* mbuf, bool copy = false) {
    return contribute_st(rank, h.block_key, h.offset, h.iteration, payload, mbuf, copy);
  }

  /// Staging credits (flow control, docs/server.md): one per staging chunk
  /// of the table. The node's net core takes one for each packet it marks
  /// `copy`, and only while staging_room_st() > 0, so a marked packet always
  /// finds a free staging chunk. Net core only.
  [[nodiscard]] uint64_t staging_room_st() const {
    const uint64_t out = staging_taken_ - staging_returned_.load(std::memory_order_relaxed);
    return staging_chunks_ > out ? staging_chunks_ - out : 0;
  }
  void reserve_staging_st() { ++staging_taken_; }
  /// The net core gives a credit back for a marked packet it never handed over.
  void unreserve_staging_st() { --staging_taken_; }
  /// Net core: marked packets handed over that the shard has not taken yet
  /// (queued to its shard core; 0 for an inline shard between packets).
  [[nodiscard]] uint64_t marks_in_flight_st() const {
    return staging_taken_ - marks_done_.load(std::memory_order_relaxed);
  }
  /// True when the table can stage every contribution a set may hold
  /// (chunks x (N - 1)): then a marked packet never holds an mbuf.
  [[nodiscard]] bool stages_every_set() const {
    return staging_chunks_ != 0 && staging_chunks_ == table_->chunks() * (table_->workers() - 1);
  }

  /// One chunk of rank 0's initial parameters (a kInit packet): adopted by
  /// the table (copied; the caller keeps the mbuf) and sent to every worker
  /// as version 0 of the chunk. False when refused (counted).
  bool initialize_st(uint32_t key, uint32_t offset, std::span<const std::byte> payload);

  /// Resubmits the slices an endpoint refused, oldest first, until one is
  /// refused again; returns how many went. Called by the shard's owner
  /// whenever fanout_pending() (the inline loop, or the shard core's).
  uint32_t retry_fanout_st();
  [[nodiscard]] bool fanout_pending() const { return backlog_count_ != 0; }

  /// The shard's owner: frees an mbuf of a packet handed to it that the
  /// table did not take (counted for flow control, as the table's releases).
  void free_st(rte_mbuf* m) { releases_.free_st(m); }
  /// Any thread: what the shard has freed, per DPDK port (flow control).
  [[nodiscard]] const MbufReleases& releases() const { return releases_; }
  /// Any thread: which chunks' sets hold a contribution (flow control).
  [[nodiscard]] const StartedSets& started() const { return started_; }

  [[nodiscard]] const agg::ChunkTable& table() const { return *table_; }
  [[nodiscard]] const ShardCounters& counters() const { return counters_; }

  // agg::ChunkSink, called from inside contribute_st().
  void on_update(const agg::Update& u) override;
  void release(void* const* tokens, uint32_t count) override;

 private:
  // One slice an endpoint refused. Its bytes stay in the table: under BSP
  // the chunk cannot move on before this worker has had this version.
  struct Deferred {
    uint32_t key;
    uint32_t offset;
    uint32_t version;
    uint16_t rank;
    uint8_t priority;
  };
  static_assert(sizeof(Deferred) == 16);
  bool send_st(uint16_t rank, const std::byte* data, uint32_t bytes, uint32_t key, uint32_t offset,
               uint32_t version, uint8_t priority);

  const agg::Placement& placement_;
  std::vector<FanOut> fanout_;
  uint32_t chunk_bytes_;
  ShardCounters counters_;
  std::vector<Deferred> backlog_;  // a ring, allocated once
  uint64_t backlog_head_ = 0;
  uint64_t backlog_count_ = 0;
  StartedSets started_;
  // Staging credits: taken by the net core (its own counter), returned by
  // the shard's owner (one writer, relaxed: a stale read sees fewer returns,
  // so it can only underestimate the room).
  uint64_t staging_chunks_ = 0;
  alignas(64) uint64_t staging_taken_ = 0;
  alignas(64) std::atomic<uint64_t> staging_returned_{0};
  uint64_t marks_returned_ = 0;             // marked packets the table did not copy (owner)
  std::atomic<uint64_t> marks_done_{0};     // marked packets contributed (owner writes)
  MbufReleases releases_;                   // before table_: its destructor releases into it
  std::unique_ptr<agg::ChunkTable> table_;  // last: its destructor releases through this sink
};

}  // namespace mercury::server
