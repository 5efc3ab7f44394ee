// The admission signal of the server's flow control (docs/server.md, "Flow
// control"), published by the shard that owns the chunks: per chunk, one
// byte saying whether its current set holds a contribution, and from which
// rank last.
//
// What it is for. Over a port's limit, the net core admits a worker's
// gradient only if it joins a set that other ranks have started. The chunk
// table that knows belongs to the shard's core, so the shard publishes this
// view of it instead, and the net core reads only the view.
//
// The byte. 0: the set is empty. 1 + r: rank r's contribution is the last
// one taken into the set (others may be held too). A packet from rank r
// joins a started set if the byte is neither 0 nor 1 + r. When the byte is
// 1 + r, rank r's own contribution is in the set, so its packet is a copy
// (under BSP a rank's next contribution to a chunk needs this set's update),
// which refusing costs nothing.
//
// Threads and memory ordering. held_st() and cleared_st() belong to the
// shard's owner (the shard core, or the net core for an inline shard);
// others_started() may be called from any thread. Every access is relaxed:
//  * A stale read shows an older state of the same set, i.e. 0 or an
//    earlier holder, never a rank that is not held: under BSP a set
//    completes only with every rank's contribution, so while rank r's
//    packet is not in, no holder leaves. So a stale read can only refuse a
//    joining packet (its worker resends it), never admit a packet that
//    starts a set.
//  * The previous set's clear cannot be read stale: the owner clears the
//    byte in Shard::on_update, before the update goes to the workers
//    through Endpoint::send_slice, and the endpoint's ingress pairs that
//    enqueue (a release on the shard core) with the net core's drain (an
//    acquire) before the update is sent to rank r. Rank r's next packet for
//    the chunk is computed from that update, so it arrives after the
//    acquire, and the net core's read of the byte sees the clear or a later
//    store.
//
// Costs: the owner pays a key lookup, a multiply and a byte store per held
// contribution and per update; a reader the same lookup and multiply and one
// byte load. Memory: 1 B per chunk of the shard and 8 B per block of the
// job. Construction (control path) allocates and throws
// std::invalid_argument for a chunk_bytes that is not in [4, 65532].
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "agg/placement.h"
#include "base/owner.h"

namespace mercury::server {

class StartedSets {
 public:
  /// The chunks of the blocks `placement` gives `shard`, cut as the
  /// chunk table cuts them (chunk_bytes each, the last one shorter).
  StartedSets(const agg::Placement& placement, uint32_t shard, uint32_t chunk_bytes);

  /// The shard moved to another thread (Shard::hand_over).
  void hand_over() { owner_.hand_over(); }

  /// Owner: rank `rank`'s contribution to chunk (key, offset) was taken into its set.
  void held_st(uint32_t key, uint32_t offset, uint16_t rank) {
    MERCURY_OWNED(owner_);
    if (const int64_t i = index(key, offset); i >= 0) {
      view_[i].store(static_cast<uint8_t>(rank + 1), std::memory_order_relaxed);
    }
  }
  /// Owner: chunk (key, offset) has a new version (its set completed, or
  /// its initial values went out): its next set is empty. Before the
  /// update is sent (see above).
  void cleared_st(uint32_t key, uint32_t offset) {
    MERCURY_OWNED(owner_);
    if (const int64_t i = index(key, offset); i >= 0) {
      view_[i].store(0, std::memory_order_relaxed);
    }
  }
  /// Any thread: does chunk (key, offset)'s set hold the contribution of a
  /// rank other than `rank`? False for a chunk this shard does not have.
  [[nodiscard]] bool others_started(uint32_t key, uint32_t offset, uint16_t rank) const {
    const int64_t i = index(key, offset);
    if (i < 0) return false;
    const uint8_t v = view_[i].load(std::memory_order_relaxed);
    return v != 0 && v != static_cast<uint8_t>(rank + 1);
  }

  [[nodiscard]] uint64_t chunks() const { return chunks_; }

  /// The chunk's index among the shard's chunks, or -1 when (key, offset) is
  /// not a chunk of this shard. offset / chunk_bytes without a division
  /// instruction, as the chunk table does (exact for every 32-bit offset
  /// with magic = ceil(2^64 / chunk_bytes)). Any thread.
  [[nodiscard]] int64_t index(uint32_t key, uint32_t offset) const {
    if (key >= keys_.size()) return -1;
    const Key k = keys_[key];
    if (uint64_t{offset} * div_magic_ > div_magic_ - 1 || offset >= k.bytes) return -1;
    return k.first_chunk +
           static_cast<int64_t>((static_cast<unsigned __int128>(div_magic_) * offset) >> 64);
  }

 private:
  struct Key {
    uint32_t first_chunk = 0;
    uint32_t bytes = 0;  // 0: another shard's block
  };
  std::vector<Key> keys_;  // per block of the job
  uint64_t div_magic_;
  uint64_t chunks_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> view_;
  base::Owner owner_;  // the shard's owner
};

}  // namespace mercury::server
