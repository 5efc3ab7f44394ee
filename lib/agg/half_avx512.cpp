// The AVX-512 half-precision kernels (half_kernels.h), compiled with
// AVX-512F/BW/VL whatever the build's -march: called only on CPUs that have
// them (half.cpp). Also the portable kernels as this set compiles them.
#include "agg/half_kernels.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "half_avx512.cpp is compiled with -mavx512f -mavx512bw -mavx512vl (lib/agg/meson.build)"
#endif

namespace mercury::agg {

namespace {

struct WidenFp16 {
  static __m512 widen(__m256i h) { return _mm512_maskz_cvtph_ps(kAll, h); }
};

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

}  // namespace

const HalfSet kHalfAvx512 = {
    portable_bf16(),
    portable_fp16(),
    {"avx512", widen_sum_vector<Avx512Widen<WidenBf16>>, narrow_bf16_avx512},
    {"avx512", widen_sum_vector<Avx512Widen<WidenFp16>>, narrow_fp16_avx512},
};

}  // namespace mercury::agg
