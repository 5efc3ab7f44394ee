// The arithmetic of optimizer.h's kernels, once, for every instruction set:
// this header is compiled into one translation unit per ISA (optimizer_
// baseline.cpp with the build's flags, optimizer_avx2.cpp with -mavx2,
// optimizer_avx512.cpp with AVX-512F/BW/VL; lib/agg/meson.build), each of which
// exports its KernelSet; optimizer.cpp chooses one at run time, once
// (resolve_simd). Internal to lib/agg.
//
// Everything but the KernelSet declarations is in an anonymous namespace, so
// that each translation unit keeps its own copies compiled for its ISA: with
// external linkage the linker would keep one copy of each template for all
// of them, which could be the AVX-512 one on a CPU without it. For the same
// reason the kernels use builtins and plain arrays, not std templates.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "agg/optimizer.h"

namespace mercury::agg {

/// One instruction set's kernels (optimizer.h's reduce_apply and
/// reduce_sum): `apply` and `sum` are its widest ones (intrinsics where the
/// set has them), `apply_plain` the intrinsic-free C++ kernel compiled for
/// the set (Simd::kPortable on a CPU that has it). Same arguments as
/// reduce_apply() and reduce_sum().
struct KernelSet {
  void (*apply)(OptimizerKind kind, const std::byte* const* src, uint32_t n, uint64_t elements,
                float* param, float* state0, float* state1, const StepParams& step);
  void (*apply_plain)(OptimizerKind kind, const std::byte* const* src, uint32_t n,
                      uint64_t elements, float* param, float* state0, float* state1,
                      const StepParams& step);
  void (*sum)(const std::byte* const* src, uint32_t n, uint64_t elements, float* out);
};

/// optimizer_baseline.cpp: the build's own flags (-march=native, or DPDK's
/// baseline in a portable build); apply is apply_plain.
extern const KernelSet kBaselineKernels;
/// optimizer_avx2.cpp, optimizer_avx512.cpp: only called on CPUs that have
/// the set (isa.h).
extern const KernelSet kAvx2Kernels;
extern const KernelSet kAvx512Kernels;

namespace {

// One "vector" of each width with the handful of operations the kernels use.
// Every operation is the correctly rounded IEEE one, so all widths agree bit
// for bit with the scalar formulas.
struct Scalar {
  using T = float;
  static constexpr uint32_t kLanes = 1;
  static T load(const std::byte* p) {
    float f;
    std::memcpy(&f, p, sizeof f);  // packet payloads need not be 4-aligned
    return f;
  }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T set1(float f) { return f; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T sqrt(T a) { return std::sqrt(a); }
};

#if defined(__AVX2__)
struct Avx2 {
  using T = __m256;
  static constexpr uint32_t kLanes = 8;
  static T load(const std::byte* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T set1(float f) { return _mm256_set1_ps(f); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T sqrt(T a) { return _mm256_sqrt_ps(a); }
};
#endif

#if defined(__AVX512F__)
struct Avx512 {
  using T = __m512;
  static constexpr uint32_t kLanes = 16;
  static T load(const std::byte* p) { return _mm512_loadu_ps(p); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T set1(float f) { return _mm512_set1_ps(f); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  // The masked form: GCC 12 warns on the undefined operand of _mm512_sqrt_ps.
  static T sqrt(T a) { return _mm512_maskz_sqrt_ps(0xffff, a); }
};
#endif

// Sum of the contributions at byte offset `off`, in rank order. kN > 0 is a
// compile-time count (the common worker counts, fully unrolled); 0 = runtime n.
template <class V, uint32_t kN>
inline typename V::T rank_sum(const std::byte* const* src, uint32_t n, size_t off) {
  typename V::T s = V::load(src[0] + off);
  const uint32_t count = kN ? kN : n;
  for (uint32_t r = 1; r < count; ++r) s = V::add(s, V::load(src[r] + off));
  return s;
}

// Asks for every line of a chunk's contributions and parameters at once.
// A chunk is ~23 lines per stream, too short for the hardware streamer to
// ramp up, and the contributions sit in unrelated packet buffers: issuing
// all the misses up front overlaps them instead of taking them in turn.
inline void prefetch_chunk(const std::byte* const* src, uint32_t n, uint64_t elements,
                           const float* param) {
  const uint64_t bytes = elements * sizeof(float);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint64_t b = 0; b < bytes; b += 64) __builtin_prefetch(src[r] + b, 0, 3);
  }
  for (uint64_t b = 0; b < bytes; b += 64) {
    __builtin_prefetch(reinterpret_cast<const std::byte*>(param) + b, 0, 3);
  }
}

// What one element's update does: the optimizer kind with its weight-decay
// variant. The decay terms are separate kernels rather than multiplied by a
// zero weight decay, so a job without decay computes what it always did
// (0 x inf would be a NaN, and every extra operation is memory traffic).
enum class Rule : uint8_t {
  kSumOnly,
  kSgd,
  kSgdL2,
  kMomentum,
  kMomentumL2,
  kAdam,
  kAdamL2,
  kAdamW
};

constexpr bool has_l2(Rule r) {
  return r == Rule::kSgdL2 || r == Rule::kMomentumL2 || r == Rule::kAdamL2;
}

inline Rule rule_of(OptimizerKind kind, const StepParams& k) {
  const bool l2 = k.wd != 0.0f;
  switch (kind) {
    case OptimizerKind::kSumOnly:
      return Rule::kSumOnly;
    case OptimizerKind::kSgd:
      return l2 ? Rule::kSgdL2 : Rule::kSgd;
    case OptimizerKind::kMomentum:
      return l2 ? Rule::kMomentumL2 : Rule::kMomentum;
    case OptimizerKind::kAdam:
      return k.decoupled ? Rule::kAdamW : l2 ? Rule::kAdamL2 : Rule::kAdam;
  }
  return Rule::kSumOnly;
}

// Elements [first, last) of one update with vector type V.
template <class V, Rule kRule, uint32_t kN>
inline void apply_range(const std::byte* const* src, uint32_t n, uint64_t first, uint64_t last,
                        float* param, float* s0, float* s1, const StepParams& k) {
  const auto inv_n = V::set1(k.inv_n);
  const auto lr = V::set1(k.lr);
  for (uint64_t i = first; i + V::kLanes <= last; i += V::kLanes) {
    auto g = V::mul(rank_sum<V, kN>(src, n, i * sizeof(float)), inv_n);
    if constexpr (kRule == Rule::kSumOnly) {
      V::store(param + i, g);
    } else {
      auto p = V::load(param + i);
      if constexpr (has_l2(kRule)) g = V::add(g, V::mul(V::set1(k.wd), p));
      if constexpr (kRule == Rule::kSgd || kRule == Rule::kSgdL2) {
        V::store(param + i, V::sub(p, V::mul(lr, g)));
      } else if constexpr (kRule == Rule::kMomentum || kRule == Rule::kMomentumL2) {
        const auto u = V::add(V::mul(V::set1(k.mu), V::load(s0 + i)), g);
        V::store(s0 + i, u);
        V::store(param + i, V::sub(p, V::mul(lr, u)));
      } else {
        const auto m =
            V::add(V::mul(V::set1(k.b1), V::load(s0 + i)), V::mul(V::set1(k.one_minus_b1), g));
        const auto v = V::add(V::mul(V::set1(k.b2), V::load(s1 + i)),
                              V::mul(V::set1(k.one_minus_b2), V::mul(g, g)));
        V::store(s0 + i, m);
        V::store(s1 + i, v);
        const auto den = V::add(V::sqrt(V::mul(v, V::set1(k.adam_c2))), V::set1(k.eps));
        if constexpr (kRule == Rule::kAdamW) p = V::mul(p, V::set1(k.decay));
        V::store(param + i, V::sub(p, V::div(V::mul(V::set1(k.adam_a), m), den)));
      }
    }
  }
}

template <class V, Rule kRule, uint32_t kN>
void apply_all(const std::byte* const* src_in, uint32_t n, uint64_t elements, float* param,
               float* s0, float* s1, const StepParams& k) {
  // A local copy of the source pointers: otherwise the compiler reloads them
  // from the caller's array after every store (it cannot prove no aliasing).
  // (A plain array: no std template is instantiated here under this ISA.)
  const std::byte* local[kN ? kN : 1];
  const std::byte* const* src = src_in;
  if constexpr (kN > 0) {
    for (uint32_t r = 0; r < kN; ++r) local[r] = src_in[r];
    src = local;
  }
  prefetch_chunk(src, kN ? kN : n, elements, param);
  const uint64_t body = elements / V::kLanes * V::kLanes;
  apply_range<V, kRule, kN>(src, n, 0, body, param, s0, s1, k);
  // The tail goes through the scalar formulas, which are the same operations.
  apply_range<Scalar, kRule, kN>(src, n, body, elements, param, s0, s1, k);
}

template <class V, Rule kRule>
void apply_n(const std::byte* const* src, uint32_t n, uint64_t elements, float* param, float* s0,
             float* s1, const StepParams& k) {
  switch (n) {
    case 1:
      return apply_all<V, kRule, 1>(src, n, elements, param, s0, s1, k);
    case 2:
      return apply_all<V, kRule, 2>(src, n, elements, param, s0, s1, k);
    case 4:
      return apply_all<V, kRule, 4>(src, n, elements, param, s0, s1, k);
    case 8:
      return apply_all<V, kRule, 8>(src, n, elements, param, s0, s1, k);
    default:
      return apply_all<V, kRule, 0>(src, n, elements, param, s0, s1, k);
  }
}

template <class V>
void apply_kind(OptimizerKind kind, const std::byte* const* src, uint32_t n, uint64_t elements,
                float* param, float* s0, float* s1, const StepParams& k) {
  using Kernel = void (*)(const std::byte* const*, uint32_t, uint64_t, float*, float*, float*,
                          const StepParams&);
  // Indexed by Rule.
  static constexpr Kernel kKernels[] = {
      &apply_n<V, Rule::kSumOnly>,  &apply_n<V, Rule::kSgd>,        &apply_n<V, Rule::kSgdL2>,
      &apply_n<V, Rule::kMomentum>, &apply_n<V, Rule::kMomentumL2>, &apply_n<V, Rule::kAdam>,
      &apply_n<V, Rule::kAdamL2>,   &apply_n<V, Rule::kAdamW>};
  static_assert(sizeof kKernels / sizeof kKernels[0] == static_cast<size_t>(Rule::kAdamW) + 1);
  kKernels[static_cast<size_t>(rule_of(kind, k))](src, n, elements, param, s0, s1, k);
}

template <class V>
void sum_all(const std::byte* const* src, uint32_t n, uint64_t elements, float* out) {
  const uint64_t body = elements / V::kLanes * V::kLanes;
  for (uint64_t i = 0; i < body; i += V::kLanes) {
    V::store(out + i, rank_sum<V, 0>(src, n, i * sizeof(float)));
  }
  for (uint64_t i = body; i < elements; ++i) {
    Scalar::store(out + i, rank_sum<Scalar, 0>(src, n, i * sizeof(float)));
  }
}

// The KernelSet of vector type V: its intrinsic kernels and the plain one,
// as this unit's ISA compiles them.
template <class V>
constexpr KernelSet kernel_set() {
  return {&apply_kind<V>, &apply_kind<Scalar>, &sum_all<V>};
}

}  // namespace

}  // namespace mercury::agg
