// The half-precision kernels' shared code, compiled into one translation unit
// per instruction set (half.cpp with the build's flags, half_avx2.cpp with
// -mavx2 -mf16c, half_avx512.cpp with AVX-512F/BW/VL, half_avx512_bf16.cpp
// adding AVX-512 BF16 and DQ; lib/agg/meson.build), each of which exports its
// HalfSet; half.cpp lists the variants this CPU runs, once (isa.h). Internal
// to lib/agg.
//
// As in optimizer_kernels.h, everything but the HalfSet declarations is in an
// anonymous namespace, so that each unit keeps its own copies compiled for
// its set (with external linkage the linker would keep one copy for all of
// them, possibly one a CPU cannot run), and the code uses plain arrays and
// builtins rather than std templates. The scalar definitions of half.h are
// always inlined for the same reason; the units' tails go through their own
// instructions, not through them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

#include "agg/half.h"

namespace mercury::agg {

/// One unit's kernels. `bf16_portable` / `fp16_portable`: the plain C++
/// kernels (named "portable") as this unit's set compiles them; `bf16` /
/// `fp16`: the set's own kernels, with null functions where it has none.
struct HalfSet {
  HalfKernels bf16_portable;
  HalfKernels fp16_portable;
  HalfKernels bf16;
  HalfKernels fp16;
};

/// half.cpp: the build's own flags (-march=native, or DPDK's baseline in a
/// portable build): the portable kernels only.
extern const HalfSet kHalfBaseline;
/// half_avx2.cpp (AVX2 and F16C): portable, and float16 "f16c".
extern const HalfSet kHalfAvx2;
/// half_avx512.cpp (AVX-512F/BW/VL): portable, and both dtypes' "avx512".
extern const HalfSet kHalfAvx512;
/// half_avx512_bf16.cpp (the above and AVX-512 BF16/DQ): bfloat16's
/// "avx512_bf16" narrow only (its widen_sum is null: "avx512"'s is the same).
extern const HalfSet kHalfAvx512Bf16;

namespace {

inline uint16_t load16(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);  // packet payloads need not be 2-aligned
  return h;
}

inline void store16(std::byte* p, uint16_t h) { std::memcpy(p, &h, sizeof h); }

// The rank-order sum of n sources with vector type V: V::kLanes elements a
// step, then V::tail() for what is left. The common counts (1, 2, 4, 8) are
// compile-time constants, so the rank loop unrolls.
template <class V, uint32_t kN>
void widen_sum_n(const std::byte* const* src_in, uint32_t n, uint64_t elements, float* out) {
  // A local copy of the pointers: otherwise the compiler reloads them from
  // the caller's array after every store (it cannot prove no aliasing).
  const std::byte* local[kN ? kN : 1];
  const std::byte* const* src = src_in;
  if constexpr (kN > 0) {
    for (uint32_t r = 0; r < kN; ++r) local[r] = src_in[r];
    src = local;
  }
  const uint32_t count = kN ? kN : n;
  uint64_t i = 0;
  for (; i + V::kLanes <= elements; i += V::kLanes) {
    auto s = V::load(src[0] + 2 * i);
    for (uint32_t r = 1; r < count; ++r) s = V::add(s, V::load(src[r] + 2 * i));
    V::store(out + i, s);
  }
  if (i < elements) V::tail(src, count, i, elements, out);
}

template <class V>
void widen_sum_vector(const std::byte* const* src, uint32_t n, uint64_t elements, float* out) {
  switch (n) {
    case 1:
      return widen_sum_n<V, 1>(src, n, elements, out);
    case 2:
      return widen_sum_n<V, 2>(src, n, elements, out);
    case 4:
      return widen_sum_n<V, 4>(src, n, elements, out);
    case 8:
      return widen_sum_n<V, 8>(src, n, elements, out);
    default:
      return widen_sum_n<V, 0>(src, n, elements, out);
  }
}

// ---- portable: the scalar definitions, element by element ----

// A tile at a time, rank after rank: per element the same additions in the
// same order as one element at a time (s = w0, s += w1, ...), but each pass
// is a plain loop the compiler can vectorise, and the tile stays in L1.
template <float (*kWiden)(uint16_t)>
void widen_sum_portable(const std::byte* const* src, uint32_t n, uint64_t elements, float* out) {
  constexpr uint64_t kTile = 512;
  for (uint64_t t = 0; t < elements; t += kTile) {
    const uint64_t end = elements - t < kTile ? elements : t + kTile;
    const std::byte* s0 = src[0];
    for (uint64_t i = t; i < end; ++i) out[i] = kWiden(load16(s0 + 2 * i));
    for (uint32_t r = 1; r < n; ++r) {
      const std::byte* sr = src[r];
      for (uint64_t i = t; i < end; ++i) out[i] += kWiden(load16(sr + 2 * i));
    }
  }
}

template <uint16_t (*kNarrow)(float)>
void narrow_portable(const float* src, uint64_t elements, std::byte* out) {
  for (uint64_t i = 0; i < elements; ++i) store16(out + 2 * i, kNarrow(src[i]));
}

// This unit's portable kernels.
constexpr HalfKernels portable_bf16() {
  return {"portable", widen_sum_portable<bf16_to_float>, narrow_portable<float_to_bf16>};
}
constexpr HalfKernels portable_fp16() {
  return {"portable", widen_sum_portable<fp16_to_float>, narrow_portable<float_to_fp16>};
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// ---- AVX-512: 16 elements per step, the tail under a mask ----

// Every lane. The zero-masked forms of the intrinsics below compile to the
// plain instructions; GCC 12 warns (-Wmaybe-uninitialized) on the undefined
// operand inside the plain forms' definitions.
constexpr __mmask16 kAll = 0xffff;

// 16 elements a step, widened by W; the tail under a mask (the same
// operations on the lanes that exist).
template <class W>
struct Avx512Widen {
  static constexpr uint32_t kLanes = 16;
  static __m512 load(const std::byte* p) {
    return W::widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static void tail(const std::byte* const* src, uint32_t count, uint64_t i, uint64_t elements,
                   float* out) {
    const auto m = static_cast<__mmask16>((1u << (elements - i)) - 1);
    __m512 s = W::widen(_mm256_maskz_loadu_epi16(m, src[0] + 2 * i));
    for (uint32_t r = 1; r < count; ++r) {
      s = _mm512_add_ps(s, W::widen(_mm256_maskz_loadu_epi16(m, src[r] + 2 * i)));
    }
    _mm512_mask_storeu_ps(out + i, m, s);
  }
};

struct WidenBf16 {
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
  }
};

// float_to_bf16() on 16 lanes of float32 bits, one 32-bit result per lane.
inline __m512i bf16_round(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  r = _mm512_maskz_srli_epi32(kAll, r, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(r, nan, _mm512_maskz_srli_epi32(kAll, u, 16),
                              _mm512_set1_epi32(0x40));
}
#endif

}  // namespace

}  // namespace mercury::agg
