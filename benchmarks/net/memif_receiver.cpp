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
// Bursts between two looks at the control socket: one non-blocking recv
// (about 1 us) per 256 bursts of 32 frames is well under 1% of a loaded
// receiver's time.
constexpr int kCommandPollBursts = 256;
// No command for this long, idle or counting: the sender is gone or hung, so
// the receiver leaves (its parent's death kills it sooner, via PDEATHSIG).
constexpr int kPatienceMs = 60'000;

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
        bytes += rx[i].mbuf->pkt_len;
        if (rx[i].parsed.payload.size() != payload) ++report_.wrong_length;
        done[i] = rx[i].mbuf;
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

  [[nodiscard]] uint64_t packets() const { return report_.packets; }

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

enum class Next { kIdle, kExit, kFail };

// Counts one run until kStop, then answers with the counts.
Next count_run(Receiver& rx, ControlChannel& control) {
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t give_up = rte_rdtsc() + hz / 1000 * kPatienceMs;
  for (;;) {
    for (int i = 0; i < kCommandPollBursts; ++i) rx.poll_st();
    Command c;
    const int got = control.receive(c, 0);
    if (got < 0) return Next::kExit;
    if (got == 0) {
      if (rte_rdtsc() < give_up) continue;
      std::fprintf(stderr, "memif_rate_bench receiver: no stop after %d s\n", kPatienceMs / 1000);
      return Next::kFail;
    }
    if (c.kind == Command::Kind::kQuit) return Next::kExit;
    if (c.kind != Command::Kind::kStop) continue;
    // Frames memif accepted may still be in its ring: take them, within 1 s.
    const uint64_t until = rte_rdtsc() + hz;
    while (rx.packets() < c.sent && rte_rdtsc() < until) rx.poll_st();
    return control.send(rx.finish()) ? Next::kIdle : Next::kExit;
  }
}

int serve(Receiver& rx, ControlChannel& control) {
  for (;;) {
    Command c;
    const int got = control.receive(c, kPatienceMs);
    if (got < 0) return 0;  // the sender closed the socket: done
    if (got == 0) {
      std::fprintf(stderr, "memif_rate_bench receiver: no command for %d s\n", kPatienceMs / 1000);
      return 1;
    }
    switch (c.kind) {
      case Command::Kind::kQuit:
        return 0;
      case Command::Kind::kStop:  // not counting: nothing to report
        if (!control.send(Report{})) return 0;
        break;
      case Command::Kind::kGo:  // zero-copy start-up only (memif_goodput_bench)
        break;
      case Command::Kind::kStart: {
        Report ack;
        ack.leftovers = rx.drain();
        rx.begin(c.variant, c.frame);
        if (!control.send(ack)) return 0;
        const Next next = count_run(rx, control);
        if (next != Next::kIdle) return next == Next::kFail ? 1 : 0;
        break;
      }
    }
  }
}

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
    if (control.send(Report{})) rc = serve(rx, control);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memif_rate_bench receiver: %s\n", e.what());
  }
  return rc;
}

}  // namespace mercury::bench::memif
