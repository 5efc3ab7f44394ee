// What packet delivery and slices cost against the message path, over one
// loss-free net_ring link, both endpoints polled by one thread (so every
// figure is both ends' CPU together, as transport_pmd_bench's ring/endpoint).
//
//   ring/message/<mtu>  a sends 32 MiB as 8 messages of 4 MiB (send); b's
//                       MessageReceiver places every payload in a buffer (one
//                       copy). The limit.
//   ring/packet/<mtu>   the same sends; b's PacketReceiver reads each payload's
//                       first word and leaves the mbuf to the endpoint (no copy).
//   ring/hold/<mtu>     as packet, but b keeps every mbuf and frees them four at
//                       a time (a chunk set of four workers, as the server's
//                       shard core does).
//   ring/slices/<mtu>   a sends the same 32 MiB as one send_slice per
//                       packet-sized chunk (offset and logical length per chunk,
//                       as the server's per-chunk sends); b as in packet.
//
// Counter "Gbps": payload bits per second of the transfer (manual time: from
// the first submission to the last completion; the settling passes after it
// are left out); the ratio is each variant against message. "sends" is the
// submissions per 32 MiB. Checked every run (a failure ends the benchmark): the
// transfer completes within 60 s, and no packet of b's finds no receiver.
// Run (see benchmarks/transport_pmd/README.md):
//   build/benchmarks/transport_pmd/slices_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_eal.h"
#include "endpoint_pair.h"
#include "messages.h"
#include "net/eal.h"
#include "ratio_reporter.h"

namespace mercury::bench {
namespace {

using transport::MessageMeta;
using transport::SubmitStatus;

constexpr uint32_t kMsgBytes = MessageSink::kBytes;  // 4 MiB
constexpr uint32_t kMessages = 8;
constexpr uint64_t kTotal = uint64_t{kMsgBytes} * kMessages;
constexpr uint32_t kMtus[] = {1500, 9000};
// Slices: one descriptor per chunk.
constexpr pmdtest::EndpointOptions kEndpoint = {.messages = 32768};

class PacketSink final : public transport::PacketReceiver {
 public:
  bool on_packet(uint16_t, const wire::HeaderFields&, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    rte_mbuf* mbuf = net::mbuf_of(buf);
    uint32_t w = 0;
    if (payload.size() >= 4) std::memcpy(&w, payload.data(), 4);
    sum += w;
    if (!hold) return false;
    held[count++] = mbuf;
    if (count == 4) {
      rte_pktmbuf_free_bulk(held, 4);
      count = 0;
    }
    return true;
  }
  void release() {
    if (count != 0) rte_pktmbuf_free_bulk(held, count);
    count = 0;
  }
  bool hold = false;
  uint64_t sum = 0;

 private:
  rte_mbuf* held[4] = {};
  unsigned count = 0;
};

// Per MTU: the message variant needs b without a PacketReceiver, the packet
// variants b with one; two endpoints cannot share an Interface, so each has
// its own link.
struct Setup {
  std::vector<std::byte> source = pmdtest::random_pattern(kTotal, 3);
  PacketSink packets[2];
  std::unique_ptr<EndpointPair> message[2], packet[2];
  Setup() {
    for (int m = 0; m < 2; ++m) {
      const std::string mtu = std::to_string(kMtus[m]);
      const pmdtest::RingLinkOptions link{.end = {.mtu = kMtus[m], .mbufs = 4095}};
      message[m] = std::make_unique<EndpointPair>("sm" + mtu, static_cast<uint8_t>(110 + m), link,
                                                  nullptr, kEndpoint);
      packet[m] = std::make_unique<EndpointPair>("sb" + mtu, static_cast<uint8_t>(120 + m), link,
                                                 &packets[m], kEndpoint);
    }
  }
};
Setup* g = nullptr;

// One transfer of kTotal bytes from a to b, as 8 messages or as one
// send_slice per chunk; returns its seconds (throws if it does not finish).
double transfer(EndpointPair& p, bool slices, uint32_t& submissions) {
  uint64_t done = 0;
  submissions = 0;
  const uint32_t chunk = p.a.max_payload();
  MessageMeta meta;
  meta.dtype = wire::Dtype::kFloat32;
  const uint64_t t0 = rte_rdtsc();
  for (uint32_t i = 0; i < kMessages; ++i) {
    meta.block_key = i;
    const std::byte* part = g->source.data() + size_t{i} * kMsgBytes;
    const transport::Completion c{&count_delivered, &done, i};
    for (uint32_t off = 0; off < kMsgBytes; off += slices ? chunk : kMsgBytes) {
      const SubmitStatus st = slices
                                  ? p.a.send_slice(0, part + off, std::min(chunk, kMsgBytes - off),
                                                   off, kMsgBytes, 0, meta, c)
                                  : p.a.send(0, part, kMsgBytes, 0, meta, c);
      if (st != SubmitStatus::kQueued) throw std::runtime_error("the endpoint refused a send");
      ++submissions;
    }
  }
  if (!p.poll_until([&] { return done >= submissions; })) {
    throw std::runtime_error("a transfer did not complete in 60 s");
  }
  return static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(rte_get_tsc_hz());
}

enum class Variant { kMessage, kPacket, kHold, kSlices };

void run(benchmark::State& state, Variant v) {
  const int m = state.range(0) == 9000 ? 1 : 0;
  EndpointPair& p = v == Variant::kMessage ? *g->message[m] : *g->packet[m];
  g->packets[m].hold = v == Variant::kHold;
  uint32_t submissions = 0;
  for (auto _ : state) {
    state.SetIterationTime(transfer(p, v == Variant::kSlices, submissions));
    g->packets[m].release();
    p.settle();  // the last ACKs
  }
  g->packets[m].hold = false;
  if (p.b.counters_st().drops[static_cast<size_t>(transport::EndpointDrop::kNoReceiver)] != 0) {
    throw std::runtime_error("packets found no receiver");
  }
  state.counters["Gbps"] = benchmark::Counter(
      static_cast<double>(kTotal * state.iterations()) * 8 / 1e9, benchmark::Counter::kIsRate);
  state.counters["sends"] = submissions;
}

void message(benchmark::State& state) { run(state, Variant::kMessage); }
void packet(benchmark::State& state) { run(state, Variant::kPacket); }
void hold(benchmark::State& state) { run(state, Variant::kHold); }
void slices(benchmark::State& state) { run(state, Variant::kSlices); }

BENCHMARK(message)->Name("ring/message")->Arg(1500)->Arg(9000)->UseManualTime();
BENCHMARK(packet)->Name("ring/packet")->Arg(1500)->Arg(9000)->UseManualTime();
BENCHMARK(hold)->Name("ring/hold")->Arg(1500)->Arg(9000)->UseManualTime();
BENCHMARK(slices)->Name("ring/slices")->Arg(1500)->Arg(9000)->UseManualTime();

}  // namespace
}  // namespace mercury::bench

int main(int argc, char** argv) {
  namespace bench = mercury::bench;
  return bench::run_with_eal(argc, argv, "slices_bench", {}, [] {
    bench::Setup setup;
    bench::g = &setup;
    bench::RatioReporter reporter("Gbps", "message");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    bench::g = nullptr;
  });
}
