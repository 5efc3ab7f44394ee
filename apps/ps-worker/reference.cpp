#include "reference.h"

#include <stdexcept>
#include <string>

#include "../common/synthetic.h"

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
    throw std::runtime_error("ps-worker checks BSP jobs (training.sync: bsp)");
  }
  if (t.optimizer != config::Optimizer::kSgd && t.optimizer != config::Optimizer::kSum) {
    throw std::runtime_error("ps-worker checks the sgd and sum optimizers; the job asks for " +
                             std::string(config::to_string(t.optimizer)));
  }
  return Update{t.optimizer == config::Optimizer::kSum, static_cast<float>(t.learning_rate)};
}

void average(std::vector<float>& avg, uint32_t workers, uint32_t seed, size_t tensor,
             std::span<const float> own, uint32_t own_rank) {
  avg.resize(own.size());
  std::vector<float> other(own.size());
  if (own_rank == 0) {
    avg.assign(own.begin(), own.end());
  } else {
    gradient(avg, 0, seed, tensor);
  }
  for (uint32_t r = 1; r < workers; ++r) {
    std::span<const float> g = own;
    if (r != own_rank) {
      gradient(other, r, seed, tensor);
      g = other;
    }
    for (size_t i = 0; i < avg.size(); ++i) avg[i] = avg[i] + g[i];
  }
  const float scale = 1.0f / static_cast<float>(workers);
  for (float& x : avg) x = x * scale;
}

void apply(std::span<float> params, std::span<const float> avg, const Update& u) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = u.sum_only ? avg[i] : params[i] - u.lr * avg[i];
  }
}

}  // namespace mercury::trainer
