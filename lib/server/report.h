// What a server node tells its operator, as text: the --check line, the
// per-second stats line and its drop list, the warning about RX pools too
// small for the placement, and the telemetry group's values. Runner
// (runner.h) prints them; ps-server's output is these strings.
//
// Pure functions on counters and the job (no DPDK calls), so the tests
// check the exact text. Control path: they allocate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agg/placement.h"
#include "config/config.h"
#include "server/server_node.h"
#include "telemetry/telemetry.h"

namespace mercury::server {

/// "<file>: ok: server s0 (rank 0 of 1), shards 0..1 of 2, 4 workers, 4 ports".
std::string check_line(const config::JobConfig& job, const config::NodeConfig& node);

/// " name=n ..." for every drop counter that is not zero, walking
/// ServerCounters::for_each: the endpoints' drops, the ports' (the stack's,
/// then the PMDs' own: rx_nombuf, imissed, ierrors, oerrors), the node's
/// own, then the contributions the shards refused (shard_refused); " none"
/// when there is none.
std::string drops_text(const ServerCounters& c);

/// Where a node's retransmissions came from, summed over its peers:
/// " (RTO 380 after 40 probes, 38 answered, and 25 expiries, 7 shown
/// spurious, SACK 20, tail probes 10; 12 of the workers' resends arrived
/// twice)", or "" when nothing was resent either way.
std::string retransmission_text(const transport::PeerCounters& t);

/// What changed over the last second, for stats_line().
struct Rates {
  uint64_t frames_in = 0;     ///< frames received on every port
  uint64_t frames_out = 0;    ///< frames sent on every port
  uint64_t aggregations = 0;  ///< chunk updates
};

/// What the asynchronous fan-out deferred (snapshots_full, fanout_merged:
/// docs/server.md, "Snapshots") and, under psplus, the eager copies it sent
/// (eager_sent), as "; async fan-out: ..." for the final line, or empty
/// when there is none of them (always under BSP).
std::string async_fanout_text(const ServerCounters& c);

/// The staleness the shards applied updates with (staleness_sum,
/// stale_updates: docs/server.md, "Staleness"), as "; stale updates: S of
/// U, V.VV versions behind on average" for the final line, or empty when no
/// update was stale (always under BSP). Under asp and ssp the workers cannot
/// count it (WorkerStats): this is where it shows.
std::string staleness_text(const ServerCounters& c);
/// "; workers removed: N" when an asynchronous job went on without a rank
/// (docs/membership.md), else "".
std::string membership_text(const ServerCounters& c);
/// A hot standby's line for the end of the run (docs/durability.md): what
/// was replicated (primary) or adopted and answered again (standby); "" for
/// a node without one.
std::string standby_line(const ServerCounters& c, Standby role);

/// "[   5.0s] running  pkts in 412345/s out 398765/s  aggregations 9876/s
/// (total 41234)  retransmissions 12  rx pool free 7843  drops:
/// retransmit_stale=3". `rx_pool_free`: the fewest free mbufs in any of the
/// node's RX pools (net::Interface::rx_pool_free), so that one port's
/// exhausted pool shows as 0.
std::string stats_line(double seconds, NodeState state, const Rates& per_second,
                       const ServerCounters& c, uint64_t rx_pool_free);

/// "port net_memif2: link down" (or "link up"): said when a port's link
/// changes, as the net core's refresh saw it (a net_memif port is down
/// while its peer is not connected).
std::string link_line(const std::string& port, bool up);
/// "mapped in the shared memory of the connected net_memif links (72.0 MB)":
/// said each time a link came up and net::populate_memif_regions mapped
/// `bytes` in (every connected link's regions, the new one's included).
std::string populate_line(uint64_t bytes);
/// "port X: every worker behind it left; detached" or "port X: attached
/// again" (ServerNode detaches a memif port whose workers all left).
std::string detach_line(const std::string& port, bool detached);

/// Flow control (docs/server.md) copies a gradient its set would hold into
/// a staging chunk while a port's pool is nearly all held; without a free
/// staging chunk it refuses a packet that would start a chunk's set and
/// admits those that join a started set. When workers send a round in
/// different orders, the sets they start before meeting can need up to
/// chunks x (workers - 1) held contributions; beyond the staging chunks
/// (`staging_chunks`, summed over the node's shards) they are mbufs, and with
/// smaller pools the round can stall. The warning for that ("" when the
/// pools and the staging are large enough): `own_shards` are the global
/// shard ids the node runs, `pool_mbufs` the mbufs of its RX pools.
std::string pool_warning(const agg::Placement& placement, const std::vector<uint32_t>& own_shards,
                         uint32_t chunk_bytes, uint32_t workers, uint64_t pool_mbufs,
                         uint64_t staging_chunks);

/// The telemetry group "server": `aggregations` (the operator's word for
/// shard_updates), then every counter of ServerCounters::for_each as
/// prefix + name.
void telemetry_values(const ServerCounters& c, telemetry::Values& v);

}  // namespace mercury::server
