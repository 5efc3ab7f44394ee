// The scheduler over a real PMD: lib/sched feeding lib/net on a net_ring link,
// and the scheduler alone against the raw PMD's per-packet budget.
//
//   ring/raw/1500         the raw rx/tx loop (payload copied from a buffer): the limit
//   ring/sched_only/1500  the scheduler alone, no NIC: a TX core's per-burst work
//                         on PortScheduler (strict) with 8 queued 4 MiB messages —
//                         drain_ingress_st, next_slices_st for a burst of 32, the
//                         burst's ACK (bytes summed per message, one on_acked_st
//                         per message), and on completion release + a new
//                         message allocated and submitted. Packets per second.
//   ring/sched_only_4peers/1500  the same with 4 peers, 2 messages each, all at
//                         one priority: round-robin alternates peers per packet
//   ring/sched_only_single/1500  sched_only (one peer) with the per-packet API,
//                         next_slice_st + on_acked_st per packet: the "before"
//   ring/stack/1500       Interface send + receive without a scheduler
//   ring/sched/1500       the same packets carved by PortScheduler (strict) with
//                         next_slices_st from queued 4 MiB messages, each received
//                         burst acknowledged back into the scheduler as above
//
// The figure of merit is raw_pps / sched_only_pps per repetition: the
// scheduler's cost as a fraction of the raw per-packet budget (1/raw). It is
// printed after the ratio table, with 1/sched - 1/stack (the scheduler's cost
// inside the stack) as a fraction of the same budget.
//
//   preempt/<mode>   a 256 MiB priority-63 backlog (64 messages of 4 MiB) is
//                    being sent when a priority-0 message is submitted; the
//                    time and the packets handed to the PMD between that
//                    submit and the urgent message's first packet accepted by
//                    rte_eth_tx_burst. Modes: strict, fifo, partition with
//                    S = 4 MiB and 1 MiB (credit 2S; each partition's start-up
//                    packet, kPartitionStart, must reach the peer before its
//                    data may go).
// Run: build/benchmarks/sched_pmd/sched_pmd_bench --benchmark_repetitions=5
//          --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_eal.h"
#include "net/eal.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ratio_reporter.h"
#include "ring_link.h"
#include "sched/message.h"
#include "sched/port_scheduler.h"

namespace mercury {
namespace {

constexpr uint16_t kBurst = 32;
constexpr uint32_t kMsgBytes = 4u << 20;
constexpr uint32_t kMtu = 1500;
const uint32_t kPayload = net::payload_per_packet(kMtu);

struct Setup {
  pmdtest::RingLink link{"sp", 0, {.end = {.mtu = kMtu, .mbufs = 8191, .mbuf_cache = 256}}};
  net::Interface& a = link.a();
  net::Interface& b = link.b();
  net::Mempool& pool_a = link.end_a().pool;
  std::vector<std::byte> source = std::vector<std::byte>(64u << 20);
  net::Route route;

  Setup() {
    for (size_t i = 0; i < source.size(); ++i) source[i] = std::byte(i * 31);
    if (!link.resolve_a_to_b(route)) throw std::runtime_error("ARP did not resolve");
  }
};
Setup* g = nullptr;

void rate(benchmark::State& state, uint64_t packets) {
  state.counters["pps"] =
      benchmark::Counter(static_cast<double>(packets), benchmark::Counter::kIsRate);
}

void drain_link();

void raw(benchmark::State& state) {
  drain_link();
  // The size comes from the argument at run time, as in net_rate_bench: with a
  // compile-time 1514, GCC inlines the copy as `rep movsq`, which is 4x slower
  // than glibc's memcpy at these unaligned offsets and made this limit 360 ns
  // per packet instead of ~85.
  const size_t frame = static_cast<size_t>(state.range(0)) + net::kL2Len;
  uint64_t received = 0;
  size_t offset = 0;
  rte_mbuf* tx[kBurst];
  rte_mbuf* rx[kBurst];
  for (auto _ : state) {
    if (rte_pktmbuf_alloc_bulk(g->pool_a.get(), tx, kBurst) != 0) break;
    for (auto* m : tx) {
      if (offset + frame > g->source.size()) offset = 0;
      std::memcpy(rte_pktmbuf_mtod(m, void*), g->source.data() + offset, frame);
      offset += frame;
      m->data_len = m->pkt_len = static_cast<uint32_t>(frame);
    }
    const uint16_t sent = g->link.port_a().tx_burst(0, tx, kBurst);
    if (sent < kBurst) rte_pktmbuf_free_bulk(tx + sent, kBurst - sent);
    const uint16_t got = g->link.port_b().rx_burst(0, rx, kBurst);
    received += got;
    rte_pktmbuf_free_bulk(rx, got);
  }
  rate(state, received);
}

// Receives on b; returns data packets received, acknowledging them into
// `sched` when given (block_key indexes `msgs`) as a transport acknowledges a
// burst: bytes summed per message, one on_acked_st() per message.
uint16_t receive(sched::PortScheduler* sched, sched::Message** msgs) {
  net::RxPacket rx[kBurst];
  rte_mbuf* done[kBurst];
  const uint16_t got = g->b.poll_rx_st(rx, kBurst, rte_rdtsc());
  uint16_t data = 0;
  sched::Message* run = nullptr;  // message of the current run of acked packets
  uint32_t run_bytes = 0;
  for (uint16_t i = 0; i < got; ++i) {
    const auto& h = rx[i].parsed.header;
    done[i] = net::mbuf_of(rx[i].buf);
    if (sched == nullptr) {
      ++data;
      continue;
    }
    sched::Message* m = msgs[h.block_key % 256];
    if (m == nullptr) continue;  // not one of this run's messages
    if (h.type == wire::PacketType::kPartitionStart) {
      sched->partition_ready_st(m);
    } else {
      ++data;
      if (m != run) {
        if (run != nullptr) sched->on_acked_st(run, run_bytes);
        run = m;
        run_bytes = 0;
      }
      run_bytes += h.payload_len;
    }
  }
  if (run != nullptr) sched->on_acked_st(run, run_bytes);
  rte_pktmbuf_free_bulk(done, got);
  return data;
}

// Empties the link and the TX stage: benchmarks run interleaved, and frames one
// leaves behind must not be taken for another's.
void drain_link() {
  for (int idle = 0; idle < 100;) {
    g->a.flush_st(rte_rdtsc());
    idle =
        receive(nullptr, nullptr) == 0 && g->a.tx_room() == net::Interface::kStage ? idle + 1 : 0;
  }
}

void stack(benchmark::State& state) {
  drain_link();
  uint64_t received = 0;
  size_t offset = 0;
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.dtype = wire::Dtype::kFloat32;
  h.msg_len = static_cast<uint32_t>(g->source.size());
  for (auto _ : state) {
    for (uint16_t i = 0; i < kBurst; ++i) {
      if (offset + kPayload > g->source.size()) offset = 0;
      h.offset = static_cast<uint32_t>(offset);
      if (!g->a.stage_data_st(g->route, h, {g->source.data() + offset, kPayload})) break;
      offset += kPayload;
    }
    g->a.flush_st(rte_rdtsc());
    received += receive(nullptr, nullptr);
  }
  rate(state, received);
}

// Stages the slices the scheduler picks in one next_slices_st() call, up to
// the interface's room. Returns how many packets were staged. When `urgent_at`
// is given and a slice of priority 0 is carved, *urgent_at becomes the number
// of slices carved before it in this call.
uint16_t carve(sched::PortScheduler& s, uint16_t room, int* urgent_at = nullptr) {
  const sched::PeerMask all = sched::PeerMask::first(1);
  s.drain_ingress_st();
  sched::Slice out[net::Interface::kStage];
  const size_t n = s.next_slices_st(all, kPayload, out, std::min<size_t>(room, std::size(out)));
  for (size_t i = 0; i < n; ++i) {
    const sched::Slice& sl = out[i];
    wire::HeaderFields h;
    h.type = sl.kind == sched::SliceKind::kPartitionStart ? wire::PacketType::kPartitionStart
                                                          : wire::PacketType::kData;
    h.dtype = wire::Dtype::kBytes;
    h.block_key = sl.msg->block_key;
    h.priority = sl.msg->priority;
    h.msg_len = sl.msg->len;
    h.offset = sl.offset;
    g->a.stage_data_st(g->route, h, {sl.msg->data + sl.offset, sl.len});
    if (urgent_at != nullptr && *urgent_at < 0 && sl.msg->priority == 0) {
      *urgent_at = static_cast<int>(i);
    }
  }
  return static_cast<uint16_t>(n);
}

struct Feeder {
  sched::MessagePool pool{256};
  sched::Message* msgs[256] = {};
  uint32_t next_key = 0;
  size_t offset = 0;

  sched::Message* make(uint8_t priority, uint32_t len) {
    sched::Message* m = pool.alloc();
    if (m == nullptr) return nullptr;
    if (offset + len > g->source.size()) offset = 0;
    m->data = g->source.data() + offset;
    offset += len;
    m->len = len;
    m->peer = 0;
    m->priority = priority;
    m->block_key = next_key;
    msgs[next_key] = m;
    next_key = (next_key + 1) % 256;
    return m;
  }
};

void sched_rate(benchmark::State& state) {
  drain_link();
  Feeder f;
  sched::SchedulerConfig cfg;
  sched::PortScheduler s(cfg, f.pool);
  uint64_t received = 0;
  for (int i = 0; i < 8; ++i) s.submit(f.make(static_cast<uint8_t>(i), kMsgBytes));
  for (auto _ : state) {
    carve(s, g->a.tx_room() < kBurst ? g->a.tx_room() : kBurst);
    g->a.flush_st(rte_rdtsc());
    received += receive(&s, f.msgs);
    // Keep 8 messages queued: refill what completed.
    while (s.stats_st().released + 8 > s.stats_st().drained + 0u &&
           s.submit(f.make(static_cast<uint8_t>(received % 64), kMsgBytes))) {
    }
  }
  // Drain so every descriptor returns before the pool goes.
  for (int spin = 0; spin < 100000 && s.has_work_st(); ++spin) {
    carve(s, g->a.tx_room());
    g->a.flush_st(rte_rdtsc());
    receive(&s, f.msgs);
  }
  for (int spin = 0; spin < 1000; ++spin) receive(&s, f.msgs);
  rate(state, received);
}

// The scheduler alone, as the TX core drives it per burst; see the file
// comment. No NIC and no payload access: what is left is the scheduler's own
// per-packet cost, to set against the raw loop's per-packet budget.
// `peers` = 1: messages of varied priorities to one peer, so a burst is one
// run of one message. `peers` = 4: two messages per peer, all at one
// priority, so round-robin alternates peers packet by packet (a tensor
// sharded over 4 servers) and next_slices_st carves them in rotation.
void sched_only(benchmark::State& state, uint16_t peers) {
  Feeder f;
  sched::SchedulerConfig cfg;
  cfg.num_peers = peers;
  sched::PortScheduler s(cfg, f.pool);
  const sched::PeerMask all = sched::PeerMask::first(peers);
  uint8_t next_priority = 0;
  uint16_t next_peer = 0;
  auto queue_one = [&] {
    sched::Message* m = f.make(peers == 1 ? next_priority : 5, kMsgBytes);
    m->peer = next_peer;
    next_peer = static_cast<uint16_t>((next_peer + 1) % peers);
    next_priority = static_cast<uint8_t>((next_priority + 1) % 64);
    s.submit(m);
  };
  for (int i = 0; i < 8; ++i) queue_one();
  uint64_t packets = 0;
  sched::Slice out[kBurst];
  for (auto _ : state) {
    s.drain_ingress_st();
    const size_t n = s.next_slices_st(all, kPayload, out, kBurst);
    packets += n;
    // The burst's ACKs, one per peer as a transport gets them: a peer's
    // packets are runs of its messages, each run's bytes summed into one
    // on_acked_st(). A completed message is replaced, so 8 stay queued.
    sched::Message* run[4] = {};
    uint32_t bytes[4] = {};
    auto ack = [&](unsigned p) {
      if (run[p] != nullptr && s.on_acked_st(run[p], bytes[p])) queue_one();
    };
    auto fold = [&](sched::Message* m, unsigned p, uint32_t sum) {  // a run of m's packets
      if (run[p] != m) {
        ack(p);
        run[p] = m;
        bytes[p] = 0;
      }
      bytes[p] += sum;
    };
    sched::Message* last = nullptr;  // message of the current run, and its peer
    unsigned last_peer = 0;
    uint32_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if (out[i].msg != last) {
        if (last != nullptr) fold(last, last_peer, sum);
        last = out[i].msg;
        last_peer = out[i].peer;
        sum = 0;
      }
      sum += out[i].len;
    }
    if (last != nullptr) fold(last, last_peer, sum);
    for (unsigned p = 0; p < peers; ++p) ack(p);
  }
  benchmark::DoNotOptimize(out);
  // Finish what is queued so every descriptor returns before the pool goes.
  for (size_t n = 1; n != 0;) {
    s.drain_ingress_st();
    n = s.next_slices_st(all, kPayload, out, kBurst);
    for (size_t i = 0; i < n; ++i) s.on_acked_st(out[i].msg, out[i].len);
  }
  rate(state, packets);
}

// Before the burst API, for comparison in the same run: the same load as
// sched_only with one peer, carved with next_slice_st() and acknowledged with
// on_acked_st() packet by packet. One iteration is still a burst of 32.
void sched_only_single(benchmark::State& state) {
  Feeder f;
  sched::SchedulerConfig cfg;
  sched::PortScheduler s(cfg, f.pool);
  const sched::PeerMask all = sched::PeerMask::first(1);
  uint8_t next_priority = 0;
  for (int i = 0; i < 8; ++i) s.submit(f.make(next_priority++, kMsgBytes));
  uint64_t packets = 0;
  sched::Slice sl;
  for (auto _ : state) {
    s.drain_ingress_st();
    for (uint16_t i = 0; i < kBurst && s.next_slice_st(all, kPayload, sl); ++i) {
      ++packets;
      if (s.on_acked_st(sl.msg, sl.len)) {
        s.submit(f.make(next_priority, kMsgBytes));
        next_priority = static_cast<uint8_t>((next_priority + 1) % 64);
      }
    }
  }
  s.drain_ingress_st();
  while (s.next_slice_st(all, kPayload, sl)) s.on_acked_st(sl.msg, sl.len);
  rate(state, packets);
}

void preempt(benchmark::State& state, sched::Mode mode, uint32_t partition) {
  const double hz = static_cast<double>(rte_get_tsc_hz());
  double packets_ahead_sum = 0;
  for (auto _ : state) {
    drain_link();
    Feeder f;
    sched::SchedulerConfig cfg;
    cfg.mode = mode;
    cfg.partition_bytes = partition;
    cfg.credit_bytes = 2 * partition;
    sched::PortScheduler s(cfg, f.pool);
    for (int i = 0; i < 64; ++i) s.submit(f.make(63, kMsgBytes));  // 256 MiB
    // Get the backlog flowing before the urgent message arrives.
    for (int i = 0; i < 200; ++i) {
      carve(s, g->a.tx_room());
      g->a.flush_st(rte_rdtsc());
      receive(&s, f.msgs);
    }
    const uint64_t t0 = rte_rdtsc();
    s.submit(f.make(0, 64 << 10));
    int urgent_at = -1;
    int64_t position = -1;  // the urgent frame's place in the TX stage, once carved
    uint64_t ahead = 0;
    uint64_t t1 = 0;
    while (t1 == 0) {
      const uint64_t sent_before = g->a.counters().tx_frames;
      // Frames already staged (refused by the PMD earlier) leave first.
      const int64_t staged = net::Interface::kStage - g->a.tx_room();
      carve(s, g->a.tx_room(), &urgent_at);
      if (position < 0 && urgent_at >= 0) position = staged + urgent_at;
      g->a.flush_st(rte_rdtsc());
      const auto sent = static_cast<int64_t>(g->a.counters().tx_frames - sent_before);
      if (position >= 0 && sent > position) {
        t1 = rte_rdtsc();  // the urgent frame was accepted by rte_eth_tx_burst
        ahead += static_cast<uint64_t>(position);
      } else {
        ahead += static_cast<uint64_t>(sent);
        if (position >= 0) position -= sent;
      }
      receive(&s, f.msgs);
    }
    state.SetIterationTime(static_cast<double>(t1 - t0) / hz);
    packets_ahead_sum += static_cast<double>(ahead);
    // Drain the rest so descriptors return to the pool.
    while (s.has_work_st()) {
      carve(s, g->a.tx_room());
      g->a.flush_st(rte_rdtsc());
      receive(&s, f.msgs);
    }
    for (int spin = 0; spin < 1000; ++spin) receive(&s, f.msgs);
  }
  state.counters["packets_ahead"] =
      benchmark::Counter(packets_ahead_sum, benchmark::Counter::kAvgIterations);
}

BENCHMARK(raw)->Name("ring/raw")->Arg(1500);
BENCHMARK_CAPTURE(sched_only, one_peer, 1)->Name("ring/sched_only")->Arg(1500);
BENCHMARK_CAPTURE(sched_only, four_peers, 4)->Name("ring/sched_only_4peers")->Arg(1500);
BENCHMARK(sched_only_single)->Name("ring/sched_only_single")->Arg(1500);
BENCHMARK(stack)->Name("ring/stack")->Arg(1500);
BENCHMARK(sched_rate)->Name("ring/sched")->Arg(1500);
BENCHMARK_CAPTURE(preempt, strict, sched::Mode::kStrict, 4u << 20)
    ->Name("preempt/strict")
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(preempt, fifo, sched::Mode::kFifo, 4u << 20)
    ->Name("preempt/fifo")
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(preempt, part4m, sched::Mode::kPartition, 4u << 20)
    ->Name("preempt/partition_4MiB")
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(preempt, part1m, sched::Mode::kPartition, 1u << 20)
    ->Name("preempt/partition_1MiB")
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMicrosecond);

// The ratio table, plus the figure the scheduler is judged by: per
// repetition i (benchmarks interleaved), raw_i / sched_only_i = the fraction
// of the raw per-packet budget the scheduler costs, and (1/sched_i -
// 1/stack_i) / (1/raw_i) for the scheduler inside the stack.
class BudgetReporter : public bench::RatioReporter {
 public:
  BudgetReporter() : RatioReporter("pps", "raw") {}
  void Finalize() override {
    RatioReporter::Finalize();
    const auto pps = [&](const char* variant) { return values("ring", variant, "1500"); };
    const std::vector<double> raw = pps("raw"), alone = pps("sched_only"),
                              alone4 = pps("sched_only_4peers"), single = pps("sched_only_single"),
                              stack = pps("stack"), sched = pps("sched");
    std::vector<double> cost, cost4, cost1, inside, ns_alone, ns_alone4, ns_single, ns_raw;
    for (size_t i = 0; i < raw.size(); ++i) {
      ns_raw.push_back(1e9 / raw[i]);
      if (i < alone.size()) {
        cost.push_back(raw[i] / alone[i]);
        ns_alone.push_back(1e9 / alone[i]);
      }
      if (i < alone4.size()) {
        cost4.push_back(raw[i] / alone4[i]);
        ns_alone4.push_back(1e9 / alone4[i]);
      }
      if (i < single.size()) {
        cost1.push_back(raw[i] / single[i]);
        ns_single.push_back(1e9 / single[i]);
      }
      if (i < stack.size() && i < sched.size()) {
        inside.push_back((1 / sched[i] - 1 / stack[i]) * raw[i]);
      }
    }
    std::printf("\nscheduler cost as a fraction of the raw per-packet budget (net_ring, 1500 B)\n");
    print("raw per-packet budget, ns", ns_raw, "");
    print("scheduler alone, ns per packet", ns_alone, "");
    print("scheduler alone / raw budget", cost, "   <- raw_pps / sched_only_pps; target < 0.05");
    print("4 peers in rotation, ns per packet", ns_alone4, "");
    print("4 peers in rotation / raw budget", cost4, "");
    print("before: slice by slice, ns per packet", ns_single, "");
    print("before: slice by slice / raw budget", cost1, "");
    print("(1/sched - 1/stack) / raw budget", inside, "");
  }

 private:
  static void print(const char* what, std::vector<double> v, const char* note) {
    if (v.empty()) return;
    const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
    std::printf("  %-34s median %9.4g  [%9.4g, %9.4g]  (n=%zu)%s\n", what, bench::median(v), *mn,
                *mx, v.size(), note);
  }
};

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) {
  return mercury::bench::run_with_eal(argc, argv, "sched_pmd_bench", {}, [] {
    mercury::Setup setup;
    mercury::g = &setup;
    mercury::BudgetReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    mercury::g = nullptr;
  });
}
