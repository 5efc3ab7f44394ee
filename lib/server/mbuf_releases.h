// Flow control's bookkeeping: the mbufs one thread gave back, per DPDK port.
//
// A server node bounds, per port, the mbufs its aggregation path owns
// (queued to a shard core or held by a chunk table): the net core counts
// what it hands over, and each thread that frees such mbufs counts them
// here, by the port in mbuf->port (the net core writes it before the hand
// over: some PMDs, net_ring among them, leave it unset). owned = handed -
// the sum of every releaser's freed(port), read by the net core
// (docs/server.md, "Flow control").
//
// Threads: free_st() belongs to one thread at a time (the shard's owner,
// then, after it stopped, the control path); freed() may be read from any
// thread. Each counter has that one writer, so it is bumped with a relaxed
// load and store, no read-modify-write; a reader may see an older value,
// i.e. fewer frees, which only overestimates what is owned. Costs: one
// counter bump and one rte_pktmbuf_free per mbuf.
#pragma once

#include <rte_build_config.h>
#include <rte_mbuf.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace mercury::server {

class MbufReleases {
 public:
  /// Owner thread: frees `n` mbufs (given as opaque tokens, as the chunk
  /// table hands them back) and counts each by its mbuf->port.
  void free_st(void* const* tokens, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      auto* m = static_cast<rte_mbuf*>(tokens[i]);
      const uint16_t port = m->port;  // before the free: the mbuf may be reused at once
      if (port < freed_.size()) {
        freed_[port].store(freed_[port].load(std::memory_order_relaxed) + 1,
                           std::memory_order_relaxed);
      }
      rte_pktmbuf_free(m);
    }
  }
  void free_st(rte_mbuf* m) {
    void* token = m;
    free_st(&token, 1);
  }
  /// Any thread: mbufs of DPDK port `port` freed so far.
  [[nodiscard]] uint64_t freed(uint16_t port) const {
    return port < freed_.size() ? freed_[port].load(std::memory_order_relaxed) : 0;
  }

 private:
  std::array<std::atomic<uint64_t>, RTE_MAX_ETHPORTS> freed_{};
};

}  // namespace mercury::server
