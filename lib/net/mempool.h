// RAII for DPDK packet-buffer pools and rings.
//
// Control path: constructors throw std::runtime_error naming the object and
// DPDK's reason; destructors free. The objects themselves are then used from
// the datapath through the raw pointers get() returns (mbuf alloc/free and
// ring enqueue/dequeue are lock-free and per-core cached in DPDK).
#pragma once

#include <cstdint>
#include <string>

struct rte_mempool;
struct rte_ring;

namespace mercury::net {

/// A pool of packet mbufs, each able to hold one frame of `frame_bytes`
/// (plus DPDK's headroom) in a single segment.
class Mempool {
 public:
  Mempool(const std::string& name, uint32_t mbufs, uint32_t cache, uint32_t frame_bytes,
          int socket = -1);
  ~Mempool();
  Mempool(Mempool&& o) noexcept : pool_(o.pool_) { o.pool_ = nullptr; }
  Mempool& operator=(Mempool&&) = delete;
  Mempool(const Mempool&) = delete;

  [[nodiscard]] rte_mempool* get() const { return pool_; }
  /// mbufs currently free in the pool (cache included): for leak checks.
  [[nodiscard]] uint32_t available() const;

 private:
  rte_mempool* pool_ = nullptr;
};

/// An rte_ring of pointers. `flags` are RING_F_* (e.g. single producer).
class Ring {
 public:
  Ring(const std::string& name, uint32_t count, unsigned flags, int socket = -1);
  ~Ring();
  Ring(Ring&& o) noexcept : ring_(o.ring_) { o.ring_ = nullptr; }
  Ring& operator=(Ring&&) = delete;
  Ring(const Ring&) = delete;
  [[nodiscard]] rte_ring* get() const { return ring_; }

 private:
  rte_ring* ring_ = nullptr;
};

/// Data room an mbuf needs to hold a frame of the given IP MTU unsegmented.
uint32_t frame_bytes_for_mtu(uint32_t mtu);

}  // namespace mercury::net
