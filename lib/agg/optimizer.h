// Optimizers and the rank-order reduction kernel: the arithmetic of one chunk
// update, kept apart from the chunk table's bookkeeping.
//
// What it is for. When a chunk's set of contributions is complete, the chunk
// table calls reduce_apply() once: it sums the contributions in rank order
// (c0 + c1 + ... + c(n-1), left to right, per element), scales by 1/n to get
// the averaged gradient g, and applies the optimizer to the owned parameters
// in the same pass, so each byte of gradient is read once.
//
// Determinism. Every element goes through the same sequence of IEEE-754
// float32 operations in the portable, AVX2 and AVX-512 paths (lanes are
// independent elements; nothing is reassociated, and lib/agg is compiled
// with -ffp-contract=off so no multiply-add is fused behind our back). The
// result is therefore bit-identical whatever the arrival order, whatever the
// SIMD width, and equal to the scalar reference formulas below:
//
//   g = (((c0 + c1) + c2) + ...) * (1/n)
//   with weight decay wd (L2, as torch's SGD and Adam): g = g + wd * p
//   sum-only   p = g                          (workers apply their own optimizer)
//   SGD        p = p - lr * g
//   momentum   u = mu * u + g;   p = p - lr * u
//   Adam       m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * (g * g)
//              p = p - (a * m) / (sqrt(v * c2) + eps)
//              with a = lr / (1 - b1^t), c2 = 1 / (1 - b2^t), t = update number (1-based)
//   AdamW      Adam without the L2 term, the decay decoupled (as torch's AdamW):
//              p = p * d - (a * m) / (sqrt(v * c2) + eps), with d = 1 - lr * wd
//
// lr is the learning rate times the sync policy's lr_scale (PS+ scales the
// step taken from a stale gradient; BSP uses 1). The scalars a, c2 and d are
// computed in double and rounded to float once per update (step_params()).
// Without weight decay every formula is the one without the wd terms, bit
// for bit (the decay terms are left out, not multiplied by zero).
//
// The hyperparameters (learning rate, momentum, weight decay, betas,
// epsilon) may change between updates: hyperparameters.h keeps them as
// versioned settings; the kind and the decay's coupling are fixed per job.
//
// Threads and costs. Pure functions over caller memory: no allocation, no
// locks, no I/O, any thread. reduce_apply() reads n x elements x 4 bytes of
// contributions plus the parameters and state once and writes parameters and
// state once; contributions may be unaligned (they sit in packet buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mercury::agg {

enum class OptimizerKind : uint8_t {
  kSumOnly,   ///< the chunk's "parameters" are the averaged gradient itself
  kSgd,       ///< plain SGD
  kMomentum,  ///< SGD with (heavy-ball, PyTorch-style) momentum
  kAdam,      ///< Adam with bias correction (AdamW: OptimizerConfig::decoupled_weight_decay)
};

std::string_view optimizer_name(OptimizerKind kind);

/// What an optimizer is fixed to for a whole job, with its initial
/// hyperparameters (hyperparameters_of() takes them out).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;      ///< kMomentum
  float beta1 = 0.9f;         ///< kAdam
  float beta2 = 0.999f;       ///< kAdam
  float epsilon = 1e-8f;      ///< kAdam
  float weight_decay = 0.0f;  ///< kSgd, kMomentum, kAdam; 0 = none
  /// kAdam only: the weight decay is decoupled from the gradient (AdamW)
  /// instead of added to it as an L2 term (Adam's weight_decay in torch).
  bool decoupled_weight_decay = false;
};

/// The settings a trainer may change between steps. Which ones an
/// optimizer reads: learning_rate all but sum-only; momentum kMomentum;
/// weight_decay kSgd, kMomentum and kAdam; beta1, beta2, epsilon kAdam.
struct Hyperparameters {
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  friend bool operator==(const Hyperparameters&, const Hyperparameters&) = default;
};

/// The initial hyperparameters of a configuration.
Hyperparameters hyperparameters_of(const OptimizerConfig& config);

/// Why `h` cannot drive an optimizer of this kind, or empty if it can:
/// every value finite; learning_rate and weight_decay >= 0; momentum, beta1
/// and beta2 in [0, 1); epsilon > 0; no weight decay for sum-only; a
/// decoupled decay only for kAdam. Values an optimizer does not read are
/// not checked.
std::string hyperparameters_refused(OptimizerKind kind, bool decoupled_weight_decay,
                                    const Hyperparameters& h);

/// Optimizer state floats kept per owned element: 0 (sum-only, SGD),
/// 1 (momentum: u), 2 (Adam: m and v).
uint32_t state_floats_per_element(OptimizerKind kind);

/// Which kernel runs. Every build compiles all of them, each for its
/// instruction set whatever the build's -march (optimizer_kernels.h), and
/// chooses at run time: kAuto is the widest this CPU has (AVX-512F, else
/// AVX2, else kPortable), read once from cpuid at the first call, so one
/// portable build (-Dnative=false) runs the AVX-512 kernels where the CPU
/// has them. kAvx2 / kAvx512 are the intrinsic kernels. kPortable is plain
/// C++ with no intrinsics, one element at a time in the source, compiled for
/// each set too and run at the widest the CPU has (at -O3 the compiler
/// vectorises it, with the same results since lanes are independent); on a
/// CPU without AVX2 it is what kAuto runs. The others than kAuto are for
/// tests and benchmarks.
enum class Simd : uint8_t { kAuto, kPortable, kAvx2, kAvx512 };

std::string_view simd_name(Simd simd);
/// Whether this CPU runs `simd` (kAuto and kPortable always).
bool simd_available(Simd simd);
/// kAuto -> the widest this CPU runs; anything else unchanged.
Simd resolve_simd(Simd simd);

/// The scalars of one chunk update, computed once per update (not per
/// element) by step_params().
struct StepParams {
  float inv_n = 1;  ///< 1 / number of contributions
  float lr = 0;     ///< learning rate x policy scale
  float mu = 0;
  float b1 = 0, one_minus_b1 = 0, b2 = 0, one_minus_b2 = 0, eps = 0;
  float adam_a = 0;        ///< lr / (1 - b1^t)
  float adam_c2 = 0;       ///< 1 / (1 - b2^t)
  float wd = 0;            ///< the L2 term's weight decay (0: none, and for AdamW)
  float decay = 1;         ///< AdamW: 1 - lr x weight decay
  bool decoupled = false;  ///< AdamW with a non-zero weight decay: `decay` applies
};

/// `contributions` >= 1; `step` is the 1-based number of this update of the
/// chunk (Adam's t); `lr_scale` multiplies the learning rate. `h` must pass
/// hyperparameters_refused().
StepParams step_params(OptimizerKind kind, bool decoupled_weight_decay, const Hyperparameters& h,
                       uint32_t contributions, uint64_t step, float lr_scale);
/// The same with the configuration's (initial) hyperparameters.
StepParams step_params(const OptimizerConfig& config, uint32_t contributions, uint64_t step,
                       float lr_scale);

/// One chunk update. src[0..n) point at the contributions in rank order, each
/// `elements` float32 (any alignment). `state0`/`state1` are the optimizer
/// state arrays for these elements (null when the optimizer has none).
/// `simd` must be available. Never fails.
void reduce_apply(OptimizerKind kind, Simd simd, const std::byte* const* src, uint32_t n,
                  uint64_t elements, float* param, float* state0, float* state1,
                  const StepParams& step);

/// out = src[0] + src[1] + ... + src[n-1], per element, in that order: the
/// plain SIMD sum the aggregation benchmark measures as its memory-bandwidth
/// limit. Same availability rule.
void reduce_sum(Simd simd, const std::byte* const* src, uint32_t n, uint64_t elements, float* out);

}  // namespace mercury::agg
