// Instruction count per packet, for callgrind (repeatable where timings are
// not). Carves N packets of one mode on one thread, with instant acks:
//
//   meson setup /tmp/build-portable -Dnative=false   # valgrind cannot decode AVX-512
//   ninja -C /tmp/build-portable benchmarks/sched/sched_instr
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null sched_instr strict 100000
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null sched_instr strict 200000
//   instructions per packet = (Ir(200000) - Ir(100000)) / 100000
//
// Modes: strict | fifo | partition (S = 4 MiB, C = 8 MiB): 256 MiB messages,
// carve cost; spread: strict, four peers with a 256 MiB message each at one
// priority, so round-robin alternates peers packet by packet; small: strict,
// one-packet messages, so every packet also pays alloc + submit + drain +
// release (with BURST, BURST of them are submitted per burst).
//
// A third argument BURST carves with next_slices_st() in bursts of BURST
// (drain once per burst) and acknowledges each burst as a transport does:
// one ACK per peer, the bytes of each of its messages summed, one
// on_acked_st() per message. Without it, one next_slice_st() and one
// on_acked_st() per packet (the per-packet path). Same method:
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null sched_instr strict 100000 32
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null sched_instr strict 200000 32
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "sched/port_scheduler.h"

using namespace mercury::sched;

namespace {

enum class Load { kLarge, kSpread, kSmall };

// Queues the next message(s) when the scheduler has run dry.
void refill(PortScheduler& sched, MessagePool& pool, Load load, long sent, size_t burst) {
  const size_t count = load == Load::kSpread  ? 4
                       : load == Load::kSmall ? std::max<size_t>(burst, 1)
                                              : 1;
  for (size_t i = 0; i < count; ++i) {
    Message* m = pool.alloc();
    m->len = load == Load::kSmall ? 1416 : 256u << 20;
    m->priority = static_cast<uint8_t>(load == Load::kSpread ? 5 : (sent + i) % 64);
    m->peer = static_cast<uint16_t>((sent + i) % 4);
    sched.submit(m);
  }
  sched.drain_ingress_st();
}

long per_packet(PortScheduler& sched, MessagePool& pool, Load load, long packets) {
  const PeerMask all = PeerMask::first(kMaxPeers);
  long sent = 0;
  Slice s;
  while (sent < packets) {
    if (!sched.next_slice_st(all, 1416, s)) {
      refill(sched, pool, load, sent, 0);
      continue;
    }
    if (s.kind == SliceKind::kPartitionStart) {
      sched.partition_ready_st(s.msg);
    } else {
      sched.on_acked_st(s.msg, s.len);
      ++sent;
    }
  }
  return sent;
}

constexpr unsigned kPeers = 4;

long bursts(PortScheduler& sched, MessagePool& pool, Load load, long packets, size_t burst) {
  const PeerMask all = PeerMask::first(kMaxPeers);
  Slice out[256];
  long sent = 0;
  while (sent < packets) {
    sched.drain_ingress_st();
    const size_t n = sched.next_slices_st(all, 1416, out, burst);
    if (n == 0) {
      refill(sched, pool, load, sent, burst);
      continue;
    }
    // The burst's ACKs, one per peer as a transport gets them: a peer's
    // packets in a burst are runs of its messages, each run's bytes summed
    // into one on_acked_st().
    Message* run[kPeers] = {};
    uint32_t bytes[kPeers] = {};
    auto fold = [&](Message* m, unsigned p, uint32_t sum) {  // a run of m's packets into p's ACK
      if (run[p] != m) {
        if (run[p] != nullptr) sched.on_acked_st(run[p], bytes[p]);
        run[p] = m;
        bytes[p] = 0;
      }
      bytes[p] += sum;
    };
    Message* last = nullptr;  // message of the current run of data packets, and its peer
    unsigned last_peer = 0;
    uint32_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = out[i];
      if (s.kind == SliceKind::kPartitionStart) {
        sched.partition_ready_st(s.msg);
        --sent;  // a start-up control, not a data packet
        continue;
      }
      if (s.msg != last) {
        if (last != nullptr) fold(last, last_peer, sum);
        last = s.msg;
        last_peer = s.peer;
        sum = 0;
      }
      sum += s.len;
    }
    if (last != nullptr) fold(last, last_peer, sum);
    sent += static_cast<long>(n);
    for (unsigned p = 0; p < kPeers; ++p) {
      if (run[p] != nullptr) sched.on_acked_st(run[p], bytes[p]);
    }
  }
  return sent;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s strict|fifo|partition|spread|small PACKETS [BURST<=256]\n",
                 argv[0]);
    return 2;
  }
  const std::string_view name = argv[1];
  const Load load = name == "small"    ? Load::kSmall
                    : name == "spread" ? Load::kSpread
                                       : Load::kLarge;
  const std::optional<Mode> mode = load != Load::kLarge ? Mode::kStrict : parse_mode(name);
  if (!mode) {
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  const long packets = std::atol(argv[2]);
  const long burst = argc == 4 ? std::atol(argv[3]) : 0;
  if (burst < 0 || burst > 256) {
    std::fprintf(stderr, "BURST must be in 1..256\n");
    return 2;
  }
  MessagePool pool(512);
  SchedulerConfig c;
  c.mode = *mode;
  c.num_peers = kPeers;
  PortScheduler sched(c, pool);
  const long sent = burst == 0 ? per_packet(sched, pool, load, packets)
                               : bursts(sched, pool, load, packets, static_cast<size_t>(burst));
  std::printf("%ld packets\n", sent);
  return 0;
}
