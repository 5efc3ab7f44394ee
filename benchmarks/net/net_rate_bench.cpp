// The packet rate of the project's Ethernet/IPv4/UDP/Mercury path against the
// raw rate of the same PMD, in the same run.
//
//   ring/raw/<size>    a raw rx/tx loop over a net_ring link, as testpmd does,
//                      filling each frame's payload from a buffer (the copy
//                      the stack must do too): the limit.
//   ring/stack/<size>  Interface::stage_data_st (headers, payload copy, UDP
//                      checksum in software) and flush_st on one side,
//                      poll_rx_st (parse + verify every header and checksum)
//                      on the other, on the same link.
//   ring/stack_nocsum/<size>  the same with UDP checksums off (network.udp_checksum:
//                      false), for PMDs without offload where the link has its own CRC.
//
// <size> is the IP MTU class: 1500 and 9000 give Ethernet frames of 1514 and
// 9014 bytes on both variants. 64 gives 64-byte raw frames; the stack's
// smallest frame is 98 bytes (an empty Mercury packet), so that row compares
// packet rates of the smallest frame each can send.
// ring/...: both sides run on one core, so the figure is the per-packet CPU
// cost of send + receive together. ring2core/...: the sender on the main
// lcore, the receiver on lcore 1 (the other CPU), as deployed; the figure is
// what the receiver counts while the sender runs. Two-core figures are only
// meaningful when nothing else runs on the machine. Run (see benchmarks/net/README.md):
//   build/benchmarks/net/net_rate_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_mbuf.h>

#include <atomic>
#include <cstdio>
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
#include "ring_link.h"

namespace mercury::net {
namespace {

constexpr uint16_t kBurst = 32;

struct Setup {
  pmdtest::RingLink link{"nb", 0, {.end = {.mtu = 9000, .mbufs = 8191, .mbuf_cache = 256}}};
  Interface& a = link.a();
  Interface& b = link.b();
  std::pair<Port&, Port&> ports{link.port_a(), link.port_b()};
  Mempool& pool_a = link.end_a().pool;
  // The same ports without UDP checksums: what the checksum costs in software.
  Interface a_nock{ports.first, pool_a, a.local(), InterfaceOptions{.udp_checksum = false}};
  Interface b_nock{ports.second, link.end_b().pool, b.local(),
                   InterfaceOptions{.udp_checksum = false}};
  std::vector<std::byte> source = std::vector<std::byte>(64 << 20);
  Route route;

  Setup() {
    for (size_t i = 0; i < source.size(); ++i) source[i] = std::byte(i * 31);
    if (!link.resolve_a_to_b(route)) throw std::runtime_error("ARP did not resolve");
  }
};
Setup* g_setup = nullptr;

enum class RxMode : int { kIdle, kRaw, kStack, kStackNoChecksum };
std::atomic<int> g_rx_mode{static_cast<int>(RxMode::kIdle)};
std::atomic<bool> g_rx_stop{false};
std::atomic<uint64_t> g_rx_count{0};
// The mode the receiver is running in: a switch completes when it says so,
// so the one-core variants never poll port b at the same time as lcore 1.
std::atomic<int> g_rx_mode_seen{static_cast<int>(RxMode::kIdle)};

// Lets the link drain, switches the receiver's mode, and returns its count.
uint64_t switch_receiver(RxMode mode) {
  g_rx_mode.store(static_cast<int>(mode), std::memory_order_release);
  while (g_rx_mode_seen.load(std::memory_order_acquire) != static_cast<int>(mode)) rte_pause();
  for (uint64_t last = ~0ull; last != g_rx_count.load();) {
    last = g_rx_count.load();
    rte_delay_us_block(2000);
  }
  return g_rx_count.load();
}

// Stops lcore 1 polling and empties the link from this thread, so a variant
// never receives what the previous one left behind.
void idle_receiver() {
  switch_receiver(RxMode::kIdle);
  rte_mbuf* burst[kBurst];
  for (int idle = 0; idle < 64;) {
    const uint16_t got = g_setup->ports.second.rx_burst(0, burst, kBurst);
    rte_pktmbuf_free_bulk(burst, got);
    idle = got == 0 ? idle + 1 : 0;
  }
}

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
  idle_receiver();
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
  idle_receiver();
  Setup& s = *g_setup;
  const uint64_t drops_before = b.counters().total_drops();
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
    for (uint16_t i = 0; i < got; ++i) done[i] = mbuf_of(rx[i].buf);
    rte_pktmbuf_free_bulk(done, got);
  }
  if (b.counters().total_drops() != drops_before) state.SkipWithError("the stack dropped frames");
  finish(state, received, frame);
}

void stack(benchmark::State& state) { stack_path(state, g_setup->a, g_setup->b); }
void stack_nock(benchmark::State& state) { stack_path(state, g_setup->a_nock, g_setup->b_nock); }

// ---------------------------------------------------------------------------
// Two cores, as deployed: the sender on the main lcore, the receiver on lcore
// 1 (the other CPU), polling all the time. The figure is what the receiver
// counts per second of the sender's run.

int receiver_main(void*) {
  Setup& s = *g_setup;
  rte_mbuf* burst[kBurst];
  RxPacket rx[kBurst];
  while (!g_rx_stop.load(std::memory_order_relaxed)) {
    uint16_t got = 0;
    const int mode = g_rx_mode.load(std::memory_order_acquire);
    g_rx_mode_seen.store(mode, std::memory_order_release);
    if (mode == static_cast<int>(RxMode::kIdle)) {
      rte_pause();
      continue;
    }
    if (mode == static_cast<int>(RxMode::kStack) ||
        mode == static_cast<int>(RxMode::kStackNoChecksum)) {
      Interface& b = mode == static_cast<int>(RxMode::kStack) ? s.b : s.b_nock;
      got = b.poll_rx_st(rx, kBurst, rte_rdtsc());
      for (uint16_t i = 0; i < got; ++i) burst[i] = mbuf_of(rx[i].buf);
    } else {
      got = s.ports.second.rx_burst(0, burst, kBurst);
    }
    if (got > 0) {
      rte_pktmbuf_free_bulk(burst, got);
      g_rx_count.fetch_add(got, std::memory_order_relaxed);
    }
  }
  return 0;
}

void two_core(benchmark::State& state, RxMode mode, Interface* a) {
  Setup& s = *g_setup;
  const bool stack_path = mode != RxMode::kRaw;
  Interface& b = mode == RxMode::kStack ? s.b : s.b_nock;
  const size_t frame = frame_len(state.range(0), stack_path);
  const size_t payload = frame - kFrameOverhead;
  const uint64_t start = switch_receiver(mode);
  const uint64_t drops_before = b.counters().total_drops();
  size_t offset = 0;
  rte_mbuf* tx[kBurst];
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.msg_len = static_cast<uint32_t>(s.source.size());
  for (auto _ : state) {
    if (stack_path) {
      for (uint16_t i = 0; i < kBurst; ++i) {
        if (offset + payload > s.source.size()) offset = 0;
        h.offset = static_cast<uint32_t>(offset);
        ++h.seq;
        if (!a->stage_data_st(s.route, h, {s.source.data() + offset, payload})) break;
        offset += payload;
      }
      a->flush_st(rte_rdtsc());
    } else {
      if (rte_pktmbuf_alloc_bulk(s.pool_a.get(), tx, kBurst) != 0) continue;
      for (auto* m : tx) {
        if (offset + frame > s.source.size()) offset = 0;
        std::memcpy(rte_pktmbuf_mtod(m, void*), s.source.data() + offset, frame);
        offset += frame;
        m->data_len = m->pkt_len = static_cast<uint32_t>(frame);
      }
      const uint16_t sent = s.ports.first.tx_burst(0, tx, kBurst);
      if (sent < kBurst) rte_pktmbuf_free_bulk(tx + sent, kBurst - sent);
    }
  }
  const uint64_t received = g_rx_count.load() - start;
  switch_receiver(mode);           // waits until the link is drained
  switch_receiver(RxMode::kIdle);  // b's counters are the main thread's again
  if (stack_path && b.counters().total_drops() != drops_before) {
    state.SkipWithError("the stack dropped frames");
  }
  finish(state, received, frame);
}

void raw2(benchmark::State& state) { two_core(state, RxMode::kRaw, nullptr); }
void stack2(benchmark::State& state) { two_core(state, RxMode::kStack, &g_setup->a); }
void stack2_nock(benchmark::State& state) {
  two_core(state, RxMode::kStackNoChecksum, &g_setup->a_nock);
}

BENCHMARK(raw)->Name("ring/raw")->Arg(64)->Arg(1500)->Arg(9000);
BENCHMARK(stack)->Name("ring/stack")->Arg(64)->Arg(1500)->Arg(9000);
BENCHMARK(stack_nock)->Name("ring/stack_nocsum")->Arg(64)->Arg(1500)->Arg(9000);
BENCHMARK(raw2)->Name("ring2core/raw")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack2)->Name("ring2core/stack")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack2_nock)
    ->Name("ring2core/stack_nocsum")
    ->Arg(64)
    ->Arg(1500)
    ->Arg(9000)
    ->UseRealTime();

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) {
  return mercury::bench::run_with_eal(argc, argv, "net_rate_bench", {"--lcores=0@0,1@1"}, [] {
    mercury::net::Setup setup;
    mercury::net::g_setup = &setup;
    // The two-core variants' receiver; it idles (drains) during the others.
    if (rte_eal_remote_launch(mercury::net::receiver_main, nullptr, 1) != 0) {
      throw std::runtime_error("cannot start the receiver on lcore 1");
    }
    mercury::bench::RatioReporter reporter("pps", "raw");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    mercury::net::g_rx_stop = true;
    rte_eal_wait_lcore(1);
    mercury::net::g_setup = nullptr;
  });
}
