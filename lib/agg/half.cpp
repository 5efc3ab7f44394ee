#include "agg/half.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace mercury::agg {

namespace {

using wire::Dtype;

uint16_t load16(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);  // packet payloads need not be 2-aligned
  return h;
}

void store16(std::byte* p, uint16_t h) { std::memcpy(p, &h, sizeof h); }

// The rank-order sum of n sources with vector type V: V::kLanes elements a
// step, then V::tail() for what is left. The common counts (1, 2, 4, 8) are
// compile-time constants, so the rank loop unrolls.
template <class V, uint32_t kN>
void widen_sum_n(const std::byte* const* src_in, uint32_t n, uint64_t elements, float* out) {
  // A local copy of the pointers: otherwise the compiler reloads them from
  // the caller's array after every store (it cannot prove no aliasing).
  std::array<const std::byte*, kN ? kN : 1> local;
  const std::byte* const* src = src_in;
  if constexpr (kN > 0) {
    for (uint32_t r = 0; r < kN; ++r) local[r] = src_in[r];
    src = local.data();
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
    const uint64_t end = std::min(elements, t + kTile);
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

struct WidenFp16 {
  static __m512 widen(__m256i h) { return _mm512_maskz_cvtph_ps(kAll, h); }
};

// float_to_bf16() on 16 lanes of float32 bits, one 32-bit result per lane.
__m512i bf16_round(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  r = _mm512_maskz_srli_epi32(kAll, r, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(r, nan, _mm512_maskz_srli_epi32(kAll, u, 16),
                              _mm512_set1_epi32(0x40));
}

void narrow_bf16_avx512(const float* src, uint64_t elements, std::byte* out) {
  uint64_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m512i r = bf16_round(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm512_maskz_cvtepi32_epi16(kAll, r));
  }
  if (i < elements) {
    const auto m = static_cast<__mmask16>((1u << (elements - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi16(out + 2 * i, m,
                                      bf16_round(_mm512_maskz_loadu_epi32(m, src + i)));
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
// VCVTNEPS2BF16 rounds to nearest even and makes NaNs quiet exactly as
// float_to_bf16() does, but flushes subnormal inputs to zero: lanes holding
// a subnormal (rare in gradients and weights: a branch that is almost never
// taken) are redone with the integer rounding.
__m256i bf16_convert(__m512 x) {
  __m256i r = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
  // VFPCLASSPS category 0x20: the subnormal lanes (AVX-512DQ).
  const __mmask16 subnormal = _mm512_fpclass_ps_mask(x, 0x20);
  if (subnormal != 0) {
    r = _mm256_mask_blend_epi16(
        subnormal, r, _mm512_maskz_cvtepi32_epi16(kAll, bf16_round(_mm512_castps_si512(x))));
  }
  return r;
}

void narrow_bf16_avx512bf16(const float* src, uint64_t elements, std::byte* out) {
  uint64_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        bf16_convert(_mm512_loadu_ps(src + i)));
  }
  if (i < elements) {
    const auto m = static_cast<__mmask16>((1u << (elements - i)) - 1);
    _mm256_mask_storeu_epi16(out + 2 * i, m, bf16_convert(_mm512_maskz_loadu_ps(m, src + i)));
  }
}
#endif

constexpr int kNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

void narrow_fp16_avx512(const float* src, uint64_t elements, std::byte* out) {
  uint64_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm512_maskz_cvtps_ph(kAll, _mm512_loadu_ps(src + i), kNearestEven));
  }
  if (i < elements) {
    const auto m = static_cast<__mmask16>((1u << (elements - i)) - 1);
    _mm256_mask_storeu_epi16(
        out + 2 * i, m,
        _mm512_maskz_cvtps_ph(kAll, _mm512_maskz_loadu_ps(m, src + i), kNearestEven));
  }
}
#endif

#if defined(__F16C__) && defined(__AVX__)
// ---- F16C on 256-bit registers: 8 elements per step, the tail portable ----

// 8 elements a step; the tail element by element, through the same
// widening and the same additions.
struct F16cWiden {
  static constexpr uint32_t kLanes = 8;
  static __m256 load(const std::byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static void tail(const std::byte* const* src, uint32_t count, uint64_t i, uint64_t elements,
                   float* out) {
    for (; i < elements; ++i) {
      float s = fp16_to_float(load16(src[0] + 2 * i));
      for (uint32_t r = 1; r < count; ++r) s += fp16_to_float(load16(src[r] + 2 * i));
      out[i] = s;
    }
  }
};

void narrow_fp16_f16c(const float* src, uint64_t elements, std::byte* out) {
  uint64_t i = 0;
  for (; i + 8 <= elements; i += 8) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + 2 * i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < elements; ++i) store16(out + 2 * i, float_to_fp16(src[i]));
}
#endif

// Per dtype, portable first, then in order of preference: half_kernels()
// takes the last. The order comes from agg_bench (docs/agg.md).
constexpr HalfKernels kBf16[] = {
    {"portable", widen_sum_portable<bf16_to_float>, narrow_portable<float_to_bf16>},
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    {"avx512", widen_sum_vector<Avx512Widen<WidenBf16>>, narrow_bf16_avx512},
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    {"avx512_bf16", widen_sum_vector<Avx512Widen<WidenBf16>>, narrow_bf16_avx512bf16},
#endif
#endif
};

constexpr HalfKernels kFp16[] = {
    {"portable", widen_sum_portable<fp16_to_float>, narrow_portable<float_to_fp16>},
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    {"avx512", widen_sum_vector<Avx512Widen<WidenFp16>>, narrow_fp16_avx512},
#endif
// Preferred to the 512-bit form: faster in both directions on this machine's
// AMD EPYC, whose 512-bit conversions take two passes (docs/agg.md).
#if defined(__F16C__) && defined(__AVX__)
    {"f16c", widen_sum_vector<F16cWiden>, narrow_fp16_f16c},
#endif
};

}  // namespace

std::span<const HalfKernels> half_kernel_variants(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBFloat16:
      return kBf16;
    case Dtype::kFloat16:
      return kFp16;
    default:
      return {};
  }
}

const HalfKernels& half_kernels(Dtype dtype, bool portable) {
  // The dispatch point: one choice per dtype, made once. A build that
  // compiles every variant (target attributes) would choose here by the
  // CPU's features at run time.
  const std::span<const HalfKernels> v =
      half_kernel_variants(dtype == Dtype::kFloat16 ? Dtype::kFloat16 : Dtype::kBFloat16);
  return portable ? v.front() : v.back();
}

}  // namespace mercury::agg
