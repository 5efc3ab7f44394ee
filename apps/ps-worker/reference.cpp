#include "reference.h"

#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

#include "../common/synthetic.h"
#include "agg/half.h"
#include "job/job.h"

namespace mercury::trainer {

void initial(std::span<float> p, size_t tensor) {
  apps::Noise n{0x5eed0000ull + tensor};
  for (float& x : p) x = n.next();
}

void gradient(std::span<float> g, uint32_t rank, uint32_t seed, size_t tensor) {
  apps::Noise n{0x9e3779b97f4a7c15ull * ((uint64_t{seed} * 131 + rank + 1) * 1009 + tensor)};
  for (float& x : g) x = n.next();
}

Update Update::of(const config::TrainingConfig& t) {
  if (t.sync != config::Sync::kBsp) {
    throw std::runtime_error("ps-worker checks every round of BSP jobs; training.sync " +
                             std::string(config::to_string(t.sync)) +
                             " runs free-running rounds (--compute-ms)");
  }
  return optimizer_of(t);
}

Update Update::optimizer_of(const config::TrainingConfig& t) {
  return Update{job::optimizer_config(t), t.optimizer == config::Optimizer::kSum};
}

void average(Floats& avg, Floats& other, uint32_t workers, uint32_t seed, size_t tensor,
             std::span<const float> own, uint32_t own_rank, wire::Dtype dtype) {
  const uint64_t all = workers >= 64 ? ~uint64_t{0} : (uint64_t{1} << workers) - 1;
  average_of(avg, other, all, seed, tensor, own, own_rank, dtype);
}

void average_of(Floats& avg, Floats& other, uint64_t ranks, uint32_t seed, size_t tensor,
                std::span<const float> own, uint32_t own_rank, wire::Dtype dtype) {
  avg.resize(own.size());
  other.resize(own.size());
  // Rank order, as the servers sum: the first rank's gradient, then the others added.
  bool first = true;
  for (uint32_t r = 0; r < 64; ++r) {
    if ((ranks >> r & 1) == 0) continue;
    std::span<const float> g = own;
    if (r != own_rank) {
      Floats& into = first ? avg : other;
      gradient(into, r, seed, tensor);
      quantize(into, dtype);
      g = into;
    }
    if (first) {
      if (r == own_rank) avg.assign(own.begin(), own.end());
      first = false;
      continue;
    }
    for (size_t i = 0; i < avg.size(); ++i) avg[i] = avg[i] + g[i];
  }
  const float scale = 1.0f / static_cast<float>(std::popcount(ranks));
  for (float& x : avg) x = x * scale;
}

void narrow(std::span<const float> f, std::span<uint16_t> out, wire::Dtype dtype) {
  const bool bf16 = dtype == wire::Dtype::kBFloat16;
  for (size_t i = 0; i < f.size(); ++i) {
    out[i] = bf16 ? agg::float_to_bf16(f[i]) : agg::float_to_fp16(f[i]);
  }
}

void quantize(std::span<float> f, wire::Dtype dtype) {
  if (dtype == wire::Dtype::kBFloat16) {
    for (float& x : f) x = agg::bf16_to_float(agg::float_to_bf16(x));
  } else if (dtype == wire::Dtype::kFloat16) {
    for (float& x : f) x = agg::fp16_to_float(agg::float_to_fp16(x));
  }
}

float widened(uint16_t h, wire::Dtype dtype) {
  return dtype == wire::Dtype::kBFloat16 ? agg::bf16_to_float(h) : agg::fp16_to_float(h);
}

bool equals_narrowed(std::span<const uint16_t> h, std::span<const float> reference,
                     wire::Dtype dtype) {
  const bool bf16 = dtype == wire::Dtype::kBFloat16;
  for (size_t i = 0; i < h.size(); ++i) {
    if (h[i] != (bf16 ? agg::float_to_bf16(reference[i]) : agg::float_to_fp16(reference[i]))) {
      return false;
    }
  }
  return true;
}

void apply(std::span<float> params, std::span<const float> avg, const Update& u, OptState& state) {
  const uint64_t t = ++state.updates;
  // The L2 term of weight decay (sgd, momentum, adam): g + wd * p.
  const float wd = u.opt.weight_decay;
  const bool l2 = wd != 0.0f && !u.opt.decoupled_weight_decay;
  auto grad = [&](size_t i) { return l2 ? avg[i] + wd * params[i] : avg[i]; };
  switch (u.opt.kind) {
    case agg::OptimizerKind::kSumOnly:
      for (size_t i = 0; i < params.size(); ++i) params[i] = avg[i];
      return;
    case agg::OptimizerKind::kSgd:
      for (size_t i = 0; i < params.size(); ++i)
        params[i] = params[i] - u.opt.learning_rate * grad(i);
      return;
    case agg::OptimizerKind::kMomentum:
      state.s0.resize(params.size(), 0.0f);
      for (size_t i = 0; i < params.size(); ++i) {
        state.s0[i] = u.opt.momentum * state.s0[i] + grad(i);
        params[i] = params[i] - u.opt.learning_rate * state.s0[i];
      }
      return;
    case agg::OptimizerKind::kAdam: {
      state.s0.resize(params.size(), 0.0f);
      state.s1.resize(params.size(), 0.0f);
      // The step's scalars as agg::step_params computes them, in double.
      const double td = static_cast<double>(t);
      const auto a = static_cast<float>(u.opt.learning_rate /
                                        (1.0 - std::pow(static_cast<double>(u.opt.beta1), td)));
      const auto c2 =
          static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(u.opt.beta2), td)));
      const float one_minus_b1 = 1.0f - u.opt.beta1;
      const float one_minus_b2 = 1.0f - u.opt.beta2;
      // AdamW: the decay scales the parameters, d = 1 - lr * wd (in double, once).
      const bool adamw = wd != 0.0f && u.opt.decoupled_weight_decay;
      const auto d = static_cast<float>(1.0 - static_cast<double>(u.opt.learning_rate) * wd);
      for (size_t i = 0; i < params.size(); ++i) {
        const float g = grad(i);
        const float m = u.opt.beta1 * state.s0[i] + one_minus_b1 * g;
        const float v = u.opt.beta2 * state.s1[i] + one_minus_b2 * (g * g);
        state.s0[i] = m;
        state.s1[i] = v;
        const float p = adamw ? params[i] * d : params[i];
        params[i] = p - (a * m) / (std::sqrt(v * c2) + u.opt.epsilon);
      }
      return;
    }
  }
}

}  // namespace mercury::trainer
