#include "net/mempool.h"

#include <rte_errno.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

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

Mempool::Mempool(const std::string& name, uint32_t mbufs, uint32_t cache, uint32_t frame_bytes,
                 int socket) {
  const uint32_t data_room = RTE_PKTMBUF_HEADROOM + frame_bytes;
  if (data_room > UINT16_MAX) {
    throw std::runtime_error("mempool " + name + ": frames of " + std::to_string(frame_bytes) +
                             " bytes do not fit one mbuf");
  }
  pool_ = rte_pktmbuf_pool_create(name.c_str(), mbufs, cache, 0, static_cast<uint16_t>(data_room),
                                  socket < 0 ? SOCKET_ID_ANY : socket);
  if (pool_ == nullptr) {
    throw std::runtime_error("cannot create mempool " + name + " of " + std::to_string(mbufs) +
                             " mbufs x " + std::to_string(data_room) +
                             " bytes: " + rte_strerror(rte_errno) + " (is EAL's -m large enough?)");
  }
  // Creating the pool writes each mbuf's header, not its data room: without
  // hugepages the kernel would then fault in (and zero) the data pages one
  // by one the first time each mbuf carries a frame, a fifth of a server's
  // time in a job's first rounds. Write every page now, once.
  rte_mempool_mem_iter(
      pool_,
      [](rte_mempool*, void*, rte_mempool_memhdr* memhdr, unsigned) {
        auto* p = static_cast<volatile char*>(memhdr->addr);
        for (size_t off = 0; off < memhdr->len; off += 4096) p[off] = p[off];
      },
      nullptr);
}

Mempool::~Mempool() {
  if (pool_ != nullptr) rte_mempool_free(pool_);
}

uint32_t Mempool::available() const { return rte_mempool_avail_count(pool_); }

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
