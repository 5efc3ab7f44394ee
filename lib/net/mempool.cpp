#include "net/mempool.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ether.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include <rte_memzone.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

namespace mercury::net {

uint32_t frame_bytes_for_mtu(uint32_t mtu) {
  // Ethernet header + a VLAN tag of slack + the FCS some PMDs keep + up to 63
  // bytes the send path skips to align the payload (Interface::kPayloadAlignPad),
  // and never less than DPDK's default data room, which some PMDs require of
  // every RX mbuf whatever the MTU (net_af_packet wants 2016 bytes).
  const uint32_t need = mtu + RTE_ETHER_HDR_LEN + 4 + RTE_ETHER_CRC_LEN + 64;
  return need > RTE_MBUF_DEFAULT_DATAROOM ? need : RTE_MBUF_DEFAULT_DATAROOM;
}

namespace {

// Faults in [addr, addr + len) for writing: one MADV_POPULATE_WRITE where
// the kernel has it (Linux 5.14), else a write to every page.
void populate_pages(void* addr, size_t len) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(addr) + len;
#ifdef MADV_POPULATE_WRITE
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  auto* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < len; off += page) p[off] = p[off];
}

void free_zone(rte_mempool_memhdr*, void* zone) {
  rte_memzone_free(static_cast<const rte_memzone*>(zone));
}

// Bytes of one zone that holds `count` objects of `object_bytes` as DPDK lays
// them out without hugepages: an object no larger than a page never straddles
// two (the pool wants each IOVA-contiguous, and DPDK counts only a page as
// such there), so a page holds page / object_bytes of them; larger objects
// run on across pages.
size_t zone_bytes(size_t object_bytes, uint32_t count, size_t page) {
  if (object_bytes > page) return object_bytes * count;
  const size_t per_page = page / object_bytes;
  return (count + per_page - 1) / per_page * page;
}

// rte_pktmbuf_pool_create, with every page of the pool's memory faulted in
// before the first mbuf header is written. Without hugepages the kernel
// would otherwise fault in (and zero) each 4 KiB page on its first write:
// the headers' pages while the pool is built, the data rooms' the first time
// each mbuf carries a frame (a fifth of a server's time in a job's first
// rounds). Page by page that is a trap per page, 0.3 s for a 38 MB pool on
// a virtual machine where each is a trip to the hypervisor; one
// MADV_POPULATE_WRITE over the whole zone takes a tenth of that. With
// hugepages (reserved up front, a fault per 2 MiB) DPDK's own creation.
// Where the zone cannot be had in one IOVA-contiguous piece, or held fewer
// objects than counted, DPDK's own population adds the rest, faulted in
// afterwards.
rte_mempool* create_populated(const std::string& name, uint32_t mbufs, uint32_t cache,
                              uint16_t data_room, int socket) {
  if (rte_eal_has_hugepages()) {
    return rte_pktmbuf_pool_create(name.c_str(), mbufs, cache, 0, data_room, socket);
  }
  const uint32_t elt_size = sizeof(rte_mbuf) + data_room;
  rte_mempool* mp = rte_mempool_create_empty(name.c_str(), mbufs, elt_size, cache,
                                             sizeof(rte_pktmbuf_pool_private), socket, 0);
  if (mp == nullptr) return nullptr;
  if (rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), nullptr) != 0) {
    rte_mempool_free(mp);
    return nullptr;
  }
  rte_pktmbuf_pool_private priv{};
  priv.mbuf_data_room_size = data_room;
  rte_pktmbuf_pool_init(mp, &priv);

  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len =
      zone_bytes(rte_mempool_calc_obj_size(elt_size, mp->flags, nullptr), mbufs, page);
  const std::string zone_name = RTE_MEMPOOL_MZ_PREFIX + name + "_0";
  const rte_memzone* zone = rte_memzone_reserve_aligned(
      zone_name.c_str(), len, socket, RTE_MEMZONE_IOVA_CONTIG, static_cast<unsigned>(page));
  if (zone != nullptr) {
    populate_pages(zone->addr, zone->len);
    const int added =
        rte_mempool_populate_iova(mp, static_cast<char*>(zone->addr), zone->iova, zone->len,
                                  free_zone, const_cast<rte_memzone*>(zone));
    if (added <= 0) rte_memzone_free(zone);  // not the pool's: it took no objects
  }
  if (mp->populated_size < mbufs) {
    if (rte_mempool_populate_default(mp) < 0) {
      rte_mempool_free(mp);
      return nullptr;
    }
    rte_mempool_mem_iter(
        mp,
        [](rte_mempool*, void*, rte_mempool_memhdr* h, unsigned) {
          populate_pages(h->addr, h->len);
        },
        nullptr);
  }
  rte_mempool_obj_iter(mp, rte_pktmbuf_init, nullptr);
  return mp;
}

}  // namespace

Mempool::Mempool(const std::string& name, uint32_t mbufs, uint32_t cache, uint32_t frame_bytes,
                 int socket) {
  const uint32_t data_room = RTE_PKTMBUF_HEADROOM + frame_bytes;
  if (data_room > UINT16_MAX) {
    throw std::runtime_error("mempool " + name + ": frames of " + std::to_string(frame_bytes) +
                             " bytes do not fit one mbuf");
  }
  pool_ = create_populated(name, mbufs, cache, static_cast<uint16_t>(data_room),
                           socket < 0 ? SOCKET_ID_ANY : socket);
  if (pool_ == nullptr) {
    throw std::runtime_error("cannot create mempool " + name + " of " + std::to_string(mbufs) +
                             " mbufs x " + std::to_string(data_room) +
                             " bytes: " + rte_strerror(rte_errno) + " (is EAL's -m large enough?)");
  }
}

Mempool::~Mempool() {
  if (pool_ != nullptr) rte_mempool_free(pool_);
}

uint32_t Mempool::available() const { return rte_mempool_avail_count(pool_); }

static_assert(kMaxLcores == RTE_MAX_LCORE);

void CacheLcores::refresh() {
  n_ = 0;
  for (uint32_t lcore = 0; lcore < kMaxLcores; ++lcore) {
    if (rte_eal_lcore_role(lcore) != ROLE_OFF) ids_[n_++] = static_cast<uint16_t>(lcore);
  }
}

uint32_t pool_free(const rte_mempool* pool, const CacheLcores& lcores) {
  // The store's count through the pool's ops, as rte_mempool_avail_count() takes it
  // (its wrapper rte_mempool_ops_get_count() is not exported).
  uint64_t n = rte_mempool_get_ops(pool->ops_index)->get_count(pool);
  if (pool->cache_size != 0) {
    for (const uint16_t lcore : lcores.ids()) n += pool->local_cache[lcore].len;
  }
  // As rte_mempool_avail_count(): a cache read while its core moves objects can
  // make the sum overshoot.
  return static_cast<uint32_t>(n < pool->size ? n : pool->size);
}

Ring::Ring(const std::string& name, uint32_t count, unsigned flags, int socket) {
  ring_ = rte_ring_create(name.c_str(), count, socket < 0 ? SOCKET_ID_ANY : socket, flags);
  if (ring_ == nullptr) {
    throw std::runtime_error("cannot create ring " + name + ": " + rte_strerror(rte_errno));
  }
}

Ring::~Ring() {
  if (ring_ != nullptr) rte_ring_free(ring_);
}

}  // namespace mercury::net
