// Per-packet CPU cost of the transport against the wire codec, same run.
//
//   pkt/codec/<loss>      encode + decode of a data header, and of a pure ACK
//                         every 4 packets: the header work every packet pays
//                         anyway. The limit.
//   pkt/transport/<loss>  the protocol on both ends of one link (link_loop.h):
//                         Peer::send (seq, flags, piggybacked ACK),
//                         Peer::on_packet at the receiver (epoch, duplicate
//                         window, SACK ring, message table), a pure ACK every 4
//                         packets and its processing at the sender (cumulative
//                         + SACK walk, RTT sample, loss detection, cwnd), the
//                         timer every 64 packets. No codec.
//   pkt/both/<loss>       the two together: what a packet costs the net core
//                         beyond payload copies and the NIC.
//
// <loss> is per mille of data packets dropped between the ends (0 or 10): with
// loss, SACK gaps, fast retransmits and resends are on the path. One iteration
// = one data packet sent (first transmission or resend); both ends run on one
// core with a fake clock. Run:
//   transport_bench --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true
//                   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "link_loop.h"
#include "ratio_reporter.h"

namespace mercury::transport::bench {
namespace {

void finish(benchmark::State& state, uint64_t packets) {
  state.counters["pps"] =
      benchmark::Counter(static_cast<double>(packets), benchmark::Counter::kIsRate);
}

// The limit: encode + decode of every header the transport variant handles.
void codec(benchmark::State& state) {
  Dropper dropper(static_cast<uint32_t>(state.range(0)));
  std::array<std::byte, wire::kHeaderSize + kPayload> pkt{};
  std::array<std::byte, wire::kHeaderSize> ack_pkt{};
  wire::HeaderFields h, in, ack;
  ack.type = wire::PacketType::kAck;
  ack.epoch = 1;
  uint64_t n = 0;
  uint32_t seq = 0;
  for (auto _ : state) {
    h = {};
    data_header(h, static_cast<uint32_t>(n / kPacketsPerMsg),
                static_cast<uint32_t>(n % kPacketsPerMsg));
    h.seq = seq++;
    h.epoch = 1;
    wire::encode(h, std::span<std::byte, wire::kHeaderSize>(pkt.data(), wire::kHeaderSize));
    if (!dropper.drop()) benchmark::DoNotOptimize(wire::decode(pkt, in));
    if (++n % 4 == 0) {
      ack.ack = seq;
      wire::encode(ack, ack_pkt);
      benchmark::DoNotOptimize(wire::decode(ack_pkt, in));
    }
    benchmark::ClobberMemory();
  }
  finish(state, n);
}

template <bool kWithCodec>
void protocol(benchmark::State& state) {
  LinkLoop<kWithCodec> link(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) {
    while (!link.step()) {
    }
  }
  finish(state, link.packets());
  const auto& tx = link.sender().counters().tx;
  if (link.sender_sink().failed != 0 || link.sender().dead()) state.SkipWithError("peer died");
  state.counters["rtx"] = static_cast<double>(tx.retransmits_fast + tx.retransmits_timeout) /
                          static_cast<double>(link.packets());
}

BENCHMARK(codec)->Name("pkt/codec")->Arg(0)->Arg(10);
BENCHMARK(protocol<false>)->Name("pkt/transport")->Arg(0)->Arg(10);
BENCHMARK(protocol<true>)->Name("pkt/both")->Arg(0)->Arg(10);

}  // namespace
}  // namespace mercury::transport::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::bench::RatioReporter reporter("pps", "codec");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
