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
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "sched/port_scheduler.h"

using namespace mercury::sched;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s strict|fifo|partition|small PACKETS\n", argv[0]);
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
  MessagePool pool(64);
  SchedulerConfig c;
  c.mode = *mode;
  c.num_peers = 4;
  PortScheduler sched(c, pool);
  const PeerMask all = PeerMask::first(kMaxPeers);
  long sent = 0;
  Slice s;
  while (sent < packets) {
    if (!sched.next_slice_st(all, 1416, s)) {
      Message* m = pool.alloc();
      m->len = small ? 1416 : 256u << 20;
      m->priority = static_cast<uint8_t>(sent % 64);
      m->peer = static_cast<uint16_t>(sent % 4);
      sched.submit(m);
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
  std::printf("%ld packets\n", sent);
  return 0;
}
