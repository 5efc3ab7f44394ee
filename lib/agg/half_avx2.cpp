// float16 with F16C on 256-bit registers (half_kernels.h), compiled with
// -mavx2 -mf16c whatever the build's -march: called only on CPUs that have
// both (half.cpp). Also the portable kernels as AVX2 compiles them.
#include "agg/half_kernels.h"

#include <immintrin.h>
#include <cstring>

#if !defined(__AVX2__) || !defined(__F16C__)
#error "half_avx2.cpp is compiled with -mavx2 -mf16c (lib/agg/meson.build)"
#endif

namespace mercury::agg {

namespace {

// ---- F16C on 256-bit registers: 8 elements per step ----

// 8 elements a step, the tail in a padded register.
struct F16cWiden {
  static constexpr uint32_t kLanes = 8;
  static __m256 load(const std::byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
  // The last elements (fewer than 8) through the same instructions, in a
  // zero-padded register.
  static __m256 load_part(const std::byte* p, uint64_t left) {
    uint16_t h[8] = {};
    std::memcpy(h, p, 2 * left);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  }
  static void tail(const std::byte* const* src, uint32_t count, uint64_t i, uint64_t elements,
                   float* out) {
    const uint64_t left = elements - i;
    __m256 s = load_part(src[0] + 2 * i, left);
    for (uint32_t r = 1; r < count; ++r) s = _mm256_add_ps(s, load_part(src[r] + 2 * i, left));
    float f[8];
    _mm256_storeu_ps(f, s);
    std::memcpy(out + i, f, 4 * left);
  }
};

void narrow_fp16_f16c(const float* src, uint64_t elements, std::byte* out) {
  uint64_t i = 0;
  for (; i + 8 <= elements; i += 8) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + 2 * i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < elements) {
    const uint64_t left = elements - i;
    float f[8] = {};
    std::memcpy(f, src + i, 4 * left);
    uint16_t h[8];
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(h),
        _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    std::memcpy(out + 2 * i, h, 2 * left);
  }
}

}  // namespace

const HalfSet kHalfAvx2 = {
    portable_bf16(),
    portable_fp16(),
    {},
    {"f16c", widen_sum_vector<F16cWiden>, narrow_fp16_f16c},
};

}  // namespace mercury::agg
