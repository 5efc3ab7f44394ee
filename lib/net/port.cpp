#include "net/port.h"

#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_mempool.h>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "net/eal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14's value; older headers lack it
#endif

namespace mercury::net {

namespace {

// Held by populate_memif_regions while it reads the regions, and by a
// net_memif port of this process while it stops or closes: stopping
// unmaps the port's own regions on the calling thread (DPDK 22.11's
// memif_disconnect), which would pull pages from under the reads. A
// peer's regions go on EAL's interrupt thread, where the reads run.
std::mutex& memif_unmap_lock() {
  static std::mutex m;
  return m;
}

[[noreturn]] void fail(const std::string& dev, const std::string& what, int err) {
  throw std::runtime_error("port " + dev + ": " + what + ": " + rte_strerror(err < 0 ? -err : err));
}

uint16_t find_port(const std::string& device) {
  const std::string name = device.substr(0, device.find(','));
  uint16_t id;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &id) == 0) return id;
  std::string known;
  RTE_ETH_FOREACH_DEV(id) {
    char n[RTE_ETH_NAME_MAX_LEN];
    if (rte_eth_dev_get_name_by_port(id, n) == 0)
      known += std::string(known.empty() ? "" : ", ") + n;
  }
  throw std::runtime_error("port " + name + " is not among the probed devices (" +
                           (known.empty() ? "none" : known) +
                           "); is it in the EAL arguments (--vdev / -a)?");
}

// Ethernet header and CRC on top of the IP MTU, as ethdev counts a frame.
constexpr uint32_t kEthOverhead = RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;

// PMDs whose datapath moves frames of any length although their device info
// announces 1518 bytes (max_rx_pktlen), so that ethdev refuses an MTU above
// 1500 at configure. net_memif (DPDK 22.11) in copy mode chains as many
// descriptors of its bsize as a frame needs on TX and copies them into one
// mbuf of the RX pool's data room (chaining only past it), so a frame of the
// pool's size arrives whole: NodeNetworks sizes the pools for the job's MTU.
bool carries_any_frame(const std::string& driver) { return driver == "net_memif"; }

// The arguments the device was created with ("role=server,id=0,..."), or "".
std::string devargs_of(const rte_eth_dev_info& info) {
  const rte_devargs* d = info.device != nullptr ? rte_dev_devargs(info.device) : nullptr;
  return d != nullptr && d->args != nullptr ? d->args : "";
}

// PMDs whose tx_burst copies every segment of a frame out of its mbufs (into
// shared memory, a kernel ring or a file) and frees them before returning, so
// a frame may end in a segment that refers to memory the sender keeps:
// net_memif in copy mode (a memif in zero-copy mode hands the buffers
// themselves to its peer), net_af_packet, net_pcap (which gathers a chain
// into a bounce buffer). A NIC reads its segments
// by DMA after tx_burst returns and needs their IOVA: not one of these.
bool copies_at_tx(const std::string& driver, const std::string& devargs) {
  if (driver == "net_memif") return devargs.find("zero-copy=yes") == std::string::npos;
  return driver == "net_af_packet" || driver == "net_pcap";
}

// A net_memif port's socket path in `role` ("server" or "client"), or ""
// for any other port or role.
std::string memif_socket_path(const std::string& driver, const std::string& devargs,
                              const char* role) {
  if (driver != "net_memif" || config::devargs_value(devargs, "role") != role) return "";
  return std::string(config::devargs_value(devargs, "socket").value_or("/tmp/memif.sock"));
}

// That socket as /proc/net/unix names it ("@" first for an abstract one,
// DPDK 22.11's default).
std::string memif_socket_name(const std::string& devargs, const std::string& path) {
  return config::devargs_value(devargs, "socket-abstract") == "no" ? path : "@" + path;
}

// What a memif server whose port has started listens on besides the PMD's
// socket: an abstract socket (in this network namespace, like the check of
// /proc/net/unix that finds it), gone when the port stops or the process
// dies. Clients connect only once it listens (Port::Port).
std::string memif_started_name(const std::string& path) { return path + ".started"; }

// Binds and listens on the abstract socket `name`; the descriptor, or
// throws naming the port.
int listen_abstract(const std::string& port, const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof a.sun_path) {
    throw std::runtime_error("port " + port + ": net_memif socket name too long for its " +
                             "started marker (" + name + ", at most " +
                             std::to_string(sizeof a.sun_path - 1) + " characters)");
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("port " + port + ": socket: " + std::strerror(errno));
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 || listen(fd, 1) != 0) {
    const int e = errno;
    close(fd);
    throw std::runtime_error("port " + port + ": cannot mark its net_memif server started on @" +
                             name + ": " + std::strerror(e) +
                             (e == EADDRINUSE ? " (another process serves this socket)" : ""));
  }
  return fd;
}

// Two rings per direction would be one per queue; a link uses queue 0 only.
struct RingPair {
  Ring a_to_b;
  Ring b_to_a;
};

}  // namespace

// /proc/net/unix: the flags word has __SO_ACCEPTCON, 0x10000.
bool unix_socket_listening(const std::string& name) {
  std::FILE* f = std::fopen("/proc/net/unix", "re");
  if (f == nullptr) return true;  // cannot tell: let the PMD try
  bool found = false;
  char line[512];
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long flags = 0;
    char path[256] = {};
    if (std::sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %255s", &flags, path) == 2) {
      found = (flags & 0x10000) != 0 && name == path;
    }
  }
  std::fclose(f);
  return found;
}

Port::Port(uint16_t id, Mempool& pool, const PortOptions& opts, std::shared_ptr<void> rings)
    : id_(id), rx_pool_(pool.get()), rings_(std::move(rings)) {
  char n[RTE_ETH_NAME_MAX_LEN] = {};
  rte_eth_dev_get_name_by_port(id, n);
  name_ = n;
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(id, &info); rc != 0) fail(name_, "dev_info_get", rc);
  driver_ = info.driver_name != nullptr ? info.driver_name : "?";

  if (opts.mtu > info.max_mtu || opts.mtu < info.min_mtu) {
    throw std::runtime_error("port " + name_ + " (" + driver_ + "): MTU " +
                             std::to_string(opts.mtu) + " outside what the PMD allows [" +
                             std::to_string(info.min_mtu) + ", " + std::to_string(info.max_mtu) +
                             "]");
  }
  if (opts.rx_queues > info.max_rx_queues || opts.tx_queues > info.max_tx_queues) {
    throw std::runtime_error("port " + name_ + ": " + std::to_string(opts.rx_queues) + " RX / " +
                             std::to_string(opts.tx_queues) + " TX queues asked, the PMD has " +
                             std::to_string(info.max_rx_queues) + " / " +
                             std::to_string(info.max_tx_queues));
  }

  rte_eth_conf conf{};
  conf.rxmode.mtu = opts.mtu;
  if (carries_any_frame(driver_)) {
    // The PMD announces a smaller frame than its datapath carries: ethdev
    // would refuse the job's MTU at configure. Configure within what it
    // announces; the Port's MTU (what the endpoint carves packets for) is
    // the job's.
    const uint32_t announced =
        info.max_rx_pktlen > kEthOverhead ? info.max_rx_pktlen - kEthOverhead : RTE_ETHER_MTU;
    conf.rxmode.mtu = std::min(opts.mtu, announced);
  }
  constexpr uint64_t kTxCksum = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  constexpr uint64_t kRxCksum = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  if (opts.checksum_offload && (info.tx_offload_capa & kTxCksum) == kTxCksum) {
    conf.txmode.offloads |= kTxCksum;
    tx_cksum_ = true;
  }
  if (opts.checksum_offload && (info.rx_offload_capa & kRxCksum) == kRxCksum) {
    conf.rxmode.offloads |= kRxCksum;
    rx_cksum_ = true;
  }
  if (copies_at_tx(driver_, devargs_of(info))) {
    // Frames may be chains whose payload segment refers to the sender's
    // memory (Interface): fast free, which wants direct single-pool mbufs, is
    // then off. net_pcap (22.11) reads chains without announcing it.
    if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) {
      conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    }
    tx_by_reference_ = true;
  } else if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE) {
    conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE;
  }
  if (opts.rx_queues > 1 && (info.flow_type_rss_offloads & RTE_ETH_RSS_UDP) != 0) {
    conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
    conf.rx_adv_conf.rss_conf.rss_hf =
        info.flow_type_rss_offloads & (RTE_ETH_RSS_UDP | RTE_ETH_RSS_IP);
    rss_ = true;
  }
  if (int rc = rte_eth_dev_configure(id, opts.rx_queues, opts.tx_queues, &conf); rc != 0) {
    fail(name_, "configure", rc);
  }
  uint16_t rxd = opts.rx_descriptors, txd = opts.tx_descriptors;
  if (int rc = rte_eth_dev_adjust_nb_rx_tx_desc(id, &rxd, &txd); rc != 0) {
    fail(name_, "adjust descriptors", rc);
  }
  const int socket = rte_eth_dev_socket_id(id);
  for (uint16_t q = 0; q < opts.rx_queues; ++q) {
    rte_eth_rxconf rxc = info.default_rxconf;
    rxc.offloads = conf.rxmode.offloads;
    if (int rc = rte_eth_rx_queue_setup(id, q, rxd, socket < 0 ? SOCKET_ID_ANY : socket, &rxc,
                                        pool.get());
        rc != 0) {
      fail(name_, "rx queue " + std::to_string(q) + " setup", rc);
    }
  }
  for (uint16_t q = 0; q < opts.tx_queues; ++q) {
    rte_eth_txconf txc = info.default_txconf;
    txc.offloads = conf.txmode.offloads;
    if (int rc = rte_eth_tx_queue_setup(id, q, txd, socket < 0 ? SOCKET_ID_ANY : socket, &txc);
        rc != 0) {
      fail(name_, "tx queue " + std::to_string(q) + " setup", rc);
    }
  }
  std::optional<MacAddr> want = opts.mac;
  rte_ether_addr current;
  rte_eth_macaddr_get(id, &current);
  if (!want && rte_is_zero_ether_addr(&current)) {
    // Some virtual PMDs (net_ring) come up with 00:00:00:00:00:00, which ARP
    // cannot resolve; give them a random locally administered address.
    rte_ether_addr r;
    rte_eth_random_addr(r.addr_bytes);
    MacAddr m;
    std::copy(std::begin(r.addr_bytes), std::end(r.addr_bytes), m.bytes.begin());
    want = m;
  }
  if (want) {
    rte_ether_addr a;
    std::copy(want->bytes.begin(), want->bytes.end(), a.addr_bytes);
    if (rte_eth_dev_default_mac_addr_set(id, &a) != 0) {
      // Virtual PMDs may not filter by MAC at all; promiscuous mode makes the
      // chosen address work on those that do.
      rte_eth_promiscuous_enable(id);
    }
  }
  const std::string devargs = devargs_of(info);
  const std::string server_path = memif_socket_path(driver_, devargs, "client");
  const std::string server = server_path.empty() ? "" : memif_socket_name(devargs, server_path);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.peer_wait_ms);
  auto gave_up = [&](const std::string& what) {
    return std::runtime_error("port " + name_ + ": " + what + " (waited " +
                              std::to_string(opts.peer_wait_ms) +
                              " ms): is the server node running, with this socket in its ports?");
  };
  // memif's client connects once, at start, and the start fails if nothing
  // listens yet. A memif server listens from EAL's probe but refuses
  // clients until its own port has started, and a refused client does not
  // try again; so a client connects only once the server marks its port
  // started. It never connects twice: DPDK 22.11's server dies (its
  // interrupt thread panics on epoll_ctl, EBADF) when a client closes a
  // connection it has not yet greeted, which a retry on a slow handshake
  // does (docs/net.md).
  if (!server.empty()) {
    std::string started = "@";
    started += memif_started_name(server_path);
    while (!unix_socket_listening(started)) {
      if (std::chrono::steady_clock::now() >= until) {
        throw gave_up(unix_socket_listening(server)
                          ? "the net_memif server on " + server + " has not started its port"
                          : "no net_memif server listens on " + server);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  if (int rc = rte_eth_dev_start(id); rc != 0) fail(name_, "start", rc);
  if (const std::string path = memif_socket_path(driver_, devargs, "server"); !path.empty()) {
    try {
      started_fd_ = listen_abstract(name_, memif_started_name(path));
    } catch (const std::runtime_error&) {
      const std::lock_guard<std::mutex> unmapping(memif_unmap_lock());
      rte_eth_dev_stop(id);  // no client connects to a server not marked started
      throw;
    }
  }
  if (!server.empty() && opts.peer_wait_ms > 0) {
    while (!link_up()) {
      if (std::chrono::steady_clock::now() >= until) {
        const std::lock_guard<std::mutex> unmapping(memif_unmap_lock());
        rte_eth_dev_stop(id);
        throw gave_up("the net_memif server on " + server +
                      " did not accept it (another client with its id connected, or an id, "
                      "secret or mode the server does not have?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  rte_ether_addr a;
  rte_eth_macaddr_get(id, &a);
  std::copy(std::begin(a.addr_bytes), std::end(a.addr_bytes), mac_.bytes.begin());
  if (want) mac_ = *want;
  mtu_ = opts.mtu;
  rx_queues_ = opts.rx_queues;
  tx_queues_ = opts.tx_queues;
}

Port::Port(Port&& o) noexcept
    : id_(o.id_),
      name_(std::move(o.name_)),
      driver_(std::move(o.driver_)),
      mac_(o.mac_),
      mtu_(o.mtu_),
      rx_queues_(o.rx_queues_),
      tx_queues_(o.tx_queues_),
      rss_(o.rss_),
      tx_cksum_(o.tx_cksum_),
      rx_cksum_(o.rx_cksum_),
      tx_by_reference_(o.tx_by_reference_),
      rx_pool_(o.rx_pool_),
      rings_(std::move(o.rings_)),
      linger_until_ns_(std::atomic_ref<int64_t>(o.linger_until_ns_).load()),
      started_fd_(std::exchange(o.started_fd_, -1)) {
  o.id_ = RTE_MAX_ETHPORTS;
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Port::linger(std::chrono::milliseconds ms) noexcept {
  if (driver_ != "net_memif") return;
  std::atomic_ref<int64_t>(linger_until_ns_)
      .store(steady_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count());
}

Port::~Port() {
  if (id_ == RTE_MAX_ETHPORTS) return;
  if (started_fd_ >= 0) close(started_fd_);  // no new client from here on
  const int64_t wait = std::atomic_ref<int64_t>(linger_until_ns_).load() - steady_ns();
  if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
  std::unique_lock<std::mutex> unmapping(memif_unmap_lock(), std::defer_lock);
  if (driver_ == "net_memif") unmapping.lock();
  rte_eth_dev_stop(id_);
  rte_eth_dev_close(id_);
}

Port Port::open(const std::string& device, Mempool& pool, const PortOptions& opts) {
  return Port(find_port(device), pool, opts, nullptr);
}

std::pair<Port, Port> Port::ring_link(const std::string& name, Mempool& pool_a, Mempool& pool_b,
                                      const PortOptions& opts) {
  return ring_link(name, pool_a, pool_b, opts, opts);
}

std::pair<Port, Port> Port::ring_link(const std::string& name, Mempool& pool_a, Mempool& pool_b,
                                      const PortOptions& opts, const PortOptions& opts_b) {
  if (opts.rx_queues != 1 || opts.tx_queues != 1 || opts_b.rx_queues != 1 ||
      opts_b.tx_queues != 1) {
    throw std::runtime_error("ring link " + name + ": one RX and one TX queue per side");
  }
  // Each ring has exactly one producer core and one consumer core.
  auto rings = std::make_shared<RingPair>(
      RingPair{Ring("ml_ab_" + name, 4096, RING_F_SP_ENQ | RING_F_SC_DEQ),
               Ring("ml_ba_" + name, 4096, RING_F_SP_ENQ | RING_F_SC_DEQ)});
  rte_ring* ab = rings->a_to_b.get();
  rte_ring* ba = rings->b_to_a.get();
  int a = rte_eth_from_rings(("ml_a_" + name).c_str(), &ba, 1, &ab, 1, rte_socket_id());
  if (a < 0) fail("ring link " + name, "create side a", rte_errno);
  int b = rte_eth_from_rings(("ml_b_" + name).c_str(), &ab, 1, &ba, 1, rte_socket_id());
  if (b < 0) fail("ring link " + name, "create side b", rte_errno);
  Port pa(static_cast<uint16_t>(a), pool_a, opts, rings);
  Port pb(static_cast<uint16_t>(b), pool_b, opts_b, rings);
  return {std::move(pa), std::move(pb)};
}

bool Port::read_drops(PortDrops& out) const {
  rte_eth_stats s{};
  if (rte_eth_stats_get(id_, &s) != 0) return false;
  out.rx_nombuf = s.rx_nombuf;
  out.imissed = s.imissed;
  out.ierrors = s.ierrors;
  out.oerrors = s.oerrors;
  return true;
}

uint32_t Port::rx_pool_free() const {
  return rx_pool_ != nullptr ? rte_mempool_avail_count(rx_pool_) : 0;
}

bool Port::link_up() const {
  rte_eth_link link{};
  return rte_eth_link_get_nowait(id_, &link) == 0 && link.link_status == RTE_ETH_LINK_UP;
}

std::string Port::describe() const {
  std::string s = name_ + " (" + driver_ + ", port " + std::to_string(id_) + "): mac " +
                  mac_.to_string() + ", mtu " + std::to_string(mtu_) + ", " +
                  std::to_string(rx_queues_) + " rx / " + std::to_string(tx_queues_) + " tx queues";
  if (rss_) s += ", rss";
  s += tx_cksum_ ? ", tx checksum offload" : ", software checksums";
  if (tx_by_reference_) s += ", payloads sent by reference";
  return s;
}

namespace {

// Maps in and reads every page of this process's memif regions; runs on
// EAL's interrupt thread (populate_memif_regions), the thread on which
// net_memif maps and unmaps them.
uint64_t populate_memif_regions_here() noexcept {
  // DPDK 22.11's net_memif names each region's memfd "memif_region_<n>";
  // both ends map it shared ("rw-s").
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return 0;
  uint64_t populated = 0;
  char line[512];
  const auto page = static_cast<unsigned long>(sysconf(_SC_PAGESIZE));
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (perms[3] != 's' || std::strstr(line, "/memfd:memif_region_") == nullptr) continue;
    if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) != 0) continue;
    populated += hi - lo;
    // Then one read of every page from user mode: on a VM with shadow page
    // tables (these) the kernel's populate does not reach the tables the
    // hypervisor keeps for this process, and each page's first access would
    // still exit to it (7 us a page here, the first round's copies through
    // the rings). A read changes nothing the peer writes, and the region
    // cannot go meanwhile: only this thread unmaps it.
    unsigned char sum = 0;
    for (unsigned long a = lo; a < hi; a += page) {
      sum += *reinterpret_cast<volatile const unsigned char*>(a);
    }
    (void)sum;
  }
  std::fclose(maps);
  return populated;
}

void populate_on_interrupt_thread(void* bytes) {
  *static_cast<uint64_t*>(bytes) = populate_memif_regions_here();
}

}  // namespace

uint64_t populate_memif_regions() noexcept {
  // A net_memif port of this process that stops or closes unmaps its own
  // regions on the thread that stops it: that waits (Port::~Port, the
  // reconnects in Port's constructor) until this returns.
  const std::lock_guard<std::mutex> unmapping(memif_unmap_lock());
  uint64_t bytes = 0;
  InterruptThreadCall call(populate_on_interrupt_thread, &bytes);
  return call.wait_done(kPopulateWaitMs) ? bytes : 0;
}

}  // namespace mercury::net
