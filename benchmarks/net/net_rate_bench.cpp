// The packet rate of the project's Ethernet/IPv4/UDP/Mercury path against the
// raw rate of the same PMD, in the same run.
//
//   ring/raw/<size>    a raw rx/tx loop over a net_ring link, as testpmd does,
//                      filling each frame's payload from a buffer (the copy
//                      the stack must do too): the limit.
//   ring/stack/<size>  Interface::stage_data_st (headers + payload copy with
//                      the UDP checksum fused) and flush_st on one side,
//                      poll_rx_st (parse + verify every header and checksum)
//                      on the other, on the same link.
//   ring/stack_nocsum/<size>  the same with UDP checksums off (network.udp_checksum:
//                      false), for PMDs without offload where the link has its own CRC.
//
// <size> is the IP MTU class: 1500 and 9000 give Ethernet frames of 1514 and
// 9014 bytes on both variants. 64 gives 64-byte raw frames; the stack's
// smallest frame is 98 bytes (an empty Mercury packet), so that row compares
// packet rates of the smallest frame each can send.
// Both sides run on one core, so the figure is the per-packet CPU cost of
// send + receive together. Run (see benchmarks/README.md):
//   build/benchmarks/net/net_rate_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "bench_eal.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ratio_reporter.h"

namespace mercury::net {
namespace {

constexpr uint16_t kBurst = 32;

struct Setup {
  Mempool pool_a{"nb_a", 8191, 256, frame_bytes_for_mtu(9000)};
  Mempool pool_b{"nb_b", 8191, 256, frame_bytes_for_mtu(9000)};
  std::pair<Port, Port> ports = Port::ring_link("nb", pool_a, pool_b, PortOptions{.mtu = 9000});
  Interface a{ports.first, pool_a, LocalAddr{ports.first.mac(), 0x0a000001, 47100}, {}};
  Interface b{ports.second, pool_b, LocalAddr{ports.second.mac(), 0x0a000002, 47100}, {}};
  // The same ports without UDP checksums: what the checksum costs in software.
  Interface a_nock{ports.first, pool_a, a.local(), InterfaceOptions{.udp_checksum = false}};
  Interface b_nock{ports.second, pool_b, b.local(), InterfaceOptions{.udp_checksum = false}};
  std::vector<std::byte> source = std::vector<std::byte>(64 << 20);
  Route route;

  Setup() {
    for (size_t i = 0; i < source.size(); ++i) source[i] = std::byte(i * 31);
    RxPacket rx[kBurst];
    for (int i = 0; i < 100 && !a.resolve_st(b.local().ip, 47100, route, rte_rdtsc()); ++i) {
      a.flush_st(rte_rdtsc());
      b.poll_rx_st(rx, kBurst, rte_rdtsc());
      b.flush_st(rte_rdtsc());
      a.poll_rx_st(rx, kBurst, rte_rdtsc());
    }
  }
};
Setup* g_setup = nullptr;

size_t frame_len(int64_t size_class, bool stack) {
  if (size_class == 64) return stack ? kFrameOverhead : 64;
  return static_cast<size_t>(size_class) + kL2Len;
}

void finish(benchmark::State& state, uint64_t packets, size_t frame) {
  state.counters["pps"] =
      benchmark::Counter(static_cast<double>(packets), benchmark::Counter::kIsRate);
  state.counters["Gbps"] = benchmark::Counter(static_cast<double>(packets * frame * 8) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["frame"] = static_cast<double>(frame);
}

void raw(benchmark::State& state) {
  Setup& s = *g_setup;
  const size_t frame = frame_len(state.range(0), false);
  uint64_t received = 0;
  size_t offset = 0;
  rte_mbuf* tx[kBurst];
  rte_mbuf* rx[kBurst];
  for (auto _ : state) {
    if (rte_pktmbuf_alloc_bulk(s.pool_a.get(), tx, kBurst) != 0) {
      state.SkipWithError("mempool empty");
      break;
    }
    for (uint16_t i = 0; i < kBurst; ++i) {
      if (offset + frame > s.source.size()) offset = 0;
      std::memcpy(rte_pktmbuf_mtod(tx[i], void*), s.source.data() + offset, frame);
      offset += frame;
      tx[i]->data_len = tx[i]->pkt_len = static_cast<uint32_t>(frame);
    }
    const uint16_t sent = s.ports.first.tx_burst(0, tx, kBurst);
    if (sent < kBurst) rte_pktmbuf_free_bulk(tx + sent, kBurst - sent);
    const uint16_t got = s.ports.second.rx_burst(0, rx, kBurst);
    received += got;
    rte_pktmbuf_free_bulk(rx, got);
  }
  finish(state, received, frame);
}

void stack_path(benchmark::State& state, Interface& a, Interface& b) {
  Setup& s = *g_setup;
  const size_t frame = frame_len(state.range(0), true);
  const size_t payload = frame - kFrameOverhead;
  uint64_t received = 0;
  size_t offset = 0;
  RxPacket rx[kBurst];
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.msg_len = static_cast<uint32_t>(s.source.size());
  for (auto _ : state) {
    const uint64_t now = rte_rdtsc();
    for (uint16_t i = 0; i < kBurst; ++i) {
      if (offset + payload > s.source.size()) offset = 0;
      h.offset = static_cast<uint32_t>(offset);
      ++h.seq;
      if (!a.stage_data_st(s.route, h, {s.source.data() + offset, payload})) break;
      offset += payload;
    }
    a.flush_st(now);
    const uint16_t got = b.poll_rx_st(rx, kBurst, now);
    received += got;
    rte_mbuf* done[kBurst];
    for (uint16_t i = 0; i < got; ++i) done[i] = rx[i].mbuf;
    rte_pktmbuf_free_bulk(done, got);
  }
  if (b.counters().total_drops() != 0) state.SkipWithError("the stack dropped frames");
  finish(state, received, frame);
}

void stack(benchmark::State& state) { stack_path(state, g_setup->a, g_setup->b); }
void stack_nock(benchmark::State& state) { stack_path(state, g_setup->a_nock, g_setup->b_nock); }

BENCHMARK(raw)->Name("ring/raw")->Arg(64)->Arg(1500)->Arg(9000);
BENCHMARK(stack)->Name("ring/stack")->Arg(64)->Arg(1500)->Arg(9000);
BENCHMARK(stack_nock)->Name("ring/stack_nocsum")->Arg(64)->Arg(1500)->Arg(9000);

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::net::Eal eal(mercury::bench::eal_args("net_rate_bench", {}));
  {
    mercury::net::Setup setup;
    mercury::net::g_setup = &setup;
    mercury::bench::RatioReporter reporter("pps", "raw");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    mercury::net::g_setup = nullptr;
  }
  benchmark::Shutdown();
  return 0;
}
