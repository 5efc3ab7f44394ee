#include "agg/optimizer.h"

#include <array>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mercury::agg {

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
#if defined(__AVX2__) || defined(__AVX512F__)
  const uint64_t bytes = elements * sizeof(float);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint64_t b = 0; b < bytes; b += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(src[r] + b), _MM_HINT_T0);
    }
  }
  for (uint64_t b = 0; b < bytes; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(param) + b, _MM_HINT_T0);
  }
#else
  (void)src, (void)n, (void)elements, (void)param;
#endif
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

Rule rule_of(OptimizerKind kind, const StepParams& k) {
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
  std::array<const std::byte*, kN ? kN : 1> local;
  const std::byte* const* src = src_in;
  if constexpr (kN > 0) {
    for (uint32_t r = 0; r < kN; ++r) local[r] = src_in[r];
    src = local.data();
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
  static_assert(std::size(kKernels) == static_cast<size_t>(Rule::kAdamW) + 1);
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

}  // namespace

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSumOnly:
      return "sum-only";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

uint32_t state_floats_per_element(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kMomentum:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
    default:
      return 0;
  }
}

std::string_view simd_name(Simd simd) {
  switch (simd) {
    case Simd::kAuto:
      return "auto";
    case Simd::kPortable:
      return "portable";
    case Simd::kAvx2:
      return "avx2";
    case Simd::kAvx512:
      return "avx512";
  }
  return "?";
}

bool simd_available(Simd simd) {
  switch (simd) {
#if defined(__AVX2__)
    case Simd::kAvx2:
      return true;
#endif
#if defined(__AVX512F__)
    case Simd::kAvx512:
      return true;
#endif
    case Simd::kAuto:
    case Simd::kPortable:
      return true;
    default:
      return false;
  }
}

Simd resolve_simd(Simd simd) {
  if (simd != Simd::kAuto) return simd;
#if defined(__AVX512F__)
  return Simd::kAvx512;
#elif defined(__AVX2__)
  return Simd::kAvx2;
#else
  return Simd::kPortable;
#endif
}

Hyperparameters hyperparameters_of(const OptimizerConfig& c) {
  return Hyperparameters{.learning_rate = c.learning_rate,
                         .momentum = c.momentum,
                         .weight_decay = c.weight_decay,
                         .beta1 = c.beta1,
                         .beta2 = c.beta2,
                         .epsilon = c.epsilon};
}

std::string hyperparameters_refused(OptimizerKind kind, bool decoupled, const Hyperparameters& h) {
  auto bad = [](const char* name, float v, const char* rule) {
    return std::string(name) + " " + std::to_string(v) + " is not " + rule;
  };
  auto unit = [](float v) { return std::isfinite(v) && v >= 0.0f && v < 1.0f; };
  if (decoupled && kind != OptimizerKind::kAdam) {
    return "a decoupled weight decay (AdamW) needs optimizer adam, not " +
           std::string(optimizer_name(kind));
  }
  if (kind == OptimizerKind::kSumOnly) {
    if (h.weight_decay != 0.0f) return "weight_decay is not used by optimizer sum-only";
    return {};
  }
  if (!std::isfinite(h.learning_rate) || h.learning_rate < 0.0f) {
    return bad("learning_rate", h.learning_rate, "finite and >= 0");
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0.0f) {
    return bad("weight_decay", h.weight_decay, "finite and >= 0");
  }
  if (kind == OptimizerKind::kMomentum && !unit(h.momentum)) {
    return bad("momentum", h.momentum, "in [0, 1)");
  }
  if (kind == OptimizerKind::kAdam) {
    if (!unit(h.beta1)) return bad("beta1", h.beta1, "in [0, 1)");
    if (!unit(h.beta2)) return bad("beta2", h.beta2, "in [0, 1)");
    if (!std::isfinite(h.epsilon) || h.epsilon <= 0.0f) {
      return bad("epsilon", h.epsilon, "finite and > 0");
    }
  }
  return {};
}

StepParams step_params(OptimizerKind kind, bool decoupled, const Hyperparameters& h,
                       uint32_t contributions, uint64_t step, float lr_scale) {
  StepParams k;
  k.inv_n = 1.0f / static_cast<float>(contributions);
  k.lr = h.learning_rate * lr_scale;
  k.mu = h.momentum;
  k.b1 = h.beta1;
  k.one_minus_b1 = 1.0f - h.beta1;
  k.b2 = h.beta2;
  k.one_minus_b2 = 1.0f - h.beta2;
  k.eps = h.epsilon;
  if (kind != OptimizerKind::kSumOnly && h.weight_decay != 0.0f) {
    if (decoupled && kind == OptimizerKind::kAdam) {
      k.decoupled = true;
      k.decay =
          static_cast<float>(1.0 - static_cast<double>(k.lr) * static_cast<double>(h.weight_decay));
    } else {
      k.wd = h.weight_decay;
    }
  }
  if (kind == OptimizerKind::kAdam) {  // two pow() calls: only where they are used
    const double t = static_cast<double>(step);
    k.adam_a = static_cast<float>(k.lr / (1.0 - std::pow(static_cast<double>(h.beta1), t)));
    k.adam_c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(h.beta2), t)));
  }
  return k;
}

StepParams step_params(const OptimizerConfig& c, uint32_t contributions, uint64_t step,
                       float lr_scale) {
  return step_params(c.kind, c.decoupled_weight_decay, hyperparameters_of(c), contributions, step,
                     lr_scale);
}

void reduce_apply(OptimizerKind kind, Simd simd, const std::byte* const* src, uint32_t n,
                  uint64_t elements, float* param, float* state0, float* state1,
                  const StepParams& step) {
  switch (resolve_simd(simd)) {
#if defined(__AVX512F__)
    case Simd::kAvx512:
      return apply_kind<Avx512>(kind, src, n, elements, param, state0, state1, step);
#endif
#if defined(__AVX2__)
    case Simd::kAvx2:
      return apply_kind<Avx2>(kind, src, n, elements, param, state0, state1, step);
#endif
    default:
      return apply_kind<Scalar>(kind, src, n, elements, param, state0, state1, step);
  }
}

void reduce_sum(Simd simd, const std::byte* const* src, uint32_t n, uint64_t elements, float* out) {
  switch (resolve_simd(simd)) {
#if defined(__AVX512F__)
    case Simd::kAvx512:
      return sum_all<Avx512>(src, n, elements, out);
#endif
#if defined(__AVX2__)
    case Simd::kAvx2:
      return sum_all<Avx2>(src, n, elements, out);
#endif
    default:
      return sum_all<Scalar>(src, n, elements, out);
  }
}

}  // namespace mercury::agg
