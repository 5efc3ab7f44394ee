// Mercury header encode and decode, in ns per header. Decode includes every
// validation rule (what the receive path pays); encode writes all kHeaderSize (64) bytes.
// The limit beside them is a plain header-sized copy of the same memory.
//   build/benchmarks/wire/wire_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <array>
#include <cstring>
#include <vector>

#include "ratio_reporter.h"
#include "wire/header.h"

namespace mercury::wire {
namespace {

constexpr size_t kHeaders = 1024;  // cycle through L1-resident headers

std::vector<HeaderFields> fields() {
  std::vector<HeaderFields> v(kHeaders);
  for (size_t i = 0; i < kHeaders; ++i) {
    v[i].type = PacketType::kData;
    v[i].dtype = Dtype::kFloat32;
    v[i].flags = flags::kAckValid;
    v[i].block_key = static_cast<uint32_t>(i);
    v[i].msg_len = 1 << 20;
    v[i].offset = static_cast<uint32_t>(i * 1416 * 4 % (1 << 20)) & ~3u;
    v[i].payload_len = 0;
    v[i].seq = static_cast<uint32_t>(i);
    v[i].sack = i * 0x9e3779b97f4a7c15ull;
  }
  return v;
}

void per_header(benchmark::State& state) {
  state.counters["ns_per_header"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["headers_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void copy(benchmark::State& state) {
  std::vector<std::array<std::byte, kHeaderSize>> src(kHeaders), dst(kHeaders);
  size_t i = 0;
  for (auto _ : state) {
    std::memcpy(dst[i].data(), src[i].data(), kHeaderSize);
    benchmark::DoNotOptimize(dst[i]);
    i = (i + 1) % kHeaders;
  }
  per_header(state);
}

void encode_bench(benchmark::State& state) {
  auto f = fields();
  std::vector<Header> out(kHeaders);
  size_t i = 0;
  for (auto _ : state) {
    encode(f[i], out[i]);
    benchmark::DoNotOptimize(out[i]);
    i = (i + 1) % kHeaders;
  }
  per_header(state);
}

void decode_bench(benchmark::State& state) {
  auto f = fields();
  std::vector<std::array<std::byte, kHeaderSize>> packets(kHeaders);
  for (size_t k = 0; k < kHeaders; ++k) encode(f[k], packets[k]);
  HeaderFields out;
  size_t i = 0;
  for (auto _ : state) {
    Reject r = decode(packets[i], out);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(out);
    i = (i + 1) % kHeaders;
  }
  per_header(state);
}

BENCHMARK(copy)->Name("header/copy_header");
BENCHMARK(encode_bench)->Name("header/encode");
BENCHMARK(decode_bench)->Name("header/decode");

}  // namespace
}  // namespace mercury::wire

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::bench::RatioReporter reporter("headers_per_s", "copy_header");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
