// Instructions per data packet, for callgrind (repeatable where timings are
// not): runs the link loop of link_loop.h for N packets.
//
//   meson setup /tmp/build-portable -Dnative=false   # valgrind cannot decode AVX-512
//   ninja -C /tmp/build-portable benchmarks/transport/transport_instr
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null transport_instr transport 0 100000
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null transport_instr transport 0 200000
//   instructions per packet = (Ir(200000) - Ir(100000)) / 100000
//
// Variants: transport (protocol only) | both (protocol + wire codec); LOSS in
// per mille of data packets dropped.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "link_loop.h"

using namespace mercury::transport::bench;

template <bool kWithCodec>
int run(uint32_t loss, long packets) {
  LinkLoop<kWithCodec> link(loss);
  while (static_cast<long>(link.packets()) < packets) link.step();
  std::printf("%ld packets, %llu acked, %llu resent\n", packets,
              static_cast<unsigned long long>(link.sender_sink().acked),
              static_cast<unsigned long long>(link.sender().counters().tx.retransmits_fast +
                                              link.sender().counters().tx.retransmits_timeout));
  return link.sender().dead() ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s transport|both LOSS_PER_MILLE PACKETS\n", argv[0]);
    return 2;
  }
  const std::string_view variant = argv[1];
  const auto loss = static_cast<uint32_t>(std::atoi(argv[2]));
  const long packets = std::atol(argv[3]);
  if (variant == "transport") return run<false>(loss, packets);
  if (variant == "both") return run<true>(loss, packets);
  std::fprintf(stderr, "unknown variant %s\n", argv[1]);
  return 2;
}
