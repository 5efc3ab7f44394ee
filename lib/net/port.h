// RAII for one DPDK ethdev port on any PMD: a vdev (net_ring, net_memif,
// net_pcap, net_af_packet, ...) or a PCI NIC.
//
// Opening a port configures its queues, MTU (jumbo frames up to 9000 bytes
// where the PMD allows), RSS over UDP when it has several RX queues and the
// PMD offers RSS, and IPv4/UDP checksum offload when the PMD offers it; then
// starts it. The destructor stops and closes it. Control path: set-up throws
// std::runtime_error naming the device and DPDK's reason.
//
// rx_burst/tx_burst are the datapath: inline, lock-free, one core per queue.
// read_drops(), rx_pool_free() and link_up() are the port's own view of what
// it lost and why (the PMD's counters, the RX pool's free mbufs, the link's
// state): control path, called by the core that polls the port on its slow
// path (Interface::refresh_port_stats_st), so that one thread drives the
// device.
#pragma once

#include <rte_ethdev.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "base/counter_list.h"
#include "net/frame.h"
#include "net/mempool.h"
#include "net/packet_port.h"

namespace mercury::net {

struct PortOptions {
  uint16_t rx_queues = 1;
  uint16_t tx_queues = 1;
  uint16_t rx_descriptors = 1024;
  uint16_t tx_descriptors = 1024;
  uint32_t mtu = 1500;           ///< IP MTU
  bool checksum_offload = true;  ///< use the PMD's checksum offload when it has one
  std::optional<MacAddr> mac;    ///< set this MAC (falls back to promiscuous if refused)
  /// A net_memif client: how long open() waits for its server's port to
  /// start (the server may start after it), polling /proc/net/unix for the
  /// started marker the server's Port listens on, and then for the link to
  /// come up; it connects once. 0: neither. Either way a server not
  /// listening, or not started, is refused with the socket named.
  uint32_t peer_wait_ms = 0;
};

class Port {
 public:
  /// Finds `device` among the probed ports (a vdev name such as "net_memif0",
  /// or a PCI address), configures it with `opts` and starts it. For a vdev
  /// string with arguments ("net_memif0,role=server"), the name before the
  /// first comma is used. Throws when the device is unknown or refuses.
  static Port open(const std::string& device, Mempool& pool, const PortOptions& opts);

  /// An in-process link: two ports joined by a pair of rings, so what one
  /// sends the other receives. `name` must be unique in the process.
  static std::pair<Port, Port> ring_link(const std::string& name, Mempool& pool_a, Mempool& pool_b,
                                         const PortOptions& opts);
  /// The same with each end's own options (its MAC, typically).
  static std::pair<Port, Port> ring_link(const std::string& name, Mempool& pool_a, Mempool& pool_b,
                                         const PortOptions& opts_a, const PortOptions& opts_b);

  Port(Port&& o) noexcept;
  Port& operator=(Port&&) = delete;
  Port(const Port&) = delete;
  ~Port();

  [[nodiscard]] uint16_t id() const { return id_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& driver() const { return driver_; }
  [[nodiscard]] MacAddr mac() const { return mac_; }
  [[nodiscard]] uint32_t mtu() const { return mtu_; }
  [[nodiscard]] uint16_t rx_queues() const { return rx_queues_; }
  [[nodiscard]] uint16_t tx_queues() const { return tx_queues_; }
  [[nodiscard]] bool rss() const { return rss_; }
  /// TX checksum offload for IPv4 header and UDP is on.
  [[nodiscard]] bool tx_checksum_offload() const { return tx_cksum_; }
  /// The PMD reports RX checksum verdicts in mbuf flags.
  [[nodiscard]] bool rx_checksum_offload() const { return rx_cksum_; }
  /// The PMD copies each frame out of its mbufs, chains included, within
  /// tx_burst and frees them there (memif in copy mode, af_packet, pcap):
  /// a frame's payload may be a segment that refers to the sender's memory,
  /// which the PMD reads before tx_burst returns. Multi-segment TX is on.
  [[nodiscard]] bool tx_by_reference() const { return tx_by_reference_; }
  /// One-line description for start-up output.
  [[nodiscard]] std::string describe() const;

  /// The PMD's drop counters now (rte_eth_stats_get). False, `out`
  /// unchanged, when the PMD gives no statistics. Control path: a PMD may
  /// read device registers, take a lock or make a system call here, so it is
  /// never called per burst; Mercury calls it from the core that polls the
  /// port (Interface::refresh_port_stats_st). Never throws.
  bool read_drops(PortDrops& out) const;
  /// Free mbufs in the pool the RX queues were set up with, now
  /// (rte_mempool_avail_count: the common pool and every lcore's cache);
  /// 0 when the PMD can take no frame. A net_ring port receives the mbufs
  /// its peer sent, so there this is its own TX pool. Any thread; walks the
  /// lcore caches (about a microsecond).
  [[nodiscard]] uint32_t rx_pool_free() const;
  /// The PMD says the link is up now (rte_eth_link_get_nowait): a
  /// net_memif port is up while its peer is connected. Control path, as
  /// read_drops().
  [[nodiscard]] bool link_up() const;

  /// A net_memif port's peer may still poll the link for `ms` milliseconds
  /// from now: the destructor, which closes the link, waits until then
  /// (the peer unmaps the link's memory when it closes, under any core of
  /// its own inside a burst: docs/net.md). Nothing on other PMDs. Any
  /// thread; the latest call counts.
  void linger(std::chrono::milliseconds ms) noexcept;

  uint16_t rx_burst(uint16_t queue, rte_mbuf** pkts, uint16_t n) {
    return rte_eth_rx_burst(id_, queue, pkts, n);
  }
  uint16_t tx_burst(uint16_t queue, rte_mbuf** pkts, uint16_t n) {
    return rte_eth_tx_burst(id_, queue, pkts, n);
  }

 private:
  Port(uint16_t id, Mempool& pool, const PortOptions& opts, std::shared_ptr<void> rings);
  uint16_t id_ = RTE_MAX_ETHPORTS;
  std::string name_;
  std::string driver_;
  MacAddr mac_;
  uint32_t mtu_ = 0;
  uint16_t rx_queues_ = 0;
  uint16_t tx_queues_ = 0;
  bool rss_ = false;
  bool tx_cksum_ = false;
  bool rx_cksum_ = false;
  bool tx_by_reference_ = false;
  const rte_mempool* rx_pool_ = nullptr;  // what the RX queues allocate from
  std::shared_ptr<void> rings_;           // ring links: the rings outlive both ports
  int64_t linger_until_ns_ = 0;           // steady clock; atomic_ref (linger())
  int started_fd_ = -1;  // a net_memif server's started marker (port.cpp), closed first
};

/// Maps in every page of the net_memif shared-memory regions (its rings and
/// packet buffers) this process has mapped, without changing a byte
/// (madvise MADV_POPULATE_WRITE, Linux 5.14, then one read of every page
/// from user mode, which a VM with shadow page tables needs too: its
/// hypervisor otherwise takes each page's first access). A region's pages are
/// otherwise faulted in by the first frames through them: on a VM that
/// faults slowly, the first round of pushes then runs measurably slower than
/// the next (docs/net.md, "net_memif's shared memory"). The work runs on
/// EAL's interrupt thread (InterruptThreadCall), the thread on which
/// net_memif unmaps a peer's regions when the peer leaves, and a port of
/// this process that stops or closes waits for it (its own regions go on
/// the stopping thread): no page is pulled from under the reads. The caller
/// waits for it, at most kPopulateWaitMs. Call
/// it from a control thread (never from the interrupt thread: an EAL
/// callback) once the links are up (the regions are mapped when the peers
/// connect); calling it again costs a page-table walk and a read per page
/// (about 30 ms for an 18 MB region here). Returns the bytes of the regions
/// it populated; 0 when there are none (no connected net_memif port), the
/// kernel refuses, or the interrupt thread did not get to it in time.
/// Control path: reads /proc/self/maps; never throws.
inline constexpr uint32_t kPopulateWaitMs = 5000;
uint64_t populate_memif_regions() noexcept;

/// A unix socket named `name` as /proc/net/unix shows it ("@" first for an
/// abstract one) listens in this network namespace; true when the file
/// cannot be read (cannot tell). How a net_memif client finds its server's
/// socket and started marker (docs/net.md).
bool unix_socket_listening(const std::string& name);

}  // namespace mercury::net
