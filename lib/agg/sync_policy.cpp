#include "agg/sync_policy.h"

#include <cmath>

#include "base/serial.h"

namespace mercury::agg {

using base::serial_diff;

std::string_view AsyncPolicy::name() const {
  if (options_.lr != StalenessLr::kNone) return "staleness-scaled";
  return options_.max_staleness == UINT32_MAX ? "asp" : "ssp";
}

Admission AsyncPolicy::admit(uint32_t version, uint32_t iteration) const {
  const int32_t d = serial_diff(version, iteration);
  if (d < 0) return Admission::kFuture;
  return static_cast<uint32_t>(d) > options_.max_staleness ? Admission::kStale : Admission::kAccept;
}

float AsyncPolicy::lr_scale(uint32_t staleness) const {
  const float n = 1.0f + static_cast<float>(staleness);
  switch (options_.lr) {
    case StalenessLr::kNone:
      return 1.0f;
    case StalenessLr::kInverse:
      return 1.0f / n;
    case StalenessLr::kInverseSqrt:
      return 1.0f / std::sqrt(n);
  }
  return 1.0f;
}

std::unique_ptr<SyncPolicy> make_bsp() { return std::make_unique<BspPolicy>(); }
std::unique_ptr<SyncPolicy> make_asp() { return std::make_unique<AsyncPolicy>(); }
std::unique_ptr<SyncPolicy> make_ssp(uint32_t max_staleness) {
  return std::make_unique<AsyncPolicy>(AsyncPolicy::Options{.max_staleness = max_staleness});
}
std::unique_ptr<SyncPolicy> make_staleness_scaled(uint32_t max_staleness, StalenessLr lr) {
  return std::make_unique<AsyncPolicy>(
      AsyncPolicy::Options{.max_staleness = max_staleness, .lr = lr});
}

}  // namespace mercury::agg
