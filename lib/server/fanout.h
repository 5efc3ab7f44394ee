// Who gets an update, and what its packet says, by training.sync: the
// fan-out rules of docs/server.md ("Modes"), as pure functions so that they
// are unit-tested with the chunk table and the workers' trackers, no ports
// (modes_test.cpp). Shard applies them to every update.
//
// Costs: a few integer operations; no allocation, any thread.
#pragma once

#include <bit>
#include <cstdint>

#include "agg/chunk_table.h"
#include "agg/sync_policy.h"
#include "wire/header.h"

namespace mercury::server {

/// Which workers an update goes to.
enum class Fanout : uint8_t {
  kEvery,         ///< BSP: every worker, from the table's memory
  kContributor,   ///< ASP: the worker whose gradient it applied
  kSlowest,       ///< SSP: the contributor; everyone when the slowest clock moved
  kEveryVersion,  ///< PS+: every worker, every version
};

/// Whether `rule` can send `policy`'s updates: kEvery (from the table's
/// memory) needs every rank in each update (bsp), the asynchronous rules
/// the policies whose versions advance without every rank.
inline bool fanout_fits(Fanout rule, const agg::SyncPolicy& policy) {
  return (rule == Fanout::kEvery) != policy.tracks_rank_iterations();
}

/// The workers (bit r = rank r, of `workers` <= 64) that update `u` goes to
/// under `rule`. kSlowest: the slowest clock moved when the contributor's
/// clock after the update (u.clock) equals u.slowest (the contributor was
/// the one behind everyone, the least is never above any rank's clock).
/// Version 0 (rank 0's initial values, no contributor) goes to everyone in
/// every mode.
inline uint64_t fanout_recipients(Fanout rule, const agg::Update& u, uint32_t workers) {
  const uint64_t all = workers >= 64 ? ~uint64_t{0} : (uint64_t{1} << workers) - 1;
  if (rule == Fanout::kEvery || rule == Fanout::kEveryVersion || u.version == 0) return all;
  if (rule == Fanout::kSlowest && u.clock == u.slowest) return all;
  return u.contributors & all;
}

/// A packet's wire `iteration` in the asynchronous modes: wire::kAggYours
/// when it answers the recipient's own push, and the chunk's slowest clock.
inline uint32_t fanout_tag(uint32_t slowest, bool yours) {
  return (slowest & wire::kAggSlowestMask) | (yours ? wire::kAggYours : 0);
}
/// The tag of update `u` for `rank`.
inline uint32_t fanout_tag(const agg::Update& u, uint16_t rank) {
  return fanout_tag(u.slowest, ((u.contributors >> rank) & 1) != 0);
}

}  // namespace mercury::server
