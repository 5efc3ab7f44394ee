// A server node's configuration from the job file, in one place, so that
// ps-server and the tests that run a job file configure a node the same way.
//
// node_config() derives everything ServerNodeConfig holds: the chunk size
// (the MTU's payload), the optimizer and the sync policy (lib/job), the
// job's shard layout and this server's rank in it, the endpoint settings
// (lib/job) with the server's tuning (room for a slice per chunk update per
// worker in flight), the shard lcores (the node's lcores after the net
// core, one per shard, the rest inline), the shard rings sized by the RX
// pools, and the flow limit (derived from the pools at run time).
// job_workers() gives every worker of the job with the port that leads to
// it (job::port_of_worker).
//
// Control path only: allocates, throws config::ConfigError naming the job
// file (and the key, where there is one) for a job this node cannot run.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "config/config.h"
#include "server/server_node.h"

namespace mercury::server {

/// The endpoint's descriptors and ingress per port: a slice per chunk update
/// per worker can be in flight (with the default, more than a ResNet-50
/// shard's chunks for 4 workers).
inline constexpr uint32_t kServerEndpointMessages = 1 << 17;

/// What a server process knows beyond the job file when it starts a node.
struct NodeStart {
  uint32_t epoch = 1;          ///< the node's transport incarnation (non-zero)
  uint64_t tsc_hz = 0;         ///< the TSC rate (EAL's, once it is up)
  uint64_t rx_pool_mbufs = 0;  ///< mbufs of the RX pools of the node's ports, summed
  /// The CPU an lcore runs on (EAL's lcore-to-CPU map once it is up); empty:
  /// every lcore on a CPU of its own.
  std::function<unsigned(unsigned)> cpu_of_lcore;
};

/// The lcores that run `node`'s shards as shard cores, in shard order: its
/// lcores after the net core, up to its shard count, stopping at the first
/// one on a CPU that the net core or an earlier shard core already runs on.
/// Two pollers of one node on one CPU only take turns at it, and a shard that
/// shares the net core's CPU does better inline on the net core (it then
/// aggregates when the net core hands it a packet, without a ring or a
/// context switch between them). The node's remaining shards run inline.
std::vector<unsigned> shard_core_lcores(const config::NodeConfig& node,
                                        const std::function<unsigned(unsigned)>& cpu_of_lcore);

/// The configuration of server `node` of `job`.
ServerNodeConfig node_config(const config::JobConfig& job, const config::NodeConfig& node,
                             const NodeStart& start);

/// Every worker of `job` in rank order, with the index of `node`'s port it
/// is reached through.
std::vector<JobWorker> job_workers(const config::JobConfig& job, const config::NodeConfig& node);

}  // namespace mercury::server
