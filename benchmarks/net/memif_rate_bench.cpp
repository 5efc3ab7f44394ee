// The packet rate of the project's Ethernet/IPv4/UDP/Mercury path against the
// raw rate of net_memif between two processes, in the same run.
//
//   memif/raw/<size>    a raw tx loop filling each frame from a buffer (the
//                       copy the stack must do too) on one side, a raw rx
//                       loop (rx_burst, count, free) on the other: the limit.
//   memif/stack/<size>  Interface::stage_data_st + flush_st on one side,
//                       Interface::poll_rx_st (parse and verify every header
//                       and checksum; drops must be 0) on the other.
//   memif/stack_nocsum/<size>  the same with UDP checksums off.
//
// <size> has net_rate_bench's meaning: 1500 and 9000 give Ethernet frames of
// 1514 and 9014 bytes on every variant; 64 gives 64-byte raw frames and the
// stack's smallest, 98 bytes (an empty Mercury packet).
//
// This process (memif client, CPU 0) runs Google Benchmark and sends; before
// EAL starts it spawns itself with --peer as the receiver (memif server,
// CPU 1), which it drives over a control socket (memif_link.h). The figure
// is what the receiver got per second of its own clock, from its first burst
// to its last; every frame memif accepted must arrive (checked each run).
// Run (see benchmarks/README.md):
//   build/benchmarks/net/memif_rate_bench --benchmark_repetitions=5
//       --benchmark_min_time=0.3 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_eal.h"
#include "memif_link.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ratio_reporter.h"

namespace mercury::bench::memif {
namespace {

constexpr uint16_t kBurst = 32;
constexpr int kReadyTimeoutMs = 30'000;
constexpr int kLinkUpTimeoutMs = 10'000;

struct Sender {
  explicit Sender(PeerProcess& p) : peer(p) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = std::byte(i * 31);
    rte_eth_link link{};
    for (int waited = 0; link.link_status != RTE_ETH_LINK_UP; waited += 10) {
      if (waited >= kLinkUpTimeoutMs) {
        throw std::runtime_error("memif link to the receiver is not up after " +
                                 std::to_string(kLinkUpTimeoutMs / 1000) + " s");
      }
      ::usleep(10'000);
      rte_eth_link_get_nowait(port.id(), &link);
    }
    // Static ARP, as NodeNetworks configures it: the run measures data only.
    stack.add_static_arp(kReceiverIp, kReceiverMac);
    stack_nocsum.add_static_arp(kReceiverIp, kReceiverMac);
    if (!stack.resolve_st(kReceiverIp, kUdpPort, route, rte_rdtsc())) {
      throw std::runtime_error("no route to the receiver");
    }
  }

  PeerProcess& peer;
  net::Mempool pool{"ms_tx", 8191, 256, kMbufFrameBytes};
  net::Port port = net::Port::open("net_memif0", pool, net::PortOptions{.mtu = kPortMtu});
  net::Interface stack{port, pool, net::LocalAddr{kSenderMac, kSenderIp, kUdpPort}, {}};
  net::Interface stack_nocsum{port, pool, stack.local(),
                              net::InterfaceOptions{.udp_checksum = false}};
  std::vector<std::byte> source = std::vector<std::byte>(64 << 20);
  net::Route route;
};
Sender* g_sender = nullptr;

size_t frame_len(int64_t size_class, bool stack) {
  if (size_class == 64) return stack ? net::kFrameOverhead : 64;
  return static_cast<size_t>(size_class) + net::kL2Len;
}

// An iteration hands kBurst frames to memif, waiting for room in its ring
// when the receiver is behind: iterations then cost the same whatever the
// back-pressure, so Google Benchmark's iteration count gives stable runs.
// Waiting is bounded: a ring that takes nothing for a whole second means the
// receiver is gone.
class Stall {
 public:
  /// True once calls that made no progress have gone on for a second.
  bool stuck(uint16_t progress) {
    if (progress != 0) {
      since_ = 0;
      return false;
    }
    const uint64_t now = rte_rdtsc();
    if (since_ == 0) since_ = now;
    return now - since_ > rte_get_tsc_hz();
  }

 private:
  uint64_t since_ = 0;
};

// Returns the frames memif accepted.
uint64_t send_raw(benchmark::State& state, Sender& s, size_t frame) {
  uint64_t sent = 0;
  size_t offset = 0;
  Stall stall;
  rte_mbuf* burst[kBurst];
  for (auto _ : state) {
    if (rte_pktmbuf_alloc_bulk(s.pool.get(), burst, kBurst) != 0) {
      state.SkipWithError("mempool empty");
      break;
    }
    for (uint16_t i = 0; i < kBurst; ++i) {
      if (offset + frame > s.source.size()) offset = 0;
      std::memcpy(rte_pktmbuf_mtod(burst[i], void*), s.source.data() + offset, frame);
      offset += frame;
      burst[i]->data_len = static_cast<uint16_t>(frame);
      burst[i]->pkt_len = static_cast<uint32_t>(frame);
    }
    uint16_t done = 0;
    while (done < kBurst) {
      const uint16_t went = s.port.tx_burst(0, burst + done, kBurst - done);
      done += went;
      if (stall.stuck(went)) break;
    }
    sent += done;
    if (done < kBurst) {
      rte_pktmbuf_free_bulk(burst + done, kBurst - done);
      state.SkipWithError("memif took nothing for 1 s");
      break;
    }
  }
  return sent;
}

// Returns the frames memif accepted from the interface in this run.
uint64_t send_stack(benchmark::State& state, Sender& s, net::Interface& a, size_t frame) {
  const size_t payload = frame - net::kFrameOverhead;
  const uint64_t before = a.counters().tx_frames;
  size_t offset = 0;
  Stall stall;
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.msg_len = static_cast<uint32_t>(s.source.size());
  for (auto _ : state) {
    bool failed = false;
    for (uint16_t i = 0; i < kBurst && !failed; ++i) {
      if (offset + payload > s.source.size()) offset = 0;
      h.offset = static_cast<uint32_t>(offset);
      // A full stage (two bursts) means memif refused the last flushes.
      while (a.tx_room() == 0 && !failed) failed = stall.stuck(a.flush_st(rte_rdtsc()));
      if (!failed && !a.stage_data_st(s.route, h, {s.source.data() + offset, payload})) {
        state.SkipWithError("mempool empty");
        failed = true;
      }
      ++h.seq;
      offset += payload;
    }
    if (failed) {
      if (!state.error_occurred()) state.SkipWithError("memif took nothing for 1 s");
      break;
    }
    a.flush_st(rte_rdtsc());
  }
  // Untimed: hand over what is staged, so no frame of this run arrives in the next.
  const uint64_t until = rte_rdtsc() + rte_get_tsc_hz();
  while (a.tx_room() < net::Interface::kStage && rte_rdtsc() < until) a.flush_st(rte_rdtsc());
  return a.counters().tx_frames - before;
}

void run(benchmark::State& state, Variant v) {
  Sender& s = *g_sender;
  const size_t frame = frame_len(state.range(0), v != Variant::kRaw);
  std::string error;
  Report ack;
  if (!s.peer.start(v, static_cast<uint32_t>(frame), ack, error)) {
    state.SkipWithError(error.c_str());
    return;
  }
  const uint64_t sent = v == Variant::kRaw     ? send_raw(state, s, frame)
                        : v == Variant::kStack ? send_stack(state, s, s.stack, frame)
                                               : send_stack(state, s, s.stack_nocsum, frame);
  Report r;
  if (!s.peer.stop(sent, r, error)) {
    state.SkipWithError(error.c_str());
    return;
  }
  if (state.error_occurred()) return;  // the send loop said why
  if (r.drops != 0) {
    error = "the receiver's stack dropped " + std::to_string(r.drops) + " frames";
  } else if (r.wrong_length != 0) {
    error = std::to_string(r.wrong_length) + " frames arrived with the wrong length";
  } else if (r.packets != sent) {
    error = "the receiver got " + std::to_string(r.packets) + " of the " + std::to_string(sent) +
            " frames memif accepted";
  }
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  const double seconds = static_cast<double>(r.window_ns) / 1e9;
  const auto per_second = [&](double x) { return seconds > 0 ? x / seconds : 0.0; };
  state.counters["pps"] = per_second(static_cast<double>(r.timed_packets));
  state.counters["Gbps"] = per_second(static_cast<double>(r.timed_bytes) * 8 / 1e9);
  state.counters["frame"] = static_cast<double>(frame);
}

void raw(benchmark::State& state) { run(state, Variant::kRaw); }
void stack(benchmark::State& state) { run(state, Variant::kStack); }
void stack_nocsum(benchmark::State& state) { run(state, Variant::kStackNoChecksum); }

// Real time: the sender may wait on memif, and the figures are per second.
BENCHMARK(raw)->Name("memif/raw")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack)->Name("memif/stack")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack_nocsum)->Name("memif/stack_nocsum")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();

}  // namespace
}  // namespace mercury::bench::memif

int main(int argc, char** argv) {
  namespace memif = mercury::bench::memif;
  if (argc > 1 && std::strcmp(argv[1], "--peer") == 0) return memif::run_receiver(argc, argv);
  benchmark::Initialize(&argc, argv);
  std::string runtime_dir;
  int rc = 0;
  try {
    // memif's default abstract socket: a name only, nothing on disk to clean.
    const std::string socket = "/tmp/mercury-bench-" + std::to_string(getpid()) + ".sock";
    // Before EAL: a process must not fork once EAL has started.
    memif::PeerProcess peer(socket);
    mercury::net::Eal eal(mercury::bench::eal_args(
        "memif_rate_bench", {"--lcores=0@0", "--no-telemetry", "--log-level=pmd.net.memif:warning",
                             "--vdev=" + memif::memif_vdev(false, socket)}));
    runtime_dir = rte_eal_get_runtime_dir();
    peer.wait_ready(memif::kReadyTimeoutMs);
    {
      memif::Sender sender(peer);
      memif::g_sender = &sender;
      mercury::bench::RatioReporter reporter("pps", "raw");
      benchmark::RunSpecifiedBenchmarks(&reporter);
      memif::g_sender = nullptr;
    }
    if (const int peer_rc = peer.quit(); peer_rc != 0) {
      std::fprintf(stderr, "memif_rate_bench: the receiver process exited with %d\n", peer_rc);
      rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memif_rate_bench: %s\n", e.what());
    rc = 1;
  }
  memif::remove_runtime_dir(runtime_dir);
  benchmark::Shutdown();
  return rc;
}
