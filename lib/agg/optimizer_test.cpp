#include "agg/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace mercury::agg {
namespace {

// The formulas of optimizer.h, one element at a time, written out
// independently of the kernels.
struct Reference {
  OptimizerConfig c;
  std::vector<float> p, s0, s1;
  uint64_t t = 0;

  void step(const std::vector<std::vector<float>>& grads, float lr_scale = 1.0f) {
    ++t;
    const float inv_n = 1.0f / static_cast<float>(grads.size());
    const float lr = c.learning_rate * lr_scale;
    const float a = static_cast<float>(lr / (1.0 - std::pow(double{c.beta1}, double(t))));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{c.beta2}, double(t))));
    for (size_t i = 0; i < p.size(); ++i) {
      float sum = grads[0][i];
      for (size_t r = 1; r < grads.size(); ++r) sum = sum + grads[r][i];
      const float g = sum * inv_n;
      switch (c.kind) {
        case OptimizerKind::kSumOnly:
          p[i] = g;
          break;
        case OptimizerKind::kSgd:
          p[i] = p[i] - lr * g;
          break;
        case OptimizerKind::kMomentum:
          s0[i] = c.momentum * s0[i] + g;
          p[i] = p[i] - lr * s0[i];
          break;
        case OptimizerKind::kAdam: {
          s0[i] = c.beta1 * s0[i] + (1.0f - c.beta1) * g;
          s1[i] = c.beta2 * s1[i] + (1.0f - c.beta2) * (g * g);
          p[i] = p[i] - (a * s0[i]) / (std::sqrt(s1[i] * c2) + c.epsilon);
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

// Every kernel width, every optimizer, several steps, odd sizes (vector body
// plus scalar tail) and unaligned contributions: bytes equal the reference.
TEST(AggOptimizer, EveryKernelMatchesTheScalarReferenceBitForBit) {
  std::mt19937 rng(7);
  for (OptimizerKind kind : kKinds) {
    for (Simd simd : kSimds) {
      if (!simd_available(simd)) continue;
      for (uint32_t n : {1u, 3u, 4u, 5u}) {
        SCOPED_TRACE(std::string(optimizer_name(kind)) + " " + std::string(simd_name(simd)) +
                     " n=" + std::to_string(n));
        constexpr size_t kElems = 354 + 7;
        OptimizerConfig c{.kind = kind, .learning_rate = 0.05f};
        Reference ref{.c = c};
        ref.p = random_floats(rng, kElems, 1.0f);
        ref.s0.assign(kElems, 0.0f);
        ref.s1.assign(kElems, 0.0f);
        std::vector<float> p = ref.p, s0 = ref.s0, s1 = ref.s1;
        for (uint64_t t = 1; t <= 4; ++t) {
          std::vector<std::vector<float>> grads;
          // Contributions at an odd byte offset, as in a packet buffer.
          std::vector<std::vector<std::byte>> bufs;
          std::vector<const std::byte*> src;
          for (uint32_t r = 0; r < n; ++r) {
            grads.push_back(random_floats(rng, kElems, r % 2 ? 1e-3f : 10.0f));
            bufs.emplace_back(kElems * 4 + 3);
            std::memcpy(bufs.back().data() + 3, grads.back().data(), kElems * 4);
          }
          for (auto& b : bufs) src.push_back(b.data() + 3);
          const float scale = t == 3 ? 0.5f : 1.0f;
          ref.step(grads, scale);
          reduce_apply(kind, simd, src.data(), n, kElems, p.data(), s0.data(), s1.data(),
                       step_params(c, n, t, scale));
          ASSERT_EQ(0, std::memcmp(p.data(), ref.p.data(), kElems * 4)) << "step " << t;
          ASSERT_EQ(0, std::memcmp(s0.data(), ref.s0.data(), kElems * 4)) << "step " << t;
          ASSERT_EQ(0, std::memcmp(s1.data(), ref.s1.data(), kElems * 4)) << "step " << t;
        }
      }
    }
  }
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
