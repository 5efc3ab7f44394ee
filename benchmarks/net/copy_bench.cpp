// The two per-byte passes of the receive path, against the memory limits of
// the same bytes in the same run (no DPDK):
//
//   checksum/limit/<n>  the read limit: every 64-byte line of n-byte slices, taken
//                       in turn from a 64 MiB buffer (L3 or memory, as a
//                       stream of payloads is), loaded and ORed into four
//                       accumulators with copy_partial_sum's prefetch
//                       (every line, sixteen ahead); nothing less reads the
//                       bytes.
//   checksum/sum/<n>    net::partial_sum over the same slices (the receive
//                       path's UDP checksum, which in use reads a frame just
//                       written, so without a prefetch).
//   checksum/copy_sum/<n>  net::copy_partial_sum of the same slices into a hot
//                       16 KiB destination (the send path's fill: copy and
//                       sum in one pass, prefetching sixteen lines ahead).
//   checksum/sum_1acc/<n>  partial_sum with one accumulator pair, as it was
//                       before four lines per step: what that is worth on
//                       data not in L1.
//   place/limit/<n>     the write limit: n-byte slices of a 32 MiB destination
//                       filled in turn with non-temporal stores of a register
//                       (the write bandwidth, no source read).
//   place/stream/<n>    net::stream_copy of a payload from a hot 16 KiB
//                       source (as an mbuf is) into each slice in turn: the
//                       endpoint's placement of a large message.
//   place/memcpy/<n>    the same with memcpy, as the endpoint placed before.
//
// The counter is "GBps" (bytes per second / 1e9); each variant's ratio is to
// its group's limit in the same repetition.
// Run (see benchmarks/net/README.md, "copy: the per-byte passes"):
//   build/benchmarks/net/copy_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include "net/checksum.h"
#include "net/stream_copy.h"
#include "ratio_reporter.h"

namespace mercury::bench {
namespace {

constexpr size_t kSourceBytes = 64u << 20;
constexpr size_t kDestinationBytes = 32u << 20;
constexpr size_t kHotBytes = 16u << 10;

std::vector<std::byte>& source() {
  static std::vector<std::byte> s = [] {
    std::vector<std::byte> v(kSourceBytes);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::byte(i * 31 + (i >> 12));
    return v;
  }();
  return s;
}

std::vector<std::byte>& destination() {
  static std::vector<std::byte> d(kDestinationBytes + 64, std::byte{1});
  return d;
}

void count(benchmark::State& state, size_t bytes_per_iteration) {
  state.counters["GBps"] =
      benchmark::Counter(static_cast<double>(state.iterations() * bytes_per_iteration) / 1e9,
                         benchmark::Counter::kIsRate);
}

#if defined(__AVX512BW__)
// The read limit: four lines in flight per step, an OR each.
uint64_t read_lines(const std::byte* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    // As copy_partial_sum does: every line, sixteen lines ahead, into the
    // next slice at the end.
    for (size_t j = 0; j < 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 1024 + 64 * j), _MM_HINT_T0);
    }
    a = _mm512_or_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_or_si512(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_or_si512(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_or_si512(d, _mm512_loadu_si512(p + i + 192));
  }
  for (; i + 64 <= n; i += 64) a = _mm512_or_si512(a, _mm512_loadu_si512(p + i));
  const __m512i all = _mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, all);
  uint64_t r = 0;
  for (const uint64_t l : lanes) r |= l;
  return r;
}

// partial_sum's former 64-byte loop: one pair of accumulators, one line
// per step (net/checksum.h has the current one).
uint64_t sum_one_line_per_step(const std::byte* p, size_t n) {
  const __m512i low = _mm512_set1_epi32(0xffff);
  __m512i a = _mm512_setzero_si512(), b = a;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(p + i);
    a = _mm512_add_epi32(a, _mm512_and_si512(v, low));
    b = _mm512_add_epi32(b, _mm512_maskz_srli_epi32(0xffff, v, 16));
  }
  alignas(64) uint32_t la[16], lb[16];
  _mm512_store_si512(la, a);
  _mm512_store_si512(lb, b);
  uint64_t sum = 0;
  for (int k = 0; k < 16; ++k) sum += uint64_t{la[k]} + lb[k];
  return net::partial_sum(p + i, n - i, sum);
}
#endif

enum class Read { kLimit, kSum, kCopySum, kSumOneLine };

void checksum(benchmark::State& state, Read how) {
  const auto n = static_cast<size_t>(state.range(0));
  const std::byte* base = source().data();
  static std::vector<std::byte> hot(kHotBytes);
  size_t off = 0, to = 0;
  uint64_t acc = 0;
  for (auto _ : state) {
    if (off + n > kSourceBytes) off = 0;
    const std::byte* p = base + off;
    switch (how) {
#if defined(__AVX512BW__)
      case Read::kLimit:
        acc += read_lines(p, n);
        break;
      case Read::kSumOneLine:
        acc += sum_one_line_per_step(p, n);
        break;
#else
      case Read::kLimit:
      case Read::kSumOneLine:
#endif
      case Read::kSum:
        acc += net::partial_sum(p, n);
        break;
      case Read::kCopySum:
        if (to + n > kHotBytes) to = 0;
        acc += net::copy_partial_sum(hot.data() + to, p, n);
        to += 64 * 3;
        break;
    }
    off += n;
  }
  benchmark::DoNotOptimize(acc);
  count(state, n);
}

enum class Write { kLimit, kStream, kMemcpy };

void place(benchmark::State& state, Write how) {
  const auto n = static_cast<size_t>(state.range(0));
  std::byte* base = destination().data();
  static std::vector<std::byte> hot(kHotBytes, std::byte{7});
  size_t off = 0, from = 0;
  for (auto _ : state) {
    if (off + n > kDestinationBytes) off = 0;
    if (from + n > kHotBytes) from = 0;
    switch (how) {
      case Write::kLimit: {
        // Whole lines of the slice, non-temporal, no source.
        auto* d = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(base + off) + 63) &
                                               ~uintptr_t{63});
#if defined(__AVX512F__)
        const __m512i v = _mm512_set1_epi8(3);
        for (size_t i = 0; i + 64 <= n - 64; i += 64) {
          _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), v);
        }
#else
        std::memset(d, 3, n - 64);
#endif
        break;
      }
      case Write::kStream:
        net::stream_copy(base + off, hot.data() + from, n);
        break;
      case Write::kMemcpy:
        std::memcpy(base + off, hot.data() + from, n);
        break;
    }
    off += n;
    from += 64 * 3;
  }
  net::stream_fence();
  benchmark::ClobberMemory();
  count(state, n);
}

void read_limit(benchmark::State& s) { checksum(s, Read::kLimit); }
void sum(benchmark::State& s) { checksum(s, Read::kSum); }
void copy_sum(benchmark::State& s) { checksum(s, Read::kCopySum); }
void sum_1acc(benchmark::State& s) { checksum(s, Read::kSumOneLine); }
void write_limit(benchmark::State& s) { place(s, Write::kLimit); }
void stream(benchmark::State& s) { place(s, Write::kStream); }
void copy(benchmark::State& s) { place(s, Write::kMemcpy); }

// 1416 and 8958: a 1500- and a 9000-byte MTU packet's payload before it was
// rounded down to whole lines (net::payload_per_packet): slices that split
// lines at both ends, the placement's worst case.
BENCHMARK(read_limit)->Name("checksum/limit")->Arg(1416)->Arg(8958);
BENCHMARK(sum)->Name("checksum/sum")->Arg(1416)->Arg(8958);
BENCHMARK(copy_sum)->Name("checksum/copy_sum")->Arg(1416)->Arg(8958);
BENCHMARK(sum_1acc)->Name("checksum/sum_1acc")->Arg(1416)->Arg(8958);
BENCHMARK(write_limit)->Name("place/limit")->Arg(1416)->Arg(8958);
BENCHMARK(stream)->Name("place/stream")->Arg(1416)->Arg(8958);
BENCHMARK(copy)->Name("place/memcpy")->Arg(1416)->Arg(8958);

}  // namespace
}  // namespace mercury::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Built before timing: first touches fault the pages in.
  mercury::bench::source();
  mercury::bench::destination();
  mercury::bench::RatioReporter reporter("GBps", "limit");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
