// Internet checksum (RFC 1071) arithmetic, for IPv4 and UDP.
//
// Sums are kept in 64-bit accumulators of 32-bit words and folded at the end:
// the ones'-complement sum is byte-order independent, so summing native words
// and storing the folded result natively yields the network-order checksum.
// The loops are written so the compiler vectorises them (-O3, AVX2 where the
// host has it).
// Pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace mercury::net {

namespace detail {
#if defined(__AVX2__)
// Adds the 32-bit words of `v` into the 64-bit lanes of two accumulators:
// they cannot overflow for any frame (2^32 words of 2^32 each).
inline void add_words(__m256i v, __m256i& lo, __m256i& hi) {
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_add_epi64(lo, _mm256_unpacklo_epi32(v, zero));
  hi = _mm256_add_epi64(hi, _mm256_unpackhi_epi32(v, zero));
}
#if defined(__AVX512BW__)
// The 16-bit halves of every 32-bit word of `p[0, blocks x 64)`, summed in
// 32-bit lanes: each step adds at most 0xffff per lane, so up to 32768
// blocks (2 MiB) cannot overflow. Summing the halves instead of the words is
// the same ones'-complement sum (2^16 = 1 mod 0xffff) at one operation less
// per vector, and 64-byte vectors halve the loop again. Four lines per step
// into independent accumulators: on a payload not in L1 the loop waits on its
// loads, and four in flight read a 1416-byte payload from L3 about twice as
// fast as one (benchmarks/net/copy_bench). With `dst` (kCopy), each block is
// also stored there: the copy and the sum in one pass over the source, which
// is the send path's fill from a message not in cache, so that loop also
// prefetches every line sixteen lines ahead, into the next packet's payload
// at the end (memif stack / raw at 1500: 0.953 against 0.901 with two lines of
// four prefetched eight ahead; 24 and 32 ahead were no better:
// benchmarks/README.md, "Measured design decisions").
// The receive path's sum (kCopy false) reads a frame the PMD has just
// written: a prefetch there only evicts lines (it cost the memif receiver
// 15 % of its goodput). kSum false: the copy alone, in the same loop
// (returns 0).
template <bool kCopy, bool kSum = true>
inline uint64_t sum_halves_512(const unsigned char* p, size_t blocks, unsigned char* dst) {
  const __m512i low = _mm512_set1_epi32(0xffff);
  __m512i a[4], b[4];
  for (int j = 0; j < 4; ++j) a[j] = b[j] = _mm512_setzero_si512();
  size_t k = 0;
  for (; k + 4 <= blocks; k += 4) {
    if constexpr (kCopy) {
      // Sixteen lines ahead: past the end this warms the next payload, which
      // in a stream of packets from one message follows this one.
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(p + 64 * (k + 16 + j)), _MM_HINT_T0);
      }
    }
    __m512i v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm512_loadu_si512(p + 64 * (k + j));
    for (int j = 0; j < 4; ++j) {
      if constexpr (kCopy) _mm512_storeu_si512(dst + 64 * (k + j), v[j]);
      if constexpr (kSum) {
        a[j] = _mm512_add_epi32(a[j], _mm512_and_si512(v[j], low));
        b[j] = _mm512_add_epi32(b[j], _mm512_maskz_srli_epi32(0xffff, v[j], 16));
      }
    }
  }
  for (; k < blocks; ++k) {
    const __m512i v = _mm512_loadu_si512(p + 64 * k);
    if constexpr (kCopy) _mm512_storeu_si512(dst + 64 * k, v);
    if constexpr (kSum) {
      a[0] = _mm512_add_epi32(a[0], _mm512_and_si512(v, low));
      b[0] = _mm512_add_epi32(b[0], _mm512_maskz_srli_epi32(0xffff, v, 16));
    }
  }
  if constexpr (!kSum) return 0;
  // Every lane of a[] together holds at most 32768 x 0xffff < 2^31, and so
  // does b[]: their total fits 32 bits. Then widen to 64 for the reduction.
  const __m512i t = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3])),
      _mm512_add_epi32(_mm512_add_epi32(b[0], b[1]), _mm512_add_epi32(b[2], b[3])));
  // Widened as 64-bit lanes: the low and the high word of each.
  const __m512i lo = _mm512_and_si512(t, _mm512_set1_epi64(0xffffffff));
  const __m512i hi = _mm512_maskz_srli_epi64(0xff, t, 32);  // maskz: GCC 12 warns otherwise
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(lo, hi));
  uint64_t sum = 0;
  for (const uint64_t l : lanes) sum += l;
  return sum;
}
// sum_halves_512 over the whole 64-byte blocks of `p[0, len)`, in pieces
// its 32-bit lanes can hold (2 MiB each); `done` is set to the bytes covered.
template <bool kCopy>
inline uint64_t sum_blocks_512(const unsigned char* p, size_t len, unsigned char* dst,
                               size_t& done) {
  constexpr size_t kMaxBlocks = 32768;
  uint64_t acc = 0;
  done = 0;
  for (size_t blocks = len / 64; blocks > 0;) {
    const size_t n = blocks < kMaxBlocks ? blocks : kMaxBlocks;
    acc += sum_halves_512<kCopy>(p + done, n, kCopy ? dst + done : nullptr);
    done += 64 * n;
    blocks -= n;
  }
  return acc;
}
#endif
inline uint64_t horizontal(__m256i lo, __m256i hi) {
  const __m256i s = _mm256_add_epi64(lo, hi);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  // Each lane holds < 2^62, so the sum of the four cannot wrap 64 bits.
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif
}  // namespace detail

/// Partial ones'-complement sum of `len` bytes, to be folded with fold_sum().
/// The bytes are treated as if they start at an even offset of the summed
/// region; callers summing several pieces must keep each piece even-length
/// except the last.
inline uint64_t partial_sum(const void* data, size_t len, uint64_t acc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
#if defined(__AVX512BW__)
  if (len >= 128) acc += detail::sum_blocks_512<false>(p, len, nullptr, i);
#endif
#if defined(__AVX2__)
  if (len - i >= 64) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (; i + 64 <= len; i += 64) {
      detail::add_words(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), lo, hi);
      detail::add_words(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)), lo, hi);
    }
    acc += detail::horizontal(lo, hi);
  }
#endif
  uint64_t a0 = acc, a1 = 0;
  for (; i + 8 <= len; i += 8) {
    uint32_t w0, w1;
    std::memcpy(&w0, p + i, 4);
    std::memcpy(&w1, p + i + 4, 4);
    a0 += w0;
    a1 += w1;
  }
  a0 += a1;
  if (i + 4 <= len) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    a0 += w;
    i += 4;
  }
  if (i + 2 <= len) {
    uint16_t w;
    std::memcpy(&w, p + i, 2);
    a0 += w;
    i += 2;
  }
  if (i < len) {
    // A trailing odd byte is padded with zero on its right (network order),
    // which in a little-endian native word is the low byte.
    uint16_t w = 0;
    std::memcpy(&w, p + i, 1);
    a0 += w;
  }
  return a0;
}

/// memcpy(dst, src, len) and then partial_sum(src, len, acc), in one pass
/// over the source where the vector path allows: each 64-byte block is
/// loaded once, stored and summed. The send path's payload fill: at 1500
/// bytes over memif it took the stack from 0.74-0.80 to 0.86-0.90 of the raw
/// packet rate (benchmarks/README.md, "Measured design decisions").
inline uint64_t copy_partial_sum(void* dst, const void* src, size_t len, uint64_t acc = 0) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
#if defined(__AVX512BW__)
  if (len >= 128) acc += detail::sum_blocks_512<true>(p, len, d, i);
#endif
  if (len > i) std::memcpy(d + i, p + i, len - i);
  return partial_sum(p + i, len - i, acc);
}

/// memcpy(dst, src, len) with copy_partial_sum's loop, without the sum: the
/// payload fill when the checksum is offloaded or off.
inline void copy_payload(void* dst, const void* src, size_t len) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* p = static_cast<const unsigned char*>(src);
  size_t i = 0;
#if defined(__AVX512BW__)
  if (len >= 128) {
    detail::sum_halves_512<true, false>(p, len / 64, d);
    i = len / 64 * 64;
  }
#endif
  if (len > i) std::memcpy(d + i, p + i, len - i);
}

/// Folds a partial sum to 16 bits (not complemented).
inline uint16_t fold_sum(uint64_t acc) {
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffu) + (acc >> 16);
  acc = (acc & 0xffffu) + (acc >> 16);
  acc = (acc & 0xffffu) + (acc >> 16);
  return static_cast<uint16_t>(acc);
}

/// The checksum to store in a header (native order store gives network order).
inline uint16_t checksum_of(uint64_t acc) { return static_cast<uint16_t>(~fold_sum(acc)); }

}  // namespace mercury::net
