// Scheduler benchmarks: the per-packet cost of submit + carve, and the
// preemption latency behind a 256 MiB low-priority backlog in every mode.
//
// Run (interleaved, repeated; see docs/sched.md for the figures):
//   sched_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//               --benchmark_report_aggregates_only=true
//
// Per-packet benchmarks report time per packet (one benchmark iteration = one
// packet). BM_Preemption reports, per urgent message, counters in packets and
// in time at 10 and 100 Gbit/s; its own "time" is the scheduler's CPU time
// from the urgent submit() to the urgent's first packet (for fifo that is the
// CPU time to carve the whole backlog, not a latency anyone waits for on a
// link: read the counters).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "sched/port_scheduler.h"
#include "sched/sim_link.h"

namespace mercury::sched {
namespace {

// 1500-byte MTU minus IPv4, UDP and the Mercury header, as net::payload_per_packet
// gave before it rounded to whole lines (1408): the documented figures used it.
constexpr uint32_t kPayload = 1416;
const PeerMask kAllPeers = PeerMask::first(kMaxPeers);

SchedulerConfig config_for(Mode mode, uint16_t peers = 1, uint32_t s_bytes = 4u << 20,
                           uint32_t c_bytes = 8u << 20) {
  SchedulerConfig c;
  c.mode = mode;
  c.num_peers = peers;
  c.partition_bytes = s_bytes;
  c.credit_bytes = c_bytes;
  c.ingress_capacity = 1024;
  return c;
}

// The consumer's per-packet work as a transport with an instant link would do
// it: carve one slice; a start-up control is acknowledged at once; a data
// slice is acknowledged at once (which completes and frees a message on its
// last packet). Returns false if nothing was eligible.
inline bool packet_step(PortScheduler& sched, uint32_t payload) {
  Slice s;
  if (!sched.next_slice_st(kAllPeers, payload, s)) return false;
  if (s.kind == SliceKind::kPartitionStart) {
    sched.partition_ready_st(s.msg);
  } else {
    sched.on_acked_st(s.msg, s.len);
  }
  return true;
}

Message* fill(MessagePool& pool, uint32_t len, uint8_t priority, uint16_t peer = 0) {
  Message* m = pool.alloc();
  if (m != nullptr) {
    m->len = len;
    m->priority = priority;
    m->peer = peer;
  }
  return m;
}

// Carve cost alone: one 256 MiB message is carved packet by packet (and
// resubmitted when done). Time per packet.
void BM_CarvePerPacket(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  MessagePool pool(4);
  PortScheduler sched(config_for(mode), pool);
  for (auto _ : state) {
    if (!packet_step(sched, kPayload)) {
      sched.submit(fill(pool, 256u << 20, 5));
      sched.drain_ingress_st();
      packet_step(sched, kPayload);
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string(to_string(mode)));
}
BENCHMARK(BM_CarvePerPacket)->Arg(0)->Arg(1)->Arg(2)->ArgName("mode");

// The same load carved with next_slices_st() in bursts of 32, each burst
// acknowledged as a transport does: bytes summed per run of one message, one
// on_acked_st() per run (start-up controls made ready at once). One iteration
// is one burst; ns_per_packet is the figure.
void BM_CarveBurst(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  MessagePool pool(4);
  PortScheduler sched(config_for(mode), pool);
  Slice out[32];
  uint64_t packets = 0;
  for (auto _ : state) {
    sched.drain_ingress_st();
    const size_t n = sched.next_slices_st(kAllPeers, kPayload, out, 32);
    if (n == 0) {
      sched.submit(fill(pool, 256u << 20, 5));
      continue;
    }
    for (size_t i = 0; i < n;) {
      Message* m = out[i].msg;
      if (out[i].kind == SliceKind::kPartitionStart) {
        sched.partition_ready_st(m);
        ++i;
        continue;
      }
      uint32_t bytes = 0;
      const size_t first = i;
      for (; i < n && out[i].msg == m && out[i].kind == SliceKind::kData; ++i) bytes += out[i].len;
      packets += i - first;
      sched.on_acked_st(m, bytes);
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.counters["ns_per_packet"] = benchmark::Counter(
      static_cast<double>(packets), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(to_string(mode)));
}
BENCHMARK(BM_CarveBurst)->Arg(0)->Arg(1)->Arg(2)->ArgName("mode");

// Submit + drain + carve + ack + release, all on one thread, for messages of
// range(0) packets with random priorities: the whole per-packet CPU cost of
// the scheduler, with no cross-core traffic. Time per packet.
void BM_SubmitCarveOneThread(benchmark::State& state) {
  const uint32_t pkts = static_cast<uint32_t>(state.range(0));
  MessagePool pool(64);
  PortScheduler sched(config_for(Mode::kStrict, 4), pool);
  std::mt19937 rng(1);
  uint64_t packets = 0;
  for (auto _ : state) {
    Message* m = fill(pool, pkts * kPayload, static_cast<uint8_t>(rng() % 64),
                      static_cast<uint16_t>(rng() % 4));
    sched.submit(m);
    sched.drain_ingress_st();
    while (packet_step(sched, kPayload)) ++packets;
  }
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.counters["ns_per_packet"] = benchmark::Counter(
      static_cast<double>(packets), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SubmitCarveOneThread)->Arg(1)->Arg(16)->ArgName("pkts_per_msg");

// range(0) producer threads submit messages of range(1) packets with random
// priorities as fast as the pool lets them; this thread is the TX core and
// carves. One iteration = one packet carved; wall-clock time. On a 2-core
// machine 1 producer + consumer fill both cores; 4 producers oversubscribe
// them 2.5x, so this measures contention and preemption of producers, not
// scaling.
void BM_SubmitCarveProducers(benchmark::State& state) {
  const int producers = static_cast<int>(state.range(0));
  const uint32_t pkts = static_cast<uint32_t>(state.range(1));
  MessagePool pool(1024);
  PortScheduler sched(config_for(Mode::kStrict, 4), pool);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> refused{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      std::mt19937 rng(100 + p);
      while (!stop.load(std::memory_order_relaxed)) {
        Message* m = fill(pool, pkts * kPayload, static_cast<uint8_t>(rng() % 64),
                          static_cast<uint16_t>(rng() % 4));
        if (m == nullptr) {
          std::this_thread::yield();
          continue;
        }
        while (!sched.submit(m)) {
          refused.fetch_add(1, std::memory_order_relaxed);
          if (stop.load(std::memory_order_relaxed)) {
            pool.free(m);
            return;
          }
          std::this_thread::yield();
        }
      }
    });
  }
  uint64_t idle_polls = 0;
  for (auto _ : state) {
    while (!packet_step(sched, kPayload)) {
      if (sched.drain_ingress_st() == 0) ++idle_polls;
    }
  }
  stop.store(true);
  for (auto& t : threads) t.join();
  state.SetItemsProcessed(state.iterations());
  state.counters["idle_polls_per_pkt"] =
      static_cast<double>(idle_polls) / static_cast<double>(state.iterations());
  state.counters["submit_full"] = static_cast<double>(refused.load());
}
BENCHMARK(BM_SubmitCarveProducers)
    ->ArgsProduct({{1, 4}, {1, 16}})
    ->ArgNames({"producers", "pkts_per_msg"})
    ->UseRealTime();

// Preemption behind a 256 MiB backlog on the simulated TX loop (sim_link.h):
// W = 64 packets per peer, B = 32, acks D = 16 packet-times after sending
// (19 us at 10 Gbit/s). The urgent 64 KiB message is submitted between two
// packets of a burst at a random point of the backlog.
// range(0): mode; range(1): partition size S in KiB (credit C = 2 S).
void BM_Preemption(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  const uint32_t s_bytes = static_cast<uint32_t>(state.range(1)) << 10;
  const sim::LinkParams lp{64, 32, 16, kPayload};
  std::mt19937 rng(3);
  double ahead_sum = 0, wait_sum = 0, max_ahead = 0;
  for (auto _ : state) {
    MessagePool pool(4);
    PortScheduler sched(config_for(mode, 1, s_bytes ? s_bytes : 1, 2 * (s_bytes ? s_bytes : 1)),
                        pool);
    sim::SimLink link(sched, lp);
    Message* backlog = fill(pool, 256u << 20, 50);
    Message* urgent = fill(pool, 64u << 10, 0);
    sched.submit(backlog);
    const uint64_t inject_after = 2000 + rng() % 20000;
    const uint32_t inject_index = rng() % lp.burst;
    uint64_t sent = 0, ahead = 0, inject_time = 0;
    bool injected = false, first = false;
    std::chrono::steady_clock::time_point t0, t1;
    auto on_slice = [&](const Slice& s, uint64_t now, uint32_t index) {
      if (first) return;
      if (s.msg == urgent && s.kind == SliceKind::kData) {
        t1 = std::chrono::steady_clock::now();
        first = true;
        wait_sum += static_cast<double>(now - inject_time);
        return;
      }
      if (s.msg == backlog && s.kind == SliceKind::kData) {
        ++sent;
        if (injected) ++ahead;
      }
      if (!injected && sent >= inject_after && index == inject_index) {
        t0 = std::chrono::steady_clock::now();
        sched.submit(urgent);
        injected = true;
        inject_time = now + 1;
      }
    };
    while (!first) link.pass(on_slice);
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    ahead_sum += static_cast<double>(ahead);
    max_ahead = std::max(max_ahead, static_cast<double>(ahead));
  }
  const double n = static_cast<double>(state.iterations());
  const double pkt_time_10g = 1500.0 * 8 / 10e9;
  state.counters["pkts_ahead"] = ahead_sum / n;
  state.counters["pkts_ahead_max"] = max_ahead;
  state.counters["wait_pkt_times"] = wait_sum / n;
  state.counters["wait_us_10G"] = wait_sum / n * pkt_time_10g * 1e6;
  state.counters["wait_us_100G"] = wait_sum / n * pkt_time_10g / 10 * 1e6;
  state.SetLabel(std::string(to_string(mode)) +
                 (mode == Mode::kPartition ? " S=" + std::to_string(s_bytes >> 10) + "KiB" : ""));
}
BENCHMARK(BM_Preemption)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({2, 4096})
    ->Args({2, 1024})
    ->ArgNames({"mode", "S_KiB"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(20);

}  // namespace
}  // namespace mercury::sched

BENCHMARK_MAIN();
