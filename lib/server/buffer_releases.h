// Flow control's bookkeeping: the received buffers one thread gave back, per
// port of the node.
//
// A server node bounds, per port, the buffers its aggregation path owns
// (queued to a shard core or held by a chunk table): the net core counts
// what it hands over, and each thread that frees such buffers counts them
// here, by the port index the net core marked in each buffer before the
// hand over (net::BufferOps::set_mark). owned = handed - the sum of every
// releaser's freed(port), read by the net core (docs/server.md, "Flow
// control").
//
// Threads: free_st() belongs to one thread at a time (the shard's owner,
// then, after it stopped, the control path: hand_over()); freed() may be
// read from any thread. Each counter has that one writer, so it is bumped
// with a relaxed load and store, no read-modify-write; a reader may see an
// older value, i.e. fewer frees, which only overestimates what is owned.
// Costs: per buffer one counter bump and the port's free (two calls through
// net::BufferOps).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "agg/placement.h"
#include "base/owner.h"
#include "net/packet_port.h"

namespace mercury::server {

class BufferReleases {
 public:
  /// A node has at most one port per worker.
  static constexpr uint32_t kMaxPorts = agg::kMaxWorkers;

  /// `ops`: how to read a buffer's mark and free it (the node's ports' own).
  explicit BufferReleases(const net::BufferOps& ops) : ops_(&ops) {}

  /// Owner thread: frees `n` buffers (given as opaque tokens, as the chunk
  /// table hands them back) and counts each by its mark.
  void free_st(void* const* tokens, uint32_t n) {
    MERCURY_OWNED(owner_);
    for (uint32_t i = 0; i < n; ++i) {
      auto* b = static_cast<net::PacketBuf*>(tokens[i]);
      const uint16_t port = ops_->mark(b);  // before the free: the buffer may be reused at once
      if (port < freed_.size()) {
        freed_[port].store(freed_[port].load(std::memory_order_relaxed) + 1,
                           std::memory_order_relaxed);
      }
      ops_->free(b);
    }
  }
  void free_st(net::PacketBuf* b) {
    void* token = b;
    free_st(&token, 1);
  }
  /// Any thread: buffers of port `port` freed so far.
  [[nodiscard]] uint64_t freed(uint16_t port) const {
    return port < freed_.size() ? freed_[port].load(std::memory_order_relaxed) : 0;
  }
  /// The releasing thread changes (a stopped shard core's buffers freed by
  /// the control path).
  void hand_over() { owner_.hand_over(); }

 private:
  const net::BufferOps* ops_;
  std::array<std::atomic<uint64_t>, kMaxPorts> freed_{};
  base::Owner owner_;
};

}  // namespace mercury::server
