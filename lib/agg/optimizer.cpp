// Optimizer names and step parameters, and the runtime choice of kernel:
// the instruction sets this CPU has are read once (isa.h), and
// every call goes to the chosen set's kernels (optimizer_kernels.h).
#include "agg/optimizer.h"

#include <cmath>
#include <string>

#include "agg/isa.h"
#include "agg/optimizer_kernels.h"

namespace mercury::agg {

namespace {

// The kernels of a resolved, available set (kPortable: the plain kernel of
// the widest set this CPU has).
const KernelSet& kernels(Simd resolved) {
  switch (resolved) {
    case Simd::kAvx512:
      return kAvx512Kernels;
    case Simd::kAvx2:
      return kAvx2Kernels;
    default:
      return kBaselineKernels;
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
    case Simd::kAuto:
    case Simd::kPortable:
      return true;
    case Simd::kAvx2:
      return cpu_isa().avx2;
    case Simd::kAvx512:
      return cpu_isa().avx512();
  }
  return false;
}

Simd resolve_simd(Simd simd) {
  if (simd != Simd::kAuto) return simd;
  if (cpu_isa().avx512()) return Simd::kAvx512;
  if (cpu_isa().avx2) return Simd::kAvx2;
  return Simd::kPortable;
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
  const Simd s = resolve_simd(simd);
  if (s == Simd::kPortable) {
    return kernels(resolve_simd(Simd::kAuto))
        .apply_plain(kind, src, n, elements, param, state0, state1, step);
  }
  kernels(s).apply(kind, src, n, elements, param, state0, state1, step);
}

void reduce_sum(Simd simd, const std::byte* const* src, uint32_t n, uint64_t elements, float* out) {
  kernels(resolve_simd(simd)).sum(src, n, elements, out);
}

}  // namespace mercury::agg
