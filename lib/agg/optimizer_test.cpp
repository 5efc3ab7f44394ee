#include "agg/optimizer.h"
#include "agg/optimizer_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace mercury::agg {
namespace {

// The formulas of optimizer.h, one element at a time, written out
// independently of the kernels.
struct Reference {
  OptimizerKind kind = OptimizerKind::kSgd;
  bool decoupled = false;
  std::vector<float> p, s0, s1;
  uint64_t t = 0;

  void step(const std::vector<std::vector<float>>& grads, const Hyperparameters& h,
            float lr_scale = 1.0f) {
    ++t;
    const float inv_n = 1.0f / static_cast<float>(grads.size());
    const float lr = h.learning_rate * lr_scale;
    const float a = static_cast<float>(lr / (1.0 - std::pow(double{h.beta1}, double(t))));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{h.beta2}, double(t))));
    const float wd = h.weight_decay;
    const bool l2 = kind != OptimizerKind::kSumOnly && !decoupled && wd != 0.0f;
    const bool adamw = decoupled && wd != 0.0f;
    const float decay = static_cast<float>(1.0 - double{lr} * double{wd});
    for (size_t i = 0; i < p.size(); ++i) {
      float sum = grads[0][i];
      for (size_t r = 1; r < grads.size(); ++r) sum = sum + grads[r][i];
      float g = sum * inv_n;
      if (l2) g = g + wd * p[i];
      switch (kind) {
        case OptimizerKind::kSumOnly:
          p[i] = g;
          break;
        case OptimizerKind::kSgd:
          p[i] = p[i] - lr * g;
          break;
        case OptimizerKind::kMomentum:
          s0[i] = h.momentum * s0[i] + g;
          p[i] = p[i] - lr * s0[i];
          break;
        case OptimizerKind::kAdam: {
          s0[i] = h.beta1 * s0[i] + (1.0f - h.beta1) * g;
          s1[i] = h.beta2 * s1[i] + (1.0f - h.beta2) * (g * g);
          const float q = (a * s0[i]) / (std::sqrt(s1[i] * c2) + h.epsilon);
          p[i] = (adamw ? p[i] * decay : p[i]) - q;
          break;
        }
      }
    }
  }
};

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

constexpr OptimizerKind kKinds[] = {OptimizerKind::kSumOnly, OptimizerKind::kSgd,
                                    OptimizerKind::kMomentum, OptimizerKind::kAdam};
constexpr Simd kSimds[] = {Simd::kPortable, Simd::kAvx2, Simd::kAvx512};

// The variants an optimizer kind has: no weight decay, L2, and for Adam the
// decoupled decay (AdamW).
struct Variant {
  OptimizerKind kind;
  float weight_decay;
  bool decoupled;
};
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (OptimizerKind kind : kKinds) {
    v.push_back({kind, 0.0f, false});
    if (kind == OptimizerKind::kSumOnly) continue;
    v.push_back({kind, 0.01f, false});
    if (kind == OptimizerKind::kAdam) {
      v.push_back({kind, 0.01f, true});
      v.push_back({kind, 0.0f, true});  // AdamW without decay is Adam
    }
  }
  return v;
}

std::string variant_name(const Variant& v) {
  return std::string(optimizer_name(v.kind)) + (v.decoupled ? "W" : "") +
         " wd=" + std::to_string(v.weight_decay);
}

// Step t's hyperparameters: every one of them moves, as a schedule moves the
// learning rate.
Hyperparameters schedule(uint64_t t, float weight_decay) {
  return Hyperparameters{.learning_rate = 0.05f / static_cast<float>(t),
                         .momentum = t % 2 ? 0.9f : 0.8f,
                         .weight_decay = weight_decay * static_cast<float>(t),
                         .beta1 = t < 3 ? 0.9f : 0.85f,
                         .beta2 = t < 2 ? 0.999f : 0.99f,
                         .epsilon = t < 4 ? 1e-8f : 1e-6f};
}

// Four steps of `apply` (called as reduce_apply is, less the Simd) from
// random parameters, each of n contributions at an odd byte offset (as in a
// packet buffer), with hyperparameters that change every step and the third
// at half the learning rate: parameters and state equal the scalar
// reference's bit for bit.
template <class Apply>
void expect_reference_steps(const Variant& var, uint32_t n, size_t elems, std::mt19937& rng,
                            const Apply& apply) {
  Reference ref{.kind = var.kind, .decoupled = var.decoupled};
  ref.p = random_floats(rng, elems, 1.0f);
  ref.s0.assign(elems, 0.0f);
  ref.s1.assign(elems, 0.0f);
  std::vector<float> p = ref.p, s0 = ref.s0, s1 = ref.s1;
  for (uint64_t t = 1; t <= 4; ++t) {
    std::vector<std::vector<float>> grads;
    std::vector<std::vector<std::byte>> bufs;
    std::vector<const std::byte*> src;
    for (uint32_t r = 0; r < n; ++r) {
      grads.push_back(random_floats(rng, elems, r % 2 ? 1e-3f : 10.0f));
      bufs.emplace_back(elems * 4 + 3);
      std::memcpy(bufs.back().data() + 3, grads.back().data(), elems * 4);
    }
    for (auto& b : bufs) src.push_back(b.data() + 3);
    const float scale = t == 3 ? 0.5f : 1.0f;
    const Hyperparameters h =
        var.kind == OptimizerKind::kSumOnly ? Hyperparameters{} : schedule(t, var.weight_decay);
    ASSERT_EQ(hyperparameters_refused(var.kind, var.decoupled, h), "");
    ref.step(grads, h, scale);
    apply(var.kind, src.data(), n, elems, p.data(), s0.data(), s1.data(),
          step_params(var.kind, var.decoupled, h, n, t, scale));
    ASSERT_EQ(0, std::memcmp(p.data(), ref.p.data(), elems * 4)) << "step " << t;
    ASSERT_EQ(0, std::memcmp(s0.data(), ref.s0.data(), elems * 4)) << "step " << t;
    ASSERT_EQ(0, std::memcmp(s1.data(), ref.s1.data(), elems * 4)) << "step " << t;
  }
}

// Every kernel width, every optimizer and weight-decay variant, several steps
// whose hyperparameters change, odd sizes (vector body plus scalar tail) and
// unaligned contributions: bytes equal the reference.
TEST(AggOptimizer, EveryKernelMatchesTheScalarReferenceBitForBit) {
  std::mt19937 rng(7);
  for (const Variant& var : variants()) {
    for (Simd simd : kSimds) {
      if (!simd_available(simd)) continue;
      for (uint32_t n : {1u, 3u, 4u, 5u}) {
        SCOPED_TRACE(variant_name(var) + " " + std::string(simd_name(simd)) +
                     " n=" + std::to_string(n));
        expect_reference_steps(
            var, n, 354 + 7, rng,
            [simd](OptimizerKind k, const std::byte* const* src, uint32_t count, uint64_t elems,
                   float* p, float* s0, float* s1, const StepParams& step) {
              reduce_apply(k, simd, src, count, elems, p, s0, s1, step);
            });
      }
    }
  }
}

// Each instruction set's kernels directly (the ones an older CPU gets too):
// the intrinsic and the plain C++ kernel of every set this CPU can run, and
// its sum, equal the scalar reference.
TEST(AggOptimizer, EveryInstructionSetsKernelsMatchTheReference) {
  struct Set {
    const char* name;
    const KernelSet* kernels;
    bool runs;
  };
  const Set sets[] = {{"baseline", &kBaselineKernels, true},
                      {"avx2", &kAvx2Kernels, simd_available(Simd::kAvx2)},
                      {"avx512", &kAvx512Kernels, simd_available(Simd::kAvx512)}};
  std::mt19937 rng(11);
  constexpr size_t kElems = 1000 + 13;
  for (const Set& set : sets) {
    if (!set.runs) continue;
    for (const Variant& var : variants()) {
      for (const auto apply : {set.kernels->apply, set.kernels->apply_plain}) {
        SCOPED_TRACE(std::string(set.name) + " " + variant_name(var) +
                     (apply == set.kernels->apply ? "" : " (plain)"));
        expect_reference_steps(var, 4, kElems, rng, apply);
      }
    }
    std::vector<std::vector<float>> g;
    std::vector<const std::byte*> src;
    for (int r = 0; r < 3; ++r) g.push_back(random_floats(rng, kElems, 10.0f));
    for (auto& v : g) src.push_back(reinterpret_cast<const std::byte*>(v.data()));
    std::vector<float> out(kElems);
    set.kernels->sum(src.data(), 3, kElems, out.data());
    for (size_t i = 0; i < kElems; ++i) {
      const float want = (g[0][i] + g[1][i]) + g[2][i];
      ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << set.name << " sum, i=" << i;
    }
  }
}

// kAuto is the widest set the CPU has, as the kernel reports it in
// /proc/cpuinfo (read here independently of the library's cpuid check).
TEST(AggOptimizer, TheWidestSetTheCpuHasIsChosen) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const bool avx512 = flags.find(" avx512f ") != std::string::npos &&
                      flags.find(" avx512bw ") != std::string::npos &&
                      flags.find(" avx512vl ") != std::string::npos;
  const bool avx2 = flags.find(" avx2 ") != std::string::npos;
  EXPECT_EQ(simd_available(Simd::kAvx512), avx512);
  EXPECT_EQ(simd_available(Simd::kAvx2), avx2);
  EXPECT_EQ(resolve_simd(Simd::kAuto),
            avx512 ? Simd::kAvx512 : (avx2 ? Simd::kAvx2 : Simd::kPortable));
  std::printf("kernels chosen at start: %s\n",
              std::string(simd_name(resolve_simd(Simd::kAuto))).c_str());
}

// Without weight decay a parameter that is infinite stays what it was: the
// L2 term is left out, not multiplied by a zero weight decay (0 x inf = NaN).
TEST(AggOptimizer, NoWeightDecayLeavesNoTrace) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    for (bool decoupled : {false, kind == OptimizerKind::kAdam}) {
      SCOPED_TRACE(std::string(optimizer_name(kind)) + (decoupled ? "W" : ""));
      float p = INFINITY, s0 = 0, s1 = 0;
      const float g = 1.0f;
      const std::byte* src = reinterpret_cast<const std::byte*>(&g);
      const Hyperparameters h{.learning_rate = 0.1f, .weight_decay = 0.0f};
      reduce_apply(kind, Simd::kPortable, &src, 1, 1, &p, &s0, &s1,
                   step_params(kind, decoupled, h, 1, 1, 1.0f));
      EXPECT_EQ(p, INFINITY);
    }
  }
}

TEST(AggOptimizer, StepParamsOfAConfigAreItsHyperparameters) {
  const OptimizerConfig c{.kind = OptimizerKind::kAdam,
                          .learning_rate = 0.25f,
                          .beta1 = 0.8f,
                          .beta2 = 0.9f,
                          .epsilon = 1e-6f,
                          .weight_decay = 0.5f,
                          .decoupled_weight_decay = true};
  const Hyperparameters h = hyperparameters_of(c);
  EXPECT_EQ(h.learning_rate, 0.25f);
  EXPECT_EQ(h.weight_decay, 0.5f);
  EXPECT_EQ(h.beta1, 0.8f);
  const StepParams a = step_params(c, 4, 3, 0.5f);
  const StepParams b = step_params(OptimizerKind::kAdam, true, h, 4, 3, 0.5f);
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof a));
  EXPECT_TRUE(a.decoupled);
  EXPECT_EQ(a.wd, 0.0f);  // decoupled: no L2 term
  EXPECT_EQ(a.decay, static_cast<float>(1.0 - 0.125 * 0.5));
  const StepParams l2 = step_params(OptimizerKind::kMomentum, false, h, 4, 3, 1.0f);
  EXPECT_FALSE(l2.decoupled);
  EXPECT_EQ(l2.wd, 0.5f);
}

TEST(AggOptimizer, RefusedHyperparametersNameTheValue) {
  const Hyperparameters ok;
  for (OptimizerKind kind : kKinds) EXPECT_EQ(hyperparameters_refused(kind, false, ok), "");
  EXPECT_EQ(hyperparameters_refused(OptimizerKind::kAdam, true, ok), "");
  auto refused = [](OptimizerKind kind, bool decoupled, Hyperparameters h, const char* what) {
    const std::string why = hyperparameters_refused(kind, decoupled, h);
    EXPECT_NE(why.find(what), std::string::npos) << why;
  };
  refused(OptimizerKind::kSgd, true, ok, "AdamW");
  refused(OptimizerKind::kSumOnly, false, {.weight_decay = 0.1f}, "weight_decay");
  refused(OptimizerKind::kSgd, false, {.learning_rate = -1.0f}, "learning_rate");
  refused(OptimizerKind::kSgd, false, {.learning_rate = NAN}, "learning_rate");
  refused(OptimizerKind::kSgd, false, {.weight_decay = -0.1f}, "weight_decay");
  refused(OptimizerKind::kMomentum, false, {.momentum = 1.0f}, "momentum");
  refused(OptimizerKind::kAdam, false, {.beta1 = 1.0f}, "beta1");
  refused(OptimizerKind::kAdam, false, {.beta2 = -0.5f}, "beta2");
  refused(OptimizerKind::kAdam, false, {.epsilon = 0.0f}, "epsilon");
  // What an optimizer does not read is not checked.
  EXPECT_EQ(hyperparameters_refused(OptimizerKind::kSgd, false, {.momentum = 5.0f}), "");
  EXPECT_EQ(hyperparameters_refused(OptimizerKind::kSumOnly, false, {.learning_rate = -1.0f}), "");
}

TEST(AggOptimizer, PlainSumMatchesRankOrderSum) {
  std::mt19937 rng(9);
  for (Simd simd : kSimds) {
    if (!simd_available(simd)) continue;
    constexpr size_t kElems = 1000;
    std::vector<std::vector<float>> g;
    std::vector<const std::byte*> src;
    for (int r = 0; r < 4; ++r) g.push_back(random_floats(rng, kElems, r * 100.0f + 1e-3f));
    for (auto& v : g) src.push_back(reinterpret_cast<const std::byte*>(v.data()));
    std::vector<float> out(kElems);
    reduce_sum(simd, src.data(), 4, kElems, out.data());
    for (size_t i = 0; i < kElems; ++i) {
      const float want = ((g[0][i] + g[1][i]) + g[2][i]) + g[3][i];
      ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << simd_name(simd) << " i=" << i;
    }
  }
}

TEST(AggOptimizer, StateSizes) {
  EXPECT_EQ(state_floats_per_element(OptimizerKind::kSumOnly), 0u);
  EXPECT_EQ(state_floats_per_element(OptimizerKind::kSgd), 0u);
  EXPECT_EQ(state_floats_per_element(OptimizerKind::kMomentum), 1u);
  EXPECT_EQ(state_floats_per_element(OptimizerKind::kAdam), 2u);
  EXPECT_TRUE(simd_available(Simd::kPortable));
  EXPECT_NE(resolve_simd(Simd::kAuto), Simd::kAuto);
}

}  // namespace
}  // namespace mercury::agg
