// Server packet rate from pcap replay: a captured trace of everything a
// parameter server received in a 4-worker job, replayed into a server node
// over net_pcap, beside the raw PMD reading the same file on the same vdev,
// in the same run.
//
//   <trace>/raw/1500     a net_pcap port (rx_pcap=<trace>) polled with
//                        rte_eth_rx_burst + rte_pktmbuf_free_bulk until every
//                        frame of the trace is in: the vdev's own rate, the
//                        limit (its cost is libpcap reading the file and one
//                        copy per frame into an mbuf).
//   <trace>/server/1500  a ServerNode (control-plane constructor, the job's 2
//                        shards inline on this core, as one lcore) on such a
//                        port, polled until every frame of the trace is in.
//
// What the server figure covers. The trace is captured once at start
// (pmd-tests/common/replay_job.h: 4 workers, MobileNetV2's tensors divided by
// 2, rank 0's initial parameters and kRounds BSP rounds; every frame the
// server received, acks and control included), and every measurement is ONE
// pass over it with a fresh server, so each frame is new to that server: the
// whole server path runs, not a duplicate filter. Per frame: net_pcap's read,
// parsing and the software checksum checks, the transport receive path (and
// its acks), control messages (declare, then ready), and for data and init
// frames the shard's contribution, the rank-order reduction and SGD on the
// 4th copy, and the fan-out of the update to 4 workers (4 frames built, with
// software UDP checksums, and handed to net_pcap, which drops them: the port
// has no tx_pcap). A pass is checked afterwards: every chunk must have been
// updated 1 + kRounds times, or the measurement is an error.
//
// net_pcap's infinite_rx=1 (the trace again and again) is not used: after
// the first pass every frame is a duplicate the transport drops by sequence
// number, so a figure over it would mostly measure the duplicate filter. One
// pass of a trace large enough to take tens of milliseconds is the honest
// bounded run.
//
// Counter "pps": trace frames per second of the pass (wall time); the ratio
// server / raw is the fraction of the vdev's rate the whole server path
// sustains on one core. "cpu_pps" divides by the polling thread's CPU time
// instead: on these shared 2-core machines a pass can lose half its wall
// time to other processes, and cpu_pps shows the work alone. Run (see
// benchmarks/replay/README.md):
//   build/benchmarks/replay/replay_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_bus_vdev.h>
#include <rte_cycles.h>
#include <rte_dev.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../apps/common/synthetic.h"
#include "bench_eal.h"
#include "files.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "node/loop.h"
#include "ratio_reporter.h"
#include "replay_job.h"

namespace mercury {
namespace {

constexpr uint32_t kRounds = 3;
constexpr uint64_t kScaleDown = 2;
constexpr uint16_t kBurst = 32;

// CPU time of this thread: the polling core's own work, without the time
// other processes on these shared CPUs took from it.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The counters of a variant: frames per second of wall time ("pps", the one
// compared) and of this thread's CPU time ("cpu_pps").
void report(benchmark::State& state, uint64_t frames, double seconds, double cpu_seconds) {
  if (seconds > 0) state.counters["pps"] = static_cast<double>(frames) / seconds;
  if (cpu_seconds > 0) state.counters["cpu_pps"] = static_cast<double>(frames) / cpu_seconds;
}

struct Setup {
  std::string trace;
  config::JobConfig job;
  std::vector<agg::TensorDecl> decls;
  replay::Capture capture;
  std::unique_ptr<net::Mempool> pool;  // RX mbufs of the replay port (and the server's TX)
  uint32_t probes = 0;                 // vdevs hot-plugged so far (names are never reused)
};
Setup* g = nullptr;

// A net_pcap port reading the trace, with the server node's MAC, started.
struct ReplayPort {
  std::string name;
  std::unique_ptr<net::Port> port;
  ReplayPort() {
    name = "net_pcap" + std::to_string(g->probes++);
    if (rte_dev_probe((name + ",rx_pcap=" + g->trace).c_str()) != 0) {
      throw std::runtime_error("rte_dev_probe " + name);
    }
    const config::NodeConfig& srv = *g->job.servers().front();
    net::MacAddr mac;
    std::copy(srv.mac->octets.begin(), srv.mac->octets.end(), mac.bytes.begin());
    port = std::make_unique<net::Port>(
        net::Port::open(name, *g->pool, net::PortOptions{.mtu = g->job.network.mtu, .mac = mac}));
  }
  ~ReplayPort() {
    port.reset();  // stops and closes it
    rte_eal_hotplug_remove("vdev", name.c_str());
  }
};

void raw_pass(benchmark::State& state) {
  const uint64_t hz = rte_get_tsc_hz();
  double seconds = 0, cpu = 0;
  uint64_t frames = 0;
  for (auto _ : state) {
    ReplayPort rp;
    rte_mbuf* burst[kBurst];
    uint64_t got = 0;
    const double c0 = thread_cpu_seconds();
    const uint64_t t0 = rte_rdtsc();
    // No drain first: the first burst is already the trace.
    while (got < g->capture.frames) {
      const uint16_t n = rp.port->rx_burst(0, burst, kBurst);
      if (n == 0 && rte_rdtsc() - t0 > 30 * hz) break;
      rte_pktmbuf_free_bulk(burst, n);
      got += n;
    }
    const uint64_t t1 = rte_rdtsc();
    cpu += thread_cpu_seconds() - c0;
    if (got != g->capture.frames) {
      state.SkipWithError("the raw loop did not read the whole trace");
      break;
    }
    const double s = static_cast<double>(t1 - t0) / static_cast<double>(hz);
    state.SetIterationTime(s);
    seconds += s;
    frames += got;
  }
  report(state, frames, seconds, cpu);
}

void server_pass(benchmark::State& state) {
  const uint64_t hz = rte_get_tsc_hz();
  const config::JobConfig& job = g->job;
  const config::NodeConfig& srv = *job.servers().front();
  double seconds = 0, cpu = 0;
  uint64_t frames = 0;
  for (auto _ : state) {
    ReplayPort rp;
    net::Interface iface(
        *rp.port, *g->pool, net::LocalAddr{rp.port->mac(), srv.ipv4.value, srv.udp_port},
        net::InterfaceOptions{.udp_checksum = job.network.udp_checksum != config::Checksum::kOff});
    std::vector<server::JobWorker> workers;
    for (const config::NodeConfig* w : job.workers()) {
      net::MacAddr mac;
      std::copy(w->mac->octets.begin(), w->mac->octets.end(), mac.bytes.begin());
      iface.add_static_arp(w->ipv4.value, mac);
      workers.push_back({{w->name, w->ipv4.value, w->udp_port}, 0});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = job.payload_bytes_per_packet();
    sc.optimizer = job::optimizer_config(job.training);
    sc.layout = job::shard_layout(job);
    sc.endpoint =
        job::endpoint_config(job, static_cast<uint16_t>(srv.index), replay::kServerEpoch, hz);
    sc.endpoint.max_messages = 1 << 17;
    sc.endpoint.ingress_capacity = 1 << 17;
    node::Loop loop({.tick_hz = hz});
    server::ServerNode node(std::vector<net::PacketPort*>{&iface}, workers, sc, rte_rdtsc());
    node.attach(loop);
    const double c0 = thread_cpu_seconds();
    const uint64_t t0 = rte_rdtsc();
    uint64_t now = t0;
    while (iface.counters().rx_frames < g->capture.frames && now - t0 < 60 * hz) {
      now = rte_rdtsc();
      loop.pass_st(now);
    }
    const uint64_t t1 = rte_rdtsc();
    cpu += thread_cpu_seconds() - c0;
    const server::ServerCounters c = node.counters_st();
    if (iface.counters().rx_frames != g->capture.frames ||
        c.shards.updates != g->capture.chunks * (1 + kRounds)) {
      char why[160];
      std::snprintf(why, sizeof why, "pass incomplete: %lu of %lu frames, %lu of %lu updates",
                    static_cast<unsigned long>(iface.counters().rx_frames),
                    static_cast<unsigned long>(g->capture.frames),
                    static_cast<unsigned long>(c.shards.updates),
                    static_cast<unsigned long>(g->capture.chunks * (1 + kRounds)));
      state.SkipWithError(why);
      break;
    }
    const double s = static_cast<double>(t1 - t0) / static_cast<double>(hz);
    state.SetIterationTime(s);
    seconds += s;
    frames += g->capture.frames;
  }
  report(state, frames, seconds, cpu);
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) {
  using namespace mercury;
  return bench::run_with_eal(argc, argv, "replay_bench", {}, [] {
    Setup setup;
    g = &setup;
    const pmdtest::ScratchDir dir("replay-bench", "the trace");
    setup.trace = dir.path() + "/trace.pcap";
    // The capture job's ring links, then the replay job: one port, every worker behind it.
    const config::JobConfig capture_job =
        config::load_string(replay::job_yaml({.name = "capture", .mbufs = 8191}), "capture.yaml");
    setup.job = config::load_string(
        replay::job_yaml({.name = "replay", .server_ports = {"net_pcap90,rx_pcap=" + setup.trace}}),
        "replay.yaml");
    setup.decls = agg::parse_model_shapes(apps::read_file(MERCURY_MODELS_DIR "/mobilenet_v2.txt"));
    for (auto& d : setup.decls) d.elements = std::max<uint64_t>(1, d.elements / kScaleDown);
    setup.capture = replay::capture(capture_job, setup.decls, kRounds, setup.trace);
    // BSP holds up to chunks x (workers - 1) mbufs while contributions
    // trickle in, on top of a burst in flight: a pool for all of them.
    setup.pool = std::make_unique<net::Mempool>("replay_pool", 65535, 256,
                                                net::frame_bytes_for_mtu(setup.job.network.mtu));
    std::printf(
        "trace: %lu frames (%.0f MB) received by the server of a 4-worker job: MobileNetV2 / %lu "
        "(%lu chunks of %u bytes), initial parameters + %u BSP rounds\n",
        static_cast<unsigned long>(setup.capture.frames),
        static_cast<double>(std::filesystem::file_size(setup.trace)) / 1e6,
        static_cast<unsigned long>(kScaleDown), static_cast<unsigned long>(setup.capture.chunks),
        setup.job.payload_bytes_per_packet(), kRounds);
    benchmark::RegisterBenchmark("mobilenet_v2/raw/1500", raw_pass)->Iterations(1)->UseManualTime();
    benchmark::RegisterBenchmark("mobilenet_v2/server/1500", server_pass)
        ->Iterations(1)
        ->UseManualTime();
    bench::RatioReporter reporter("pps", "raw");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    g = nullptr;
  });
}
