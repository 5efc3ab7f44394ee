// The transport endpoint over a net_ring link, against the raw PMD rate of the
// same vdev carrying the same payload, in the same run.
//
//   ring/raw/<mtu>             a raw rx/tx loop (as testpmd, and as net_rate_bench's
//                              raw): each frame's bytes copied from a source buffer
//                              into the mbuf, sent, received and freed. The limit.
//   ring/raw2copy/<mtu>        the same, and each received payload copied out into a
//                              destination buffer: the two copies the endpoint makes
//                              on one core (frame build, placement), so the ceiling
//                              of a copying stack with both ends on one core.
//   ring/endpoint/<mtu>        one connection: Endpoint a sends 32 MiB (8 messages of
//                              4 MiB) to Endpoint b, which places every payload in a
//                              destination buffer; an iteration ends when a's
//                              completions have all run (every byte acknowledged).
//   ring/endpoint_loss1/<mtu>  the same through the link emulator with 1 % random loss
//                              in both directions (data and ACKs).
//   ring/endpoint_loss1_noaimd/<mtu>  the same with cwnd_floor = window, i.e. no
//                              multiplicative decrease: what AIMD costs on random loss.
// The counter compared is "Gbps": payload bits per second (Mercury payload for the
// endpoint, the same payload bytes per frame for raw).
//
//   xfer/lossfree/<mtu>, xfer/loss1/<mtu>  completion time ("ms") of a 256 MiB
//                              transfer (64 messages of 4 MiB), loss-free and at 1 %
//                              loss; the ratio is loss1 time / loss-free time.
//
//   reorder/endpoint/<gap>     32 MiB over a link that holds 5 % of frames back
//                              behind <gap> later ones (no loss, no duplication):
//                              every retransmission is spurious. Counters per 10^6
//                              data packets: "rtx_per_M" (all resends),
//                              "spurious_per_M" (resends whose original also
//                              arrived, counted by the receiver), "false_loss_per_M"
//                              (declared lost, acked before resent); "fast_per_M"
//                              and "timeout_per_M" split rtx_per_M by the rule
//                              that resent (SACK, or RTO and tail probe), and
//                              "probes_per_M" counts the tail probes.
//
// Both endpoints (or both raw loops) run on one core, polled in turn, so every
// figure is the CPU cost of both ends together, as net_rate_bench's ring/...
// Run (see benchmarks/transport_pmd/README.md):
//   build/benchmarks/transport_pmd/transport_pmd_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_eal.h"
#include "endpoint_pair.h"
#include "messages.h"
#include "net/eal.h"
#include "ratio_reporter.h"

namespace mercury::transport {
namespace {

using BenchLink = mercury::bench::EndpointPair;

constexpr uint32_t kMsgBytes = mercury::bench::MessageSink::kBytes;  // 4 MiB
constexpr uint32_t kMessages = 8;  // per ring/... iteration: 32 MiB
constexpr size_t kSourceBytes = 64u << 20;

// A link of 4095 mbufs per end, impaired by `lp`; without AIMD the congestion
// window may never drop below the window (128).
std::unique_ptr<BenchLink> bench_link(const std::string& name, uint8_t net, uint32_t mtu,
                                      const net::LinkParams& lp, bool aimd = true) {
  return std::make_unique<BenchLink>(
      name, net, pmdtest::RingLinkOptions{.end = {.mtu = mtu, .mbufs = 4095, .impair = lp}},
      nullptr, pmdtest::EndpointOptions{}, aimd ? 0 : 128);
}

struct Setup {
  std::vector<std::byte> source = pmdtest::random_pattern(kSourceBytes, 9);
  std::vector<std::byte> dest = std::vector<std::byte>(kMsgBytes);  // raw2copy's placement
  std::vector<std::unique_ptr<BenchLink>> links;                    // [mtu index * 2 + lossy]
  std::vector<std::unique_ptr<BenchLink>> no_aimd;                  // [mtu index], 1 % loss
  std::vector<std::unique_ptr<BenchLink>> reorder;
  Setup() {
    const uint32_t mtus[] = {1500, 9000};
    for (int m = 0; m < 2; ++m) {
      for (int lossy = 0; lossy < 2; ++lossy) {
        net::LinkParams lp;
        lp.loss = lossy ? 0.01 : 0;
        lp.seed = 100 + m * 2 + lossy;
        links.push_back(bench_link("tb" + std::to_string(m * 2 + lossy),
                                   static_cast<uint8_t>(m * 2 + lossy + 1), mtus[m], lp));
      }
    }
    for (int m = 0; m < 2; ++m) {
      net::LinkParams lp;
      lp.loss = 0.01;
      lp.seed = 150 + m;
      no_aimd.push_back(
          bench_link("tn" + std::to_string(m), static_cast<uint8_t>(5 + m), mtus[m], lp, false));
    }
    for (uint32_t gap : {3u, 10u}) {
      net::LinkParams lp;
      lp.reorder = 0.05;
      lp.reorder_gap = gap;
      lp.seed = 200 + gap;
      reorder.push_back(
          bench_link("tr" + std::to_string(gap), static_cast<uint8_t>(10 + gap), 9000, lp));
    }
  }
  BenchLink& link(int64_t mtu, bool lossy) { return *links[(mtu == 9000 ? 2 : 0) + lossy]; }
};
Setup* g_setup = nullptr;

// The ratio table against `raw`, then each endpoint variant against
// `raw2copy` too, per repetition (the same pairing as RatioReporter).
class TwoLimitReporter final : public mercury::bench::RatioReporter {
 public:
  TwoLimitReporter() : RatioReporter("Gbps", "raw") {}
  void Finalize() override {
    RatioReporter::Finalize();
    std::printf("\nagainst raw2copy (two copies, as the endpoint), per repetition:\n");
    for (const auto& [key, variants] : samples()) {
      const auto limit = variants.find("raw2copy");
      if (limit == variants.end()) continue;
      for (const auto& [variant, values] : variants) {
        if (!variant.starts_with("endpoint")) continue;
        const std::vector<double> r = mercury::bench::ratios(values, limit->second);
        if (r.empty()) continue;
        const auto [mn, mx] = std::minmax_element(r.begin(), r.end());
        std::printf("%-44s %8.3f   [%6.3f, %6.3f]  (n=%zu)\n",
                    (key.group + "/" + variant + "/" + key.arg).c_str(), mercury::bench::median(r),
                    *mn, *mx, r.size());
      }
    }
  }
};

// Sends `messages` x 4 MiB from a to b; returns false if it did not finish in 60 s.
bool transfer(BenchLink& l, uint32_t messages) {
  uint64_t done = 0;
  const std::byte* src = g_setup->source.data();
  for (uint32_t i = 0; i < messages; ++i) {
    MessageMeta meta;
    meta.block_key = i;
    const size_t start = (size_t{i} * 7919 * 64) % (kSourceBytes - kMsgBytes);
    if (l.a.send(0, src + start, kMsgBytes, 0, meta,
                 Completion{&mercury::bench::count_delivered, &done, i}) != SubmitStatus::kQueued) {
      return false;
    }
  }
  return l.poll_until([&] { return done >= messages; });
}

void set_rate(benchmark::State& state, uint64_t payload_bytes) {
  state.counters["Gbps"] =
      benchmark::Counter(static_cast<double>(payload_bytes) * 8 / 1e9, benchmark::Counter::kIsRate);
}

// `copies` 1: the raw loop (one copy, into the mbuf). 2: also copies each
// received payload out into a destination buffer, as the endpoint's receiver
// does: the honest ceiling for a stack that copies on both ends of one core.
void raw_loop(benchmark::State& state, int copies) {
  const auto mtu = static_cast<uint32_t>(state.range(0));
  BenchLink& l = g_setup->link(mtu, false);
  l.settle();
  net::Mempool& pool = l.link.end_a().pool;
  const uint32_t payload = net::payload_per_packet(mtu);
  const size_t frame = mtu + net::kL2Len;
  const uint64_t frames = (uint64_t{kMsgBytes} * kMessages + payload - 1) / payload;
  constexpr uint16_t kBurst = 32;
  rte_mbuf* tx[kBurst];
  rte_mbuf* rx[kBurst];
  size_t offset = 0;
  uint64_t total = 0;
  std::byte* dst = g_setup->dest.data();
  size_t placed = 0;
  for (auto _ : state) {
    uint64_t sent = 0, received = 0;
    while (received < frames) {
      const uint16_t n = static_cast<uint16_t>(std::min<uint64_t>(kBurst, frames - sent));
      if (n > 0 && rte_pktmbuf_alloc_bulk(pool.get(), tx, n) == 0) {
        for (uint16_t i = 0; i < n; ++i) {
          if (offset + frame > kSourceBytes) offset = 0;
          std::memcpy(rte_pktmbuf_mtod(tx[i], void*), g_setup->source.data() + offset, frame);
          offset += frame;
          tx[i]->data_len = tx[i]->pkt_len = static_cast<uint32_t>(frame);
        }
        const uint16_t went = l.link.port_a().tx_burst(0, tx, n);
        if (went < n) rte_pktmbuf_free_bulk(tx + went, n - went);
        sent += went;
      }
      const uint16_t got = l.link.port_b().rx_burst(0, rx, kBurst);
      if (copies == 2) {
        for (uint16_t i = 0; i < got; ++i) {
          if (placed + payload > kMsgBytes) placed = 0;
          std::memcpy(dst + placed,
                      rte_pktmbuf_mtod_offset(rx[i], const std::byte*, frame - payload), payload);
          placed += payload;
        }
      }
      received += got;
      rte_pktmbuf_free_bulk(rx, got);
    }
    total += received * payload;
  }
  set_rate(state, total);
}
void raw(benchmark::State& state) { raw_loop(state, 1); }
void raw2copy(benchmark::State& state) { raw_loop(state, 2); }

void endpoint_variant(benchmark::State& state, BenchLink& l) {
  l.settle();
  for (auto _ : state) {
    if (!transfer(l, kMessages)) {
      state.SkipWithError("transfer did not finish in 60 s");
      return;
    }
  }
  set_rate(state, uint64_t{kMsgBytes} * kMessages * state.iterations());
}
void endpoint(benchmark::State& state) {
  endpoint_variant(state, g_setup->link(state.range(0), false));
}
void endpoint_loss1(benchmark::State& state) {
  endpoint_variant(state, g_setup->link(state.range(0), true));
}
void endpoint_loss1_noaimd(benchmark::State& state) {
  endpoint_variant(state, *g_setup->no_aimd[state.range(0) == 9000 ? 1 : 0]);
}

void xfer(benchmark::State& state, bool lossy) {
  BenchLink& l = g_setup->link(state.range(0), lossy);
  l.settle();
  constexpr uint32_t kBig = 64;  // 256 MiB
  const uint64_t t0 = rte_rdtsc();
  for (auto _ : state) {
    if (!transfer(l, kBig)) {
      state.SkipWithError("transfer did not finish in 60 s");
      return;
    }
  }
  const double ms = double(rte_rdtsc() - t0) * 1e3 / rte_get_tsc_hz() / state.iterations();
  state.counters["ms"] = ms;
  set_rate(state, uint64_t{kMsgBytes} * kBig * state.iterations());
}
void xfer_lossfree(benchmark::State& state) { xfer(state, false); }
void xfer_loss1(benchmark::State& state) { xfer(state, true); }

void reorder(benchmark::State& state) {
  BenchLink& l = *g_setup->reorder[state.range(0) == 3 ? 0 : 1];
  l.settle();
  const EndpointPeerStats tx0 = l.a.peer_stats_st(0);
  const EndpointPeerStats rx0 = l.b.peer_stats_st(0);
  const uint64_t reordered0 = l.link.emu_a()->reordered;
  for (auto _ : state) {
    if (!transfer(l, kMessages)) {
      state.SkipWithError("transfer did not finish in 60 s");
      return;
    }
  }
  l.settle();
  const EndpointPeerStats tx1 = l.a.peer_stats_st(0);
  const EndpointPeerStats rx1 = l.b.peer_stats_st(0);
  const double packets = double(tx1.transport.tx.packets_sent - tx0.transport.tx.packets_sent);
  const double rtx =
      double(tx1.transport.tx.retransmits_fast + tx1.transport.tx.retransmits_timeout -
             tx0.transport.tx.retransmits_fast - tx0.transport.tx.retransmits_timeout);
  state.counters["rtx_per_M"] = rtx / packets * 1e6;
  // Which rule resent them: the SACK rule (fast), or a timeout (RTO or the
  // tail probe, which also counts in tail_probes).
  state.counters["fast_per_M"] =
      double(tx1.transport.tx.retransmits_fast - tx0.transport.tx.retransmits_fast) / packets * 1e6;
  state.counters["timeout_per_M"] =
      double(tx1.transport.tx.retransmits_timeout - tx0.transport.tx.retransmits_timeout) /
      packets * 1e6;
  state.counters["probes_per_M"] =
      double(tx1.transport.tx.tail_probes - tx0.transport.tx.tail_probes) / packets * 1e6;
  state.counters["spurious_per_M"] =
      double(rx1.transport.rx.spurious_retransmits - rx0.transport.rx.spurious_retransmits) /
      packets * 1e6;
  state.counters["false_loss_per_M"] =
      double(tx1.transport.tx.false_losses - tx0.transport.tx.false_losses) / packets * 1e6;
  state.counters["reordered_per_M"] =
      double(l.link.emu_a()->reordered - reordered0) / packets * 1e6;
  set_rate(state, uint64_t{kMsgBytes} * kMessages * state.iterations());
}

BENCHMARK(raw)->Name("ring/raw")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(raw2copy)->Name("ring/raw2copy")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint)->Name("ring/endpoint")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_loss1)->Name("ring/endpoint_loss1")->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(endpoint_loss1_noaimd)
    ->Name("ring/endpoint_loss1_noaimd")
    ->Arg(1500)
    ->Arg(9000)
    ->UseRealTime();
BENCHMARK(xfer_lossfree)->Name("xfer/lossfree")->Arg(1500)->Arg(9000)->Iterations(1)->UseRealTime();
BENCHMARK(xfer_loss1)->Name("xfer/loss1")->Arg(1500)->Arg(9000)->Iterations(1)->UseRealTime();
BENCHMARK(reorder)->Name("reorder/endpoint")->Arg(3)->Arg(10)->UseRealTime();

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) {
  return mercury::bench::run_with_eal(argc, argv, "transport_pmd_bench", {}, [] {
    mercury::transport::Setup setup;
    mercury::transport::g_setup = &setup;
    // Three passes, each interleaved within itself: goodput against raw,
    // completion time at 1 % loss against loss-free, spurious resends.
    {
      mercury::transport::TwoLimitReporter reporter;
      benchmark::RunSpecifiedBenchmarks(&reporter, "^ring/");
    }
    {
      mercury::bench::RatioReporter reporter("ms", "lossfree");
      benchmark::RunSpecifiedBenchmarks(&reporter, "^xfer/");
    }
    benchmark::RunSpecifiedBenchmarks("^reorder/");
    mercury::transport::g_setup = nullptr;
  });
}
