// The server node's states, drop reasons and the counters of its parts
// (shards, control plane), each counter declared once as a list
// (base/counter_list.h), so that summing, the stats line, telemetry and
// the tests walk the same fields and none can be forgotten. ServerCounters,
// which gathers them with the endpoints' and the ports', is in
// server_node.h.
//
// Pure C++ (no DPDK). Threads: plain structs; whoever owns one writes it.
// for_each() is for readers on the control path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/counter_list.h"

namespace mercury::server {

enum class NodeState : uint8_t {
  kWaiting,   ///< waiting for every rank's declare
  kRunning,   ///< placement built, shards serving
  kRefused,   ///< the job cannot start or cannot go on: the refusal says why
  kStopped,   ///< stopped with shard cores: nothing is served any more
  kFinished,  ///< every rank left (kLeave) after its last round: the job is done
};
std::string_view node_state_name(NodeState s);

/// Why the node itself dropped a packet or a control message.
enum class ServerDrop : uint8_t {
  kNotRunning,      ///< a gradient or init packet while waiting or refused
  kNotOurs,         ///< a key of no block, or of a shard this node does not run
  kInitNotRank0,    ///< a kInit packet from a rank other than 0
  kBadType,         ///< a packet type a server does not take (kAggData, ...)
  kShardRingFull,   ///< a shard core's ring was full (cannot happen when sized; the chunk is lost)
  kControlTooBig,   ///< a control message over max_control_bytes
  kBadControl,      ///< a control message that does not decode, or of a kind servers do not take
  kWrongRank,       ///< a declare/barrier whose rank is not the sender's (answered kRefused)
  kBarrierNotHere,  ///< a barrier sent to a server other than server 0
  kReplyNotQueued,  ///< the endpoint did not queue a control answer
  kAfterLeave,      ///< a gradient from any rank after a rank left (BSP: the job ends)
  kInitResumed,     ///< a kInit packet in a job that resumes from rank 0's checkpoint
  kFromPartner,     ///< from the other node of a standby pair: not a replica a standby takes
  kNotPromoted,     ///< a gradient or init packet at a standby not promoted (its server serves)
  kNotServing,      ///< a gradient or request at a standby whose promotion a worker refused
  kRemovedRank,     ///< a gradient from a rank removed from a BSP job that shrank
  kRollingBack,     ///< a gradient while the node rolls back to a checkpoint: never applied
  kNoRank,          ///< from a spare that holds no rank, or a node whose rank a spare took over
  kCount,
};
inline constexpr size_t kServerDropCount = static_cast<size_t>(ServerDrop::kCount);
std::string_view server_drop_name(ServerDrop d);

// Every shard counter, once.
#define MERCURY_SHARD_COUNTERS(X)                                                                  \
  X(contributions, "gradient packets the table took")                                              \
  X(refused, "gradient packets the table refused (by reason in the table's outcomes)")             \
  X(initialized, "init packets (rank 0's initial parameters) adopted")                             \
  X(init_refused, "init packets refused (duplicate, stale, bad geometry)")                         \
  X(updates, "chunk updates fanned out (version 0 of an init included)")                           \
  X(updates_held, "store-and-forward: chunk updates held until the rest of their unit is in")      \
  X(fanout_refused, "slices the endpoint did not queue at once: kept for a retry")                 \
  X(fanout_retried, "deferred slices queued later by retry_fanout_st()")                           \
  X(fanout_lost, "slices not kept, the backlog was full (or the chunk moved on): must be 0")       \
  X(snapshots_full, "async updates deferred: every snapshot of the shard was still on the wire")   \
  X(fanout_merged, "async copies not deferred: one to that worker for that chunk already waits")   \
  X(eager_sent, "newest versions sent eagerly (psplus's; a joining rank's first pull)")            \
  X(staleness_sum, "async: versions between a gradient's base and the update that applied it")     \
  X(stale_updates, "async: updates applied to a newer version than their gradient came from")      \
  X(removed_dropped, "copies owed to a rank that left the job, dropped")                           \
  X(join_owed, "chunks owed to a rank that joined the job (its first pull)")                       \
  /* A hot standby (server/replica.h). */                                                          \
  X(replica_bytes, "primary: bytes of chunk state queued to the standby")                          \
  X(replicated_versions, "chunk versions the standby acknowledged (primary) or adopted (standby)") \
  X(replica_refused, "primary: replica slices the endpoint did not queue at once: retried")        \
  X(replica_unsent, "primary: updates sent unreplicated, the standby being lost")                  \
  X(replica_dropped, "standby: replica packets dropped (stale, malformed, after promotion)")       \
  X(answered_again, "pushes of a version already answered, answered again (standby, wait)")        \
  X(rewound, "slices owed of versions a rollback took back, dropped (docs/durability.md)")

struct ShardCounters {
  MERCURY_SHARD_COUNTERS(MERCURY_COUNTER_DECLARE)

  template <class F>
  void for_each(F&& f) const {MERCURY_SHARD_COUNTERS(MERCURY_COUNTER_VISIT)} ShardCounters&
  operator+=(const ShardCounters& o) {
    MERCURY_SHARD_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

// Every control-plane counter, once.
#define MERCURY_CONTROL_COUNTERS(X)                                                     \
  X(declares, "declares received (all)")                                                \
  X(declares_repeated, "declares from a rank that had declared already")                \
  X(declares_refused, "declares answered kRefused")                                     \
  X(barriers, "barrier arrivals received (all)")                                        \
  X(barriers_repeated, "barrier arrivals for a generation the rank had reached")        \
  X(barriers_completed, "generations every rank reached")                               \
  X(replies, "answers the control plane produced (each queued, or a reply_not_queued)") \
  X(workers_lost, "ranks the transport declared dead while running")                    \
  X(workers_restarted, "jobs ended by a rank that restarted while running")             \
  X(workers_removed, "ranks removed from the job (lost, restarted; async, bsp shrink)") \
  X(workers_joined, "async: new processes of removed ranks that joined the job")        \
  X(spares_joined, "spare workers that took a removed rank over (in workers_joined)")   \
  X(spares_released, "spare workers the job's end released, never needed")              \
  X(leaves, "kLeave messages taken (a worker stopping)")                                \
  X(pushes_after_leave, "jobs ended by a push that needed a rank which had left")       \
  /* Settings and the job's state (server/job_state.h). */                              \
  X(settings, "kSettings taken (rank 0's hyperparameters)")                             \
  X(state_pages, "kStatePull taken (pages of the state asked for)")                     \
  X(seed_pages, "kStateSeed taken (pages of a checkpoint to resume from)")              \
  X(state_refused, "settings and state requests refused before any shard ran them")     \
  /* A hot standby (docs/durability.md). */                                             \
  X(promotions, "standby: promoted (its server named lost)")                            \
  X(promotions_refused, "standby: workers that refused its promotion (server alive)")   \
  X(standbys_lost, "primary: its standby named lost (updates go out unreplicated)")     \
  /* Several servers, one resumed (docs/durability.md). */                              \
  X(rollbacks, "rollbacks to this server's checkpoint (another server resumed)")

struct ControlCounters {
  MERCURY_CONTROL_COUNTERS(MERCURY_COUNTER_DECLARE)

  template <class F>
  void for_each(F&& f) const {MERCURY_CONTROL_COUNTERS(MERCURY_COUNTER_VISIT)} ControlCounters&
  operator+=(const ControlCounters& o) {
    MERCURY_CONTROL_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

}  // namespace mercury::server
