#include "server/flow_control.h"

#include <algorithm>

namespace mercury::server {

std::vector<std::optional<FlowLimit>> flow_limits(const FlowFacts& f) {
  std::vector<std::optional<FlowLimit>> out(f.ports.size());
  if (f.configured != 0) {
    if (f.configured_port < out.size()) {
      out[f.configured_port] = FlowLimit{f.configured, f.staging ? f.burst : 0};
    }
    return out;
  }
  uint64_t headroom =
      4 * uint64_t{f.burst} + uint64_t{f.pool.cache_size} * 3 / 2 * f.pool.cache_lcores;
  uint64_t sharing = 0;
  for (const FlowPort& q : f.ports) {
    if (q.pool != f.pool.id) continue;
    ++sharing;
    headroom += uint64_t{f.stage} + f.burst + q.queues.rx_descriptors + q.queues.tx_descriptors;
  }
  if (sharing == 0) return out;
  const uint64_t usable = f.pool.size > headroom ? f.pool.size - headroom : 0;
  const uint64_t share = usable / sharing;
  const uint64_t copies = !f.staging ? 0 : !f.shard_cores ? f.burst : share / 4;
  for (size_t i = 0; i < f.ports.size(); ++i) {
    const FlowPort& q = f.ports[i];
    if (q.pool != f.pool.id) continue;
    const uint64_t depth =
        f.stages_every_set
            ? 1
            : std::max<uint64_t>(1,
                                 std::min<uint64_t>(q.workers, f.workers > 1 ? f.workers - 1 : 1));
    out[i] = FlowLimit{std::max<uint64_t>(1, (share - std::min(share, copies)) / depth), copies};
  }
  return out;
}

}  // namespace mercury::server
