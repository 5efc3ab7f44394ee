// RAII for DPDK packet-buffer pools and rings.
//
// Control path: constructors throw std::runtime_error naming the object and
// DPDK's reason; destructors free. The objects themselves are then used from
// the datapath through the raw pointers get() returns (mbuf alloc/free and
// ring enqueue/dequeue are lock-free and per-core cached in DPDK).
#pragma once

#include <array>
#include <cstdint>
#include <span>
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

/// RTE_MAX_LCORE of the DPDK built against (checked in mempool.cpp).
inline constexpr uint32_t kMaxLcores = 128;

/// The lcores whose mempool caches can hold objects: those EAL has given a role
/// (an EAL thread, a registered thread, a service core), as of the last refresh().
/// Reading the roles costs a call per possible lcore: refresh() on a slow path.
class CacheLcores {
 public:
  CacheLcores() { refresh(); }
  void refresh();
  [[nodiscard]] std::span<const uint16_t> ids() const { return {ids_.data(), n_}; }

 private:
  std::array<uint16_t, kMaxLcores> ids_{};
  uint32_t n_ = 0;
};

/// The free objects of `pool`: its common store and the caches of `lcores`, what
/// rte_mempool_avail_count() says when `lcores` is current. That one adds up all
/// RTE_MAX_LCORE caches, each several KiB from the next (a cache and TLB miss
/// apiece): read every 16 passes of a net core for the transport's credit
/// (transport::Endpoint::run_timers_st), it took 1.8 % of a whole job's CPU samples
/// (AlexNet's trace at 10 Gbit/s, perf -e cpu-clock), this sum 0.15 %.
[[nodiscard]] uint32_t pool_free(const rte_mempool* pool, const CacheLcores& lcores);

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
