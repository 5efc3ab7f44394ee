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
#include <string_view>
#include <vector>

#include "agg/optimizer.h"
#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "config/config.h"
#include "transport/endpoint.h"

namespace mercury::job {

/// The transport's RTO floor when any node of the job polls adaptively
/// (`network.poll` or a node's `poll`): such a node yields its CPU, and an
/// RTT now and then is then a scheduler time slice (docs/transport.md,
/// "Retransmission timer").
inline constexpr uint32_t kAdaptiveMinRtoUs = 10'000;

/// The endpoint settings of one node: `network.scheduler` (strict, fifo,
/// partition with its partition and credit bytes), `network.window`,
/// `network.peer_timeout_ms`, the RTO floor (kAdaptiveMinRtoUs when any node
/// polls adaptively, else the transport's 1 ms), the job id, the MTU's packet
/// size, the TSC rate; `sender_id` is the node's index in the job file, and
/// `epoch` its incarnation (non-zero; fresh_epoch(), so that a restarted node
/// is told apart). The peers are left to the caller.
transport::EndpointConfig endpoint_config(const config::JobConfig& job, uint16_t sender_id,
                                          uint32_t epoch, uint64_t tsc_hz);

/// `training.optimizer` and its hyper-parameters.
agg::OptimizerConfig optimizer_config(const config::TrainingConfig& training);

/// `training.aggregation` as the server's store-and-forward unit in chunks
/// (server::Shard): 0 for chunk; for tensor, UINT32_MAX (the whole tensor),
/// or under `scheduler: partition` the packets of one partition (the
/// partition as the endpoint cuts it: partition_bytes rounded down to whole
/// packets, at least one).
uint32_t store_forward_unit(const config::JobConfig& job);

/// How every node cuts the tensors into blocks: the automatic split
/// (agg::PlacementOptions), except under `training.aggregation: tensor`,
/// where a tensor stays one block (below the 4 GiB message cap), so that the
/// unit a server holds is the whole tensor, as a classical PS's key is.
agg::PlacementOptions placement_options(const config::JobConfig& job);

/// `training.sync`: bsp, asp, ssp (training.staleness) or psplus.
std::unique_ptr<agg::SyncPolicy> sync_policy(const config::TrainingConfig& training);

/// The global shard count (the sum of `shards` over the server nodes) and
/// the first global shard id of each server, in rank order. Computed once,
/// here; the server node and the workers receive it.
struct ShardLayout {
  uint32_t total = 0;
  std::vector<uint32_t> first;  ///< first[s]: server rank s runs [first[s], first[s] + count(s))
  /// The server rank running global shard `shard`.
  [[nodiscard]] uint32_t server_of(uint32_t shard) const;
  /// The shards server rank `server` runs (0 for a rank the layout has not).
  [[nodiscard]] uint32_t count(uint32_t server) const;
  [[nodiscard]] uint32_t servers() const { return static_cast<uint32_t>(first.size()); }
  /// The layout of servers with these shard counts, in rank order: what
  /// shard_layout() computes from a job file, for tests and tools that have
  /// none. Counts are taken as given (0 included).
  static ShardLayout of(const std::vector<uint32_t>& shards_per_server);
};
/// Throws ConfigError when the job has no server shards.
ShardLayout shard_layout(const config::JobConfig& job);

/// The worker node a process runs: `name`, which must be a worker of the job
/// with a port. Throws ConfigError naming the file (an unknown name listing
/// the nodes, a server's name, a worker without a port).
const config::NodeConfig& worker_node(const config::JobConfig& job, std::string_view name);

/// Node `n` as its peers address it: its name, IPv4 and UDP port, and its id
/// in the job (its index in the job file: the sender id its packets carry).
/// The peer's epoch is left to learn (0).
transport::PeerSpec peer_of(const config::NodeConfig& n);

/// Which of `server`'s ports leads to each worker, in rank order, then to
/// each spare (config::JobConfig::spares): a ring link whose far end is
/// that worker; otherwise, with one port per worker (spares included),
/// port i serves the i-th of that order; with a single port (a bridge, a
/// switch), every worker is behind it. Any other layout throws ConfigError
/// naming the file, the server's `nodes[i].ports` key and the worker.
std::vector<uint32_t> port_of_worker(const config::JobConfig& job,
                                     const config::NodeConfig& server);

/// An epoch for a node starting now: the wall clock in milliseconds since
/// the Unix epoch, mod 2^32, never 0. Two incarnations of a node started at
/// least 1 ms apart (EAL's start-up alone takes far longer) get different
/// epochs, and the later is newer (transport::epoch_newer) while they are
/// less than 2^31 ms (24.8 days) apart. A wall clock stepped back across a
/// restart can make the new epoch look older: the restart is then not seen.
uint32_t fresh_epoch();

}  // namespace mercury::job
