// bfloat16's narrowing with AVX-512 BF16 (half_kernels.h), compiled with
// AVX-512F/BW/VL/DQ and BF16 whatever the build's -march: called only on
// CPUs that have them (half.cpp).
#include "agg/half_kernels.h"

#if !defined(__AVX512BF16__) || !defined(__AVX512DQ__) || !defined(__AVX512BW__) || \
    !defined(__AVX512VL__)
#error "half_avx512_bf16.cpp is compiled with AVX-512 BF16, DQ, BW and VL (lib/agg/meson.build)"
#endif

namespace mercury::agg {

namespace {

// VCVTNEPS2BF16 rounds to nearest even and makes NaNs quiet exactly as
// float_to_bf16() does, but flushes subnormal inputs to zero: lanes holding
// a subnormal (rare in gradients and weights: a branch that is almost never
// taken) are redone with the integer rounding.
__m256i bf16_convert(__m512 x) {
  __m256i r = __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(x));
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

}  // namespace

// The widening is "avx512"'s (half_avx512.cpp); no portable kernels here.
const HalfSet kHalfAvx512Bf16 = {
    {},
    {},
    {"avx512_bf16", nullptr, narrow_bf16_avx512bf16},
    {},
};

}  // namespace mercury::agg
