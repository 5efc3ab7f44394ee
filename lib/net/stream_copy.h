// Copying a received payload into a large destination with non-temporal
// stores.
//
// Placing packets into a message of megabytes writes memory that is not in
// this core's caches: every ordinary store first reads its line (a
// read-for-ownership), and the line then evicts something the datapath
// needs. Non-temporal stores write whole lines through write-combining
// buffers instead, with no read. 1416-byte payloads placed in turn into a
// 32 MiB buffer (benchmarks/net/copy_bench): 0.94-0.98 of the write limit
// with stream_copy(), 0.75-0.77 with memcpy; the memif receiver's goodput
// went from 0.59 to 0.76 of raw with it (benchmarks/README.md, "Measured
// design decisions").
//
// The catch: non-temporal stores are weakly ordered, even against later
// ordinary stores. Call stream_fence() after the last stream_copy() and
// before anything that tells another thread the bytes are there (a
// completion, a release store). Use it only for destinations larger than the
// caches, where the data will not be read back soon from them.
// Pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mercury::net {

/// Destinations of at least this many bytes (a message, a tensor) are
/// written with stream_copy() by the transport endpoint and the worker's pull
/// path: larger than a core's L2, so ordinary stores would read every line
/// first and evict the datapath's own. Smaller ones are copied with memcpy
/// and stay in cache.
inline constexpr uint64_t kStreamDestinationBytes = uint64_t{1} << 20;

/// memcpy(dst, src, n), with the whole 64-byte lines of the destination
/// written by non-temporal stores (the partial lines at either end by
/// ordinary ones). The ranges must not overlap.
inline void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (n < head + 64) {
    std::memcpy(d, s, n);
    return;
  }
  // The partial line at the end takes ordinary stores, which must first
  // read it: ask for it now, so that read overlaps the whole lines' stores.
  // (memif receiver at 1500 bytes, 7 alternating runs of each binary: median
  // 28.5 Gbit/s with it, 25.1 without; better in 5 of the 7 pairs.)
  if (((reinterpret_cast<uintptr_t>(d) + n) & 63) != 0) __builtin_prefetch(d + n - 1, 1, 3);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32)));
#else
    for (size_t k = 0; k < 64; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k)));
    }
#endif
  }
  std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

/// Whether a copy into a destination (a message, a tensor) of
/// `destination_bytes` should stream: kStreamDestinationBytes or more.
inline bool streams_into(uint64_t destination_bytes) {
  return destination_bytes >= kStreamDestinationBytes;
}

/// The placement of a payload into a destination of `destination_bytes`, as
/// the endpoint and the worker's pull path do it: stream_copy() where
/// streams_into() says so (the caller fences before a completion), memcpy
/// otherwise.
inline void place_copy(void* dst, const void* src, size_t n, uint64_t destination_bytes) {
  if (streams_into(destination_bytes)) {
    stream_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

/// Orders every earlier stream_copy() store before the stores that follow.
inline void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace mercury::net
