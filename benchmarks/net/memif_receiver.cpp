// The receiver process of memif_rate_bench: the memif server, pinned to CPU 1.
// It polls its port for the variant the sender names and counts what arrives;
// the rate it reports is what it received per second of its own clock.
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <string>

#include "bench_eal.h"
#include "memif_link.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"

namespace mercury::bench::memif {

namespace {

constexpr uint16_t kBurst = 32;

class Receiver {
 public:
  Receiver()
      : pool_("mr_rx", 8191, 256, kMbufFrameBytes),
        port_(net::Port::open("net_memif0", pool_, net::PortOptions{.mtu = kPortMtu})),
        stack_(port_, pool_, net::LocalAddr{kReceiverMac, kReceiverIp, kUdpPort}, {}),
        stack_nocsum_(port_, pool_, stack_.local(), net::InterfaceOptions{.udp_checksum = false}) {}

  /// Takes and frees what an earlier run left queued; returns how many.
  uint64_t drain() {
    uint64_t n = 0;
    rte_mbuf* m[kBurst];
    while (const uint16_t got = port_.rx_burst(0, m, kBurst)) {
      rte_pktmbuf_free_bulk(m, got);
      n += got;
    }
    return n;
  }

  void begin(Variant v, uint32_t frame) {
    variant_ = v;
    frame_ = frame;
    report_ = Report{};
    first_tsc_ = last_tsc_ = 0;
    idle_tsc_ = 0;
    first_packets_ = first_bytes_ = 0;
    drops_at_begin_ = interface().counters().total_drops();
    wall_at_begin_ = clock_ns(CLOCK_MONOTONIC);
    cpu_at_begin_ = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  }

  /// One burst of the run's variant, counted.
  void poll_st() {
    const uint64_t now = rte_rdtsc();
    uint16_t got = 0;
    uint64_t bytes = 0;
    rte_mbuf* done[kBurst];
    if (variant_ == Variant::kRaw) {
      got = port_.rx_burst(0, done, kBurst);
      for (uint16_t i = 0; i < got; ++i) {
        bytes += done[i]->pkt_len;
        if (done[i]->pkt_len != frame_) ++report_.wrong_length;
      }
    } else {
      net::RxPacket rx[kBurst];
      got = interface().poll_rx_st(rx, kBurst, now);
      const size_t payload = frame_ - net::kFrameOverhead;
      for (uint16_t i = 0; i < got; ++i) {
        bytes += net::mbuf_of(rx[i].buf)->pkt_len;
        if (rx[i].parsed.payload.size() != payload) ++report_.wrong_length;
        done[i] = net::mbuf_of(rx[i].buf);
      }
    }
    if (got == 0) {
      // Time between frames that the receiver had nothing to do: a receiver
      // idle for a good share of its window was not what limited the rate.
      if (report_.packets != 0) idle_tsc_ += rte_rdtsc() - now;
      return;
    }
    rte_pktmbuf_free_bulk(done, got);
    if (report_.packets == 0) {
      first_tsc_ = now;
      first_packets_ = got;
      first_bytes_ = bytes;
    }
    last_tsc_ = now;
    report_.packets += got;
    report_.bytes += bytes;
  }

  [[nodiscard]] uint64_t received() const { return report_.packets; }

  Report finish() {
    Report r = report_;
    r.timed_packets = r.packets - first_packets_;
    r.timed_bytes = r.bytes - first_bytes_;
    r.window_ns = static_cast<uint64_t>(static_cast<double>(last_tsc_ - first_tsc_) * 1e9 /
                                        static_cast<double>(rte_get_tsc_hz()));
    r.idle_ns = static_cast<uint64_t>(static_cast<double>(idle_tsc_) * 1e9 /
                                      static_cast<double>(rte_get_tsc_hz()));
    r.drops = interface().counters().total_drops() - drops_at_begin_;
    r.wall_ns = clock_ns(CLOCK_MONOTONIC) - wall_at_begin_;
    r.cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_at_begin_;
    return r;
  }

 private:
  net::Interface& interface() {
    return variant_ == Variant::kStackNoChecksum ? stack_nocsum_ : stack_;
  }

  net::Mempool pool_;
  net::Port port_;
  net::Interface stack_;
  net::Interface stack_nocsum_;
  Variant variant_ = Variant::kRaw;
  uint32_t frame_ = 0;
  Report report_;
  uint64_t first_tsc_ = 0;
  uint64_t last_tsc_ = 0;
  uint64_t idle_tsc_ = 0;  ///< in empty polls after the first frame
  uint64_t first_packets_ = 0;
  uint64_t first_bytes_ = 0;
  uint64_t drops_at_begin_ = 0;
  uint64_t wall_at_begin_ = 0;
  uint64_t cpu_at_begin_ = 0;
};

}  // namespace

int run_receiver(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s --peer <control fd> <memif socket>\n", argv[0]);
    return 2;
  }
  ::prctl(PR_SET_NAME, "memif_rate_peer");  // exec'd as /proc/self/exe, ps would say "exe"
  ControlChannel control(std::atoi(argv[2]));
  int rc = 1;
  try {
    net::Eal eal(eal_args("memif_rate_peer",
                          {"--lcores=0@1", "--no-telemetry", "--log-level=pmd.net.memif:warning",
                           "--vdev=" + memif_vdev(true, argv[3])}));
    Receiver rx;
    // Ready: the server port listens, so the sender's client port can connect.
    if (control.send(Report{})) rc = serve_commands(rx, control, "memif_rate_bench");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memif_rate_bench receiver: %s\n", e.what());
  }
  return rc;
}

}  // namespace mercury::bench::memif
