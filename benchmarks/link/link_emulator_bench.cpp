// What the link emulator costs, against the raw rate of the same PMD in the
// same run, and how closely its rate limiter holds a set line rate.
//
//   link/raw/<frame>          rte_eth_tx_burst + rte_eth_rx_burst over a
//                             net_ring link, 32 frames a burst: the limit.
//   link/passthrough/<frame>  the same through a LinkEmulator with every
//                             impairment off (one branch).
//   link/loss/<frame>         loss 1%: every frame goes through the model,
//                             the delay line and poll().
//   link/impaired/<frame>     loss, duplication, reordering and corruption at
//                             1% each plus a 10 us delay.
//   rate/<gbps>g/<frame>      a 1, 10 or 25 Gbit/s limit: the counter
//                             wire_vs_set is the wire rate achieved (frame +
//                             24 bytes of preamble/IFG/FCS, per wall-clock
//                             second) over the set rate; 1.0 is exact.
//
// <frame> is the frame length in bytes. Frames are not filled: the figure is
// the per-frame cost of the stage, which a payload copy would only hide.
// Both ends run on one core. Run with
//   build/benchmarks/link/link_emulator_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
// to interleave the variants; the table at the end gives medians, [min, max]
// and the ratio of each variant to link/raw taken repetition by repetition.
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <optional>
#include <string>

#include "bench_eal.h"
#include "net/eal.h"
#include "net/link_emulator.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ratio_reporter.h"
#include "ring_link.h"

namespace mercury::net {
namespace {

constexpr uint16_t kBurst = 32;

struct Setup {
  Mempool pool_a{"leb_a", 16383, 256, frame_bytes_for_mtu(kMaxMtu)};
  Mempool pool_b{"leb_b", 511, 256, frame_bytes_for_mtu(kMaxMtu)};
  std::pair<Port, Port> ports = Port::ring_link("leb", pool_a, pool_b, PortOptions{.mtu = kMaxMtu});
};
Setup* g_setup = nullptr;

// One pass: a burst of fresh frames offered, then whatever arrived taken.
template <typename Send>
void run(benchmark::State& state, Send send, double set_gbps = 0) {
  Setup& s = *g_setup;
  const uint32_t frame = static_cast<uint32_t>(state.range(0));
  const uint16_t b = s.ports.second.id();
  pmdtest::drain_rx(s.ports.second);
  uint64_t received = 0;
  rte_mbuf* tx[kBurst];
  rte_mbuf* rx[kBurst];
  const uint64_t start = rte_rdtsc();
  for (auto _ : state) {
    const uint64_t now = rte_rdtsc();
    if (rte_pktmbuf_alloc_bulk(s.pool_a.get(), tx, kBurst) != 0) {
      state.SkipWithError("mempool empty");
      break;
    }
    for (rte_mbuf* m : tx) m->data_len = m->pkt_len = frame;
    const uint16_t sent = send(tx, kBurst, now);
    if (sent < kBurst) rte_pktmbuf_free_bulk(tx + sent, kBurst - sent);
    const uint16_t got = rte_eth_rx_burst(b, 0, rx, kBurst);
    received += got;
    rte_pktmbuf_free_bulk(rx, got);
  }
  const double seconds = static_cast<double>(rte_rdtsc() - start) / rte_get_tsc_hz();
  if (set_gbps == 0) {
    // Per CPU second: the cost of the stage, robust to other processes.
    state.counters["pps"] =
        benchmark::Counter(static_cast<double>(received), benchmark::Counter::kIsRate);
  } else if (seconds > 0) {
    // Per wall-clock second: the emulated wire runs on the TSC.
    const double wire_gbps = static_cast<double>(received) *
                             (std::max(frame, kMinWireFrame) + kWireOverheadBytes) * 8 / seconds /
                             1e9;
    state.counters["wire_vs_set"] = wire_gbps / set_gbps;
  }
}

void raw(benchmark::State& state) {
  const uint16_t port = g_setup->ports.first.id();
  run(state,
      [port](rte_mbuf** p, uint16_t n, uint64_t) { return rte_eth_tx_burst(port, 0, p, n); });
}

void emulated(benchmark::State& state, const LinkParams& params, double set_gbps = 0) {
  const uint16_t port = g_setup->ports.first.id();
  std::optional<LinkEmulator> e;
  e.emplace(port, 0, params, g_setup->pool_a.get(), rte_get_tsc_hz());
  run(
      state, [&e](rte_mbuf** p, uint16_t n, uint64_t now) { return e->tx_burst(p, n, now); },
      set_gbps);
  e.reset();  // frees whatever is still queued
  pmdtest::drain_rx(g_setup->ports.second);
}

void passthrough(benchmark::State& state) { emulated(state, LinkParams{}); }

void loss(benchmark::State& state) {
  LinkParams p;
  p.loss = 0.01;
  p.seed = 1;
  emulated(state, p);
}

void impaired(benchmark::State& state) {
  LinkParams p;
  p.loss = p.duplicate = p.reorder = p.corrupt = 0.01;
  p.delay_us = 10;
  p.seed = 1;
  emulated(state, p);
}

template <int kGbps>
void rate(benchmark::State& state) {
  LinkParams p;
  p.rate_gbps = kGbps;
  emulated(state, p, kGbps);
}

BENCHMARK(raw)->Name("link/raw")->Arg(60)->Arg(1514)->Arg(9014);
BENCHMARK(passthrough)->Name("link/passthrough")->Arg(60)->Arg(1514)->Arg(9014);
BENCHMARK(loss)->Name("link/loss")->Arg(60)->Arg(1514)->Arg(9014);
BENCHMARK(impaired)->Name("link/impaired")->Arg(60)->Arg(1514)->Arg(9014);
BENCHMARK(rate<1>)->Name("rate/1g")->Arg(1514)->MinTime(0.2);
BENCHMARK(rate<10>)->Name("rate/10g")->Arg(1514)->Arg(9014)->MinTime(0.2);
BENCHMARK(rate<25>)->Name("rate/25g")->Arg(9014)->MinTime(0.2);

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) {
  return mercury::bench::run_with_eal(argc, argv, "link_emulator_bench", {}, [] {
    mercury::net::Setup setup;
    mercury::net::g_setup = &setup;
    mercury::bench::RatioReporter reporter("pps", "raw");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    mercury::net::g_setup = nullptr;
  });
}
