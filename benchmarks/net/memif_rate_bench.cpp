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
// rx_idle is the share of the receiver's window it spent in empty polls
// (near 0: the receiver limited the rate). tx_cpu and rx_cpu are the share
// of its core each side got; a run where
// either is below --min_cpu_share (default 0.9) measured the scheduler more
// than memif, and is reported under "memif_shared_cpu" instead of "memif".
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
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
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
// when the receiver is behind (send_raw_burst, memif_link.h): iterations then
// cost the same whatever the back-pressure, so Google Benchmark's iteration
// count gives stable runs.
// Returns the frames memif accepted; sets `failure` when it stops early.
uint64_t send_raw(benchmark::State& state, Sender& s, size_t frame, std::string& failure) {
  uint64_t sent = 0;
  size_t offset = 0;
  Stall stall;
  for (auto _ : state) {
    sent += send_raw_burst(s.port, s.pool.get(), s.source, frame, kBurst, offset, stall, failure);
    if (!failure.empty()) break;
  }
  return sent;
}

// Returns the frames memif accepted from the interface in this run; sets
// `failure` when it stops early.
uint64_t send_stack(benchmark::State& state, Sender& s, net::Interface& a, size_t frame,
                    std::string& failure) {
  const size_t payload = frame - net::kFrameOverhead;
  const uint64_t before = a.counters().tx_frames;
  size_t offset = 0;
  Stall stall;
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.msg_len = static_cast<uint32_t>(s.source.size());
  for (auto _ : state) {
    for (uint16_t i = 0; i < kBurst && failure.empty(); ++i) {
      if (offset + payload > s.source.size()) offset = 0;
      h.offset = static_cast<uint32_t>(offset);
      // A full stage (two bursts) means memif refused the last flushes.
      while (a.tx_room() == 0) {
        if (stall.stuck(a.flush_st(rte_rdtsc()))) {
          failure = "memif took nothing for 1 s";
          break;
        }
      }
      if (failure.empty() && !a.stage_data_st(s.route, h, {s.source.data() + offset, payload})) {
        failure = "the sender's mempool is empty";
      }
      ++h.seq;
      offset += payload;
    }
    if (!failure.empty()) break;
    a.flush_st(rte_rdtsc());
  }
  // Untimed: hand over what is staged, so no frame of this run arrives in the next.
  const uint64_t until = rte_rdtsc() + rte_get_tsc_hz();
  while (a.tx_room() < net::Interface::kStage && rte_rdtsc() < until) a.flush_st(rte_rdtsc());
  return a.counters().tx_frames - before;
}

// A failed run ends the whole benchmark with an exception (main reports it,
// stops the receiver and EAL) rather than SkipWithError: Google Benchmark
// 1.7.1 aborts in its statistics when a skipped repetition ran a different
// iteration count than the others (fixed upstream by its PR #2199), and a
// run that loses frames or the receiver is a fault to look at, not a figure.
void run(benchmark::State& state, Variant v) {
  Sender& s = *g_sender;
  const size_t frame = frame_len(state.range(0), v != Variant::kRaw);
  const std::string name = std::string(v == Variant::kRaw     ? "memif/raw/"
                                       : v == Variant::kStack ? "memif/stack/"
                                                              : "memif/stack_nocsum/") +
                           std::to_string(state.range(0));
  std::string failure;
  Report ack;
  if (!s.peer.start(v, static_cast<uint32_t>(frame), ack, failure)) {
    throw std::runtime_error(name + ": " + failure);
  }
  const uint64_t wall = clock_ns(CLOCK_MONOTONIC);
  const uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  const uint64_t sent = v == Variant::kRaw ? send_raw(state, s, frame, failure)
                        : v == Variant::kStack
                            ? send_stack(state, s, s.stack, frame, failure)
                            : send_stack(state, s, s.stack_nocsum, frame, failure);
  const double tx_cpu = static_cast<double>(clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu) /
                        static_cast<double>(clock_ns(CLOCK_MONOTONIC) - wall);
  Report r;
  std::string stop_failure;
  if (!s.peer.stop(sent, r, stop_failure)) {
    failure += (failure.empty() ? "" : "; ") + stop_failure;
  }
  if (failure.empty()) {
    if (r.drops != 0) {
      failure = "the receiver's stack dropped " + std::to_string(r.drops) + " frames";
    } else if (r.wrong_length != 0) {
      failure = std::to_string(r.wrong_length) + " frames arrived with the wrong length";
    } else if (r.packets != sent) {
      failure = "the receiver got " + std::to_string(r.packets) + " of the " +
                std::to_string(sent) + " frames memif accepted";
    }
  }
  if (!failure.empty()) throw std::runtime_error(name + ": " + failure);
  const double seconds = static_cast<double>(r.window_ns) / 1e9;
  const auto per_second = [&](double x) { return seconds > 0 ? x / seconds : 0.0; };
  state.counters["pps"] = per_second(static_cast<double>(r.timed_packets));
  state.counters["Gbps"] = per_second(static_cast<double>(r.timed_bytes) * 8 / 1e9);
  state.counters["frame"] = static_cast<double>(frame);
  // Share of its CPU each side got: well below 1, another process shared it.
  state.counters["tx_cpu"] = tx_cpu;
  // Share of the receiver's window spent in empty polls: near 0, the
  // receiver was the bottleneck; well above, the sender was.
  state.counters["rx_idle"] =
      r.window_ns > 0 ? static_cast<double>(r.idle_ns) / static_cast<double>(r.window_ns) : 0.0;
  state.counters["rx_cpu"] =
      r.wall_ns > 0 ? static_cast<double>(r.cpu_ns) / static_cast<double>(r.wall_ns) : 0.0;
}

// RatioReporter with the runs split by CPU share: a repetition in which the
// sender or the receiver had less than `min_share` of its core (another
// process timeshared it) is reported, and counted, under the group
// "memif_shared_cpu" instead of "memif". Nothing is dropped; the "memif"
// rows of the final table are the runs that measured memif, not the
// scheduler. min_share 0 keeps every run in "memif".
class CpuShareReporter : public RatioReporter {
 public:
  explicit CpuShareReporter(double min_share)
      : RatioReporter("pps", "raw"), min_share_(min_share) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> split = runs;
    for (Run& r : split) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const auto tx = r.counters.find("tx_cpu");
      const auto rx = r.counters.find("rx_cpu");
      if (tx == r.counters.end() || rx == r.counters.end()) continue;
      if (std::min(tx->second.value, rx->second.value) >= min_share_) continue;
      std::string& name = r.run_name.function_name;
      if (name.starts_with("memif/")) name.replace(0, 5, "memif_shared_cpu");
    }
    RatioReporter::ReportRuns(split);
  }

 private:
  double min_share_;
};

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
  // --min_cpu_share=X (default 0.9): this benchmark's own flag, taken out
  // before Google Benchmark reads the rest.
  double min_share = 0.9;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    constexpr std::string_view kFlag = "--min_cpu_share=";
    if (std::string_view(argv[i]).starts_with(kFlag)) {
      min_share = std::atof(argv[i] + kFlag.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  int rc = 0;
  try {
    // memif's default abstract socket: a name only, nothing on disk to clean.
    const std::string socket = "/tmp/mercury-bench-" + std::to_string(getpid()) + ".sock";
    // Before EAL: a process must not fork once EAL has started.
    memif::PeerProcess peer(socket);
    mercury::net::Eal eal(mercury::bench::eal_args(
        "memif_rate_bench", {"--lcores=0@0", "--no-telemetry", "--log-level=pmd.net.memif:warning",
                             "--vdev=" + memif::memif_vdev(false, socket)}));
    peer.wait_ready(memif::kReadyTimeoutMs);
    {
      memif::Sender sender(peer);
      memif::g_sender = &sender;
      memif::CpuShareReporter reporter(min_share);
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
  benchmark::Shutdown();
  return rc;
}
