// A parameter server node: one transport endpoint per worker link, receiving
// packet by packet, and the node's shards (server::Shard), run inline on the
// polling core.
//
// This is the single-lcore layout: poll_st() receives, dispatches each
// gradient packet to the shard that owns its partition (agg::Placement), the
// shard aggregates and fans the update out through the endpoints, and the
// endpoints send. The multi-lcore layout of ARCHITECTURE.md (a core per
// shard fed by rings, rte_flow steering) reuses Shard unchanged; it is not
// built yet (docs/server.md).
//
// Threads: everything belongs to the core that calls poll_st(), except that
// Shard::on_update may be driven from there and send through any endpoint.
// Construction is control path and throws std::invalid_argument naming what
// is wrong.
#pragma once

#include <memory>
#include <vector>

#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "net/interface.h"
#include "server/shard.h"
#include "transport/endpoint.h"

namespace mercury::server {

/// The interface towards one worker (rank = its index) and that worker.
struct WorkerLink {
  net::Interface* iface = nullptr;
  transport::PeerSpec worker;
};

struct ServerNodeConfig {
  uint32_t chunk_bytes = 0;            ///< net::payload_per_packet(mtu), as on every node
  agg::OptimizerConfig optimizer;      ///< applied to every chunk update
  std::vector<uint32_t> shard_ids;     ///< the global shards this node runs
  transport::EndpointConfig endpoint;  ///< per link; its peers are set from the link
  uint64_t shard_memory_limit = uint64_t{4} << 30;
};

struct ServerCounters {
  ShardCounters shards;             ///< summed over the node's shards
  uint64_t not_ours = 0;            ///< gradient packets for a shard this node does not run
  transport::EndpointCounters net;  ///< summed over the endpoints (a subset of fields)
};

class ServerNode {
 public:
  /// `placement` must outlive the node, and its partitions' priorities must
  /// be scheduler levels (< 64): compute it from the workers'
  /// worker::TensorTable::declarations(), which map priorities onto levels.
  ServerNode(const agg::Placement& placement, std::vector<WorkerLink> links,
             const ServerNodeConfig& config, transport::Tick now);
  ~ServerNode();
  ServerNode(const ServerNode&) = delete;
  ServerNode& operator=(const ServerNode&) = delete;

  /// One pass over every endpoint; returns the work done (0 = idle).
  uint32_t poll_st(transport::Tick now);

  [[nodiscard]] ServerCounters counters_st() const;
  [[nodiscard]] transport::Endpoint& endpoint(uint32_t rank) { return *endpoints_[rank]; }
  [[nodiscard]] const Shard* shard(uint32_t global_id) const;

 private:
  class RankReceiver;
  bool contribute_st(uint16_t rank, const wire::HeaderFields& h, std::span<const std::byte> payload,
                     rte_mbuf* mbuf);

  const agg::Placement& placement_;
  std::vector<std::unique_ptr<RankReceiver>> receivers_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<std::unique_ptr<Shard>> shards_;  // after the endpoints they send through
  std::vector<int32_t> shard_slot_;             // global shard id -> index in shards_, or -1
  uint64_t not_ours_ = 0;
};

}  // namespace mercury::server
