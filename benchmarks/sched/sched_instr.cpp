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
// carve cost; small: strict, one-packet messages, so every packet also pays
// alloc + submit + drain + release.
//
// A third argument BURST carves with next_slices_st() in bursts of BURST
// (drain once per burst) and acknowledges each burst as a transport does:
// bytes summed per message, one on_acked_st() per message. Without it, one
// next_slice_st() and one on_acked_st() per packet (the per-packet path):
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null sched_instr strict 100000 32
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "sched/port_scheduler.h"

using namespace mercury::sched;

namespace {

Message* fresh(MessagePool& pool, bool small, long sent) {
  Message* m = pool.alloc();
  m->len = small ? 1416 : 256u << 20;
  m->priority = static_cast<uint8_t>(sent % 64);
  m->peer = static_cast<uint16_t>(sent % 4);
  return m;
}

long per_packet(PortScheduler& sched, MessagePool& pool, bool small, long packets) {
  const PeerMask all = PeerMask::first(kMaxPeers);
  long sent = 0;
  Slice s;
  while (sent < packets) {
    if (!sched.next_slice_st(all, 1416, s)) {
      sched.submit(fresh(pool, small, sent));
      sched.drain_ingress_st();
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

long bursts(PortScheduler& sched, MessagePool& pool, bool small, long packets, size_t burst) {
  const PeerMask all = PeerMask::first(kMaxPeers);
  Slice out[256];
  long sent = 0;
  while (sent < packets) {
    sched.drain_ingress_st();
    const size_t n = sched.next_slices_st(all, 1416, out, burst);
    if (n == 0) {
      sched.submit(fresh(pool, small, sent));
      continue;
    }
    // The burst's ACK: runs of one message are summed into one call.
    Message* msg = nullptr;
    uint32_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = out[i];
      if (s.kind == SliceKind::kPartitionStart) {
        sched.partition_ready_st(s.msg);
        continue;
      }
      ++sent;
      if (s.msg != msg) {
        if (msg != nullptr) sched.on_acked_st(msg, bytes);
        msg = s.msg;
        bytes = 0;
      }
      bytes += s.len;
    }
    if (msg != nullptr) sched.on_acked_st(msg, bytes);
  }
  return sent;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s strict|fifo|partition|small PACKETS [BURST<=256]\n", argv[0]);
    return 2;
  }
  const std::string_view name = argv[1];
  const bool small = name == "small";
  const std::optional<Mode> mode = small ? Mode::kStrict : parse_mode(name);
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
  MessagePool pool(64);
  SchedulerConfig c;
  c.mode = *mode;
  c.num_peers = 4;
  PortScheduler sched(c, pool);
  const long sent = burst == 0 ? per_packet(sched, pool, small, packets)
                               : bursts(sched, pool, small, packets, static_cast<size_t>(burst));
  std::printf("%ld packets\n", sent);
  return 0;
}
