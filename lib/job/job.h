// job: what every node of a job derives from its job file, in one place, so
// that the server, the worker library and the apps configure the transport,
// the scheduler and the optimizer the same way.
//
// Control path only: these functions allocate and throw config::ConfigError
// (naming the job file and the key) for what the job asks and this build
// cannot do.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "agg/optimizer.h"
#include "agg/sync_policy.h"
#include "config/config.h"
#include "transport/endpoint.h"

namespace mercury::job {

/// The endpoint settings of one node: `network.scheduler` (strict, fifo,
/// partition with its partition and credit bytes), `network.window`,
/// `network.peer_timeout_ms`, the job id, the MTU's packet size, the TSC
/// rate; `sender_id` is the node's index in the job file, and `epoch` its
/// incarnation (non-zero; e.g. derived from the start time so that a
/// restarted node is told apart). The peers are left to the caller.
transport::EndpointConfig endpoint_config(const config::JobConfig& job, uint16_t sender_id,
                                          uint16_t epoch, uint64_t tsc_hz);

/// `training.optimizer` and its hyper-parameters.
agg::OptimizerConfig optimizer_config(const config::TrainingConfig& training);

/// `training.sync`: bsp, asp, ssp (training.staleness) or psplus.
std::unique_ptr<agg::SyncPolicy> sync_policy(const config::TrainingConfig& training);

/// The global shard count (the sum of `shards` over the server nodes) and
/// the first global shard id of each server, in rank order.
struct ShardLayout {
  uint32_t total = 0;
  std::vector<uint32_t> first;  ///< first[s]: server rank s runs [first[s], first[s] + shards)
  /// The server rank running global shard `shard`.
  [[nodiscard]] uint32_t server_of(uint32_t shard) const;
};
ShardLayout shard_layout(const config::JobConfig& job);

/// An epoch for a node starting now: non-zero, and different across
/// restarts a second or more apart.
uint16_t fresh_epoch();

}  // namespace mercury::job
