// Flow control's sizing (docs/server.md, "Flow control"): how many of a
// port's received buffers the aggregation path may own before the node
// admits only gradients that join a set other ranks have started, and how
// many marked copies may wait for a shard core on top of that.
//
// A pure function of the facts the ports give (their pool, their queues:
// net::PoolFacts, net::QueueFacts) and of the node's shape, so the policy is
// unit-tested without a port. The server node calls it when a port's first
// gradient or init packet shows the pool its packets arrive in.
//
// Threads and costs: pure, allocates its result; the control path of the
// net core, once per port.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "net/packet_port.h"

namespace mercury::server {

/// One port of the node as flow control sees it.
struct FlowPort {
  const void* pool = nullptr;  ///< the pool its packets arrive in, once seen (null: not yet)
  uint32_t workers = 1;        ///< workers behind it
  net::QueueFacts queues;      ///< its descriptor rings
};

struct FlowFacts {
  net::PoolFacts pool;          ///< the pool a packet just showed (its id matches ports' pool)
  std::vector<FlowPort> ports;  ///< every port of the node
  uint32_t workers = 1;         ///< the node's workers
  /// ServerNodeConfig::flow_limit: non-zero, taken as it is (for the port
  /// of `configured_port` only).
  uint64_t configured = 0;
  uint32_t configured_port = 0;
  bool staging = false;           ///< some shard has staging chunks
  bool stages_every_set = false;  ///< every shard can stage every set
  bool shard_cores = false;       ///< some shard runs on a core of its own
  uint32_t burst = net::PacketPort::kBurst;
  uint32_t stage = net::PacketPort::kStage;
};

struct FlowLimit {
  uint64_t limit = 0;   ///< buffers owned before only joining gradients are admitted
  uint64_t copies = 0;  ///< marked copies allowed on top of it
};

/// Per port: its limit when its pool is facts.pool (or it is the configured
/// port), else nothing (unchanged).
///
/// The rule. The pool, less what the rest of the path may have out of it
/// at once: per port using it, its RX and TX descriptor rings and its TX
/// stage and a burst of spares; then four RX bursts and every lcore's cache
/// (buffers freed on a shard core wait there). Ports whose packets come from
/// one pool share what is left equally. Packets that join a started set are
/// admitted over the limit (refusing them can deadlock), so each set
/// started under it may still take one packet from each other worker behind
/// the port, up to N - 1 in all: dividing by that depth keeps starts plus
/// joins within the pool (depth 1 when every set can be staged). With
/// staging, a quarter of the share is kept for marked copies waiting for a
/// shard core (a burst when the shards run inline and copy at once).
std::vector<std::optional<FlowLimit>> flow_limits(const FlowFacts& facts);

}  // namespace mercury::server
