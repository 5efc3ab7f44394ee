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
//   memif/stack_nocsum_copy/<size>  the same with every payload copied into
//                       its mbuf (InterfaceOptions::tx_by_reference off): what
//                       sending payloads by reference saves (docs/net.md).
//
// <size> has net_rate_bench's meaning: 1500 and 9000 give Ethernet frames of
// 1514 and 9014 bytes on every variant; 64 gives 64-byte raw frames and the
// stack's smallest, 98 bytes (an empty Mercury packet).
//
// This process (memif client, CPU 0) runs Google Benchmark and sends; before
// EAL starts it spawns itself with --peer as the receiver (memif server,
// CPU 1), which it drives over a control socket (benchmarks/common/memif_bench.h).
// The figure
// is what the receiver got per second of its own clock, from its first burst
// to its last; every frame memif accepted must arrive (checked each run).
// rx_idle is the share of the receiver's window it spent in empty polls
// (near 0: the receiver limited the rate). tx_cpu and rx_cpu are the share
// of its core each side got; a run where
// either is below --min_cpu_share (default 0.9) measured the scheduler more
// than memif, and is reported under "memif_shared_cpu" instead of "memif"
// (benchmarks/common/cpu_share.h).
// Run (see benchmarks/net/README.md, "net_memif, two processes"):
//   build/benchmarks/net/memif_rate_bench --benchmark_repetitions=5
//       --benchmark_min_time=0.3 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "memif_bench.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ring_link.h"

namespace mercury::bench::memif {
namespace {

constexpr uint16_t kBurst = 32;

// ---------------------------------------------------------------------------
// The receiver process: the memif server, pinned to CPU 1. It polls its port
// for the variant the sender names and counts what arrives; the rate it
// reports is what it received per second of its own clock.

class Receiver {
 public:
  Receiver()
      : pool_("mr_rx", 8191, 256, kMbufFrameBytes),
        port_(net::Port::open("net_memif0", pool_, net::PortOptions{.mtu = kPortMtu})),
        stack_(port_, pool_, net::LocalAddr{kReceiverMac, kReceiverIp, kUdpPort}, {}),
        stack_nocsum_(port_, pool_, stack_.local(), net::InterfaceOptions{.udp_checksum = false}) {}

  /// Takes and frees what an earlier run left queued; returns how many.
  uint64_t drain() { return pmdtest::drain_rx(port_); }

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
        bytes += net::mbuf_of(rx[i].buf)->pkt_len;
        if (rx[i].parsed.payload.size() != payload) ++report_.wrong_length;
        done[i] = net::mbuf_of(rx[i].buf);
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

  [[nodiscard]] uint64_t received() const { return report_.packets; }

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

// ---------------------------------------------------------------------------
// The sender process (Google Benchmark).

struct Sender {
  explicit Sender(Peer& p) : peer(p) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = std::byte(i * 31);
    // Static ARP, as NodeNetworks configures it: the run measures data only.
    stack.add_static_arp(kReceiverIp, kReceiverMac);
    stack_nocsum.add_static_arp(kReceiverIp, kReceiverMac);
    stack_nocsum_copy.add_static_arp(kReceiverIp, kReceiverMac);
    if (!stack.resolve_st(kReceiverIp, kUdpPort, route, rte_rdtsc())) {
      throw std::runtime_error("no route to the receiver");
    }
  }
  void wait_up() { wait_link_up(port); }

  Peer& peer;
  net::Mempool pool{"ms_tx", 8191, 256, kMbufFrameBytes};
  net::Port port = net::Port::open("net_memif0", pool, net::PortOptions{.mtu = kPortMtu});
  net::Interface stack{port, pool, net::LocalAddr{kSenderMac, kSenderIp, kUdpPort}, {}};
  net::Interface stack_nocsum{port, pool, stack.local(),
                              net::InterfaceOptions{.udp_checksum = false}};
  net::Interface stack_nocsum_copy{
      port, pool, stack.local(),
      net::InterfaceOptions{.udp_checksum = false, .tx_by_reference = false}};
  std::vector<std::byte> source = std::vector<std::byte>(64 << 20);
  net::Route route;
};
Sender* g_sender = nullptr;

size_t frame_len(int64_t size_class, bool stack) {
  if (size_class == 64) return stack ? net::kFrameOverhead : 64;
  return static_cast<size_t>(size_class) + net::kL2Len;
}

// An iteration hands kBurst frames to memif, waiting for room in its ring
// when the receiver is behind (send_raw_burst, memif_bench.h): iterations then
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
void run(benchmark::State& state, Variant v, bool copy = false) {
  Sender& s = *g_sender;
  const size_t frame = frame_len(state.range(0), v != Variant::kRaw);
  const std::string name = std::string(v == Variant::kRaw     ? "memif/raw/"
                                       : v == Variant::kStack ? "memif/stack/"
                                       : copy                 ? "memif/stack_nocsum_copy/"
                                                              : "memif/stack_nocsum/") +
                           std::to_string(state.range(0));
  std::string failure;
  Report ack;
  if (!s.peer.start(v, static_cast<uint32_t>(frame), ack, failure)) {
    throw std::runtime_error(name + ": " + failure);
  }
  const uint64_t wall = clock_ns(CLOCK_MONOTONIC);
  const uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  const uint64_t sent =
      v == Variant::kRaw ? send_raw(state, s, frame, failure)
      : v == Variant::kStack
          ? send_stack(state, s, s.stack, frame, failure)
          : send_stack(state, s, copy ? s.stack_nocsum_copy : s.stack_nocsum, frame, failure);
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

void raw(benchmark::State& state) { run(state, Variant::kRaw); }
void stack(benchmark::State& state) { run(state, Variant::kStack); }
void stack_nocsum(benchmark::State& state) { run(state, Variant::kStackNoChecksum); }
void stack_nocsum_copy(benchmark::State& state) { run(state, Variant::kStackNoChecksum, true); }

// Real time: the sender may wait on memif, and the figures are per second.
BENCHMARK(raw)->Name("memif/raw")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack)->Name("memif/stack")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack_nocsum)->Name("memif/stack_nocsum")->Arg(64)->Arg(1500)->Arg(9000)->UseRealTime();
BENCHMARK(stack_nocsum_copy)
    ->Name("memif/stack_nocsum_copy")
    ->Arg(64)
    ->Arg(1500)
    ->Arg(9000)
    ->UseRealTime();

}  // namespace
}  // namespace mercury::bench::memif

int main(int argc, char** argv) {
  namespace memif = mercury::bench::memif;
  return memif::memif_main<memif::Receiver>(
      argc, argv, {.name = "memif_rate_bench", .peer_name = "memif_rate_peer", .counter = "pps"},
      memif::g_sender);
}
