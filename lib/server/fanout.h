// Who gets an update, and what its packet says, by training.sync: the
// fan-out rules of docs/server.md ("Modes"), as pure functions so that they
// are unit-tested with the chunk table and the workers' trackers, no ports
// (modes_test.cpp). Shard applies them to every update.
//
// Costs: a few integer operations; no allocation (SspAnswers::reset aside).
// fanout_recipients and fanout_tag: any thread; SspAnswers: its owner's.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/sync_policy.h"
#include "wire/header.h"

namespace mercury::server {

/// Which workers an update goes to.
enum class Fanout : uint8_t {
  kEvery,         ///< BSP: every worker, from the table's memory
  kContributor,   ///< ASP: the worker whose gradient it applied
  kSlowest,       ///< SSP: the contributor, once the slowest clock lets it go on
  kEveryVersion,  ///< PS+: every worker, every version
};

/// Whether `rule` can send `policy`'s updates: kEvery (from the table's
/// memory) needs every rank in each update (bsp), the asynchronous rules
/// the policies whose versions advance without every rank.
inline bool fanout_fits(Fanout rule, const agg::SyncPolicy& policy) {
  return (rule == Fanout::kEvery) != policy.tracks_rank_iterations();
}

/// The workers (bit r = rank r, of `workers` <= 64) that update `u` goes to
/// under `rule`: everyone (bsp, psplus, and version 0, rank 0's initial
/// values, in every mode), else the contributor; kSlowest's answers are
/// then held and released by SspAnswers.
inline uint64_t fanout_recipients(Fanout rule, const agg::Update& u, uint32_t workers) {
  const uint64_t all = workers >= 64 ? ~uint64_t{0} : (uint64_t{1} << workers) - 1;
  if (rule == Fanout::kEvery || rule == Fanout::kEveryVersion || u.version == 0) return all;
  return u.contributors & all;
}

/// SSP's answers (kSlowest), held while the worker could not use them.
///
/// A worker whose clock is c (its pushes of a chunk applied) waits, before
/// computing iteration c, for that chunk's answer to its push and for a
/// slowest clock of at least c - bound (training.staleness_bound), both heard
/// from the server. When its push is applied while the slowest clock is
/// below c - bound, the answer would arrive and then the update that moves
/// the slowest clock far enough would have to follow it: two copies of the
/// chunk per push on that worker's downlink. So such an answer is owed
/// instead, and sent with the update that brings the slowest clock to
/// c - bound: one copy, carrying the worker's own update, the slowest rank's
/// and the clock. Nobody else gets an update: a worker not held back has
/// what SSP promises it. (Sending every move of the slowest clock to every
/// rank instead doubles what the downlinks carry whenever the ranks push a
/// chunk about together, and behind a straggler keeps its peers at its pace:
/// AlexNet's trace at an emulated 10 Gbit/s with a 4x straggler ran at 2.1 s
/// an iteration on every rank that way, against BSP's 1.4 s.) As under asp, a
/// worker reads the state after every rank's push only by pushing once more:
/// Worker::pull with a min_version waits for a version it is sent.
/// A worker that pushes the chunk again before its owed answer went (it did
/// not pull) gets that answer at once, apart, so that it counts one answer
/// per push. Owner core only; reset() allocates, route() does not.
class SspAnswers {
 public:
  /// Who gets an update's packets, and which of them answer the recipient's
  /// own push (wire::kAggYours): `first` one packet each, before `to`'s.
  struct Route {
    uint64_t to = 0;
    uint64_t yours = 0;
    uint64_t first = 0;
  };

  void reset(uint64_t chunks, uint32_t workers) {
    workers_ = workers;
    owed_.assign(chunks * workers, 0);
    count_ = 0;
    gone_ = 0;
  }

  /// Update `u` of the shard's chunk number `chunk` under `bound`.
  Route route(const agg::Update& u, uint64_t chunk, uint32_t bound) {
    Route r{.to = fanout_recipients(Fanout::kSlowest, u, workers_), .yours = u.contributors};
    if (u.version == 0 || u.clocks == nullptr || u.contributors == 0) return r;
    uint8_t* owed = &owed_[chunk * workers_];
    const auto me = static_cast<uint32_t>(std::countr_zero(u.contributors));
    if ((gone_ >> me & 1) != 0) {  // a push that arrived before its rank left: no answer
      r.to &= ~u.contributors;
      r.yours &= ~u.contributors;
      return r;
    }
    if (owed[me] != 0) {  // pushed again before its answer went: that one now
      owed[me] = 0;
      --count_;
      r.first = u.contributors;
    }
    // Owed answers this update's slowest clock releases (c - bound <= slowest).
    if (count_ != 0 && u.clock == u.slowest) {
      for (uint32_t w = 0; w < workers_ && w < 64; ++w) {
        if (owed[w] == 0 || static_cast<int32_t>(u.clocks[w] - bound - u.slowest) > 0) continue;
        owed[w] = 0;
        --count_;
        r.to |= uint64_t{1} << w;
        r.yours |= uint64_t{1} << w;
      }
    }
    // The contributor's own answer, unless the slowest clock holds it back.
    if (static_cast<int32_t>(u.clock - bound - u.slowest) > 0) {
      owed[me] = 1;
      ++count_;
      r.to &= ~u.contributors;
      r.yours &= ~u.contributors;
    }
    return r;
  }

  /// Answers owed now (each sent later).
  [[nodiscard]] uint64_t owed() const { return count_; }

  /// Rank `rank` left the job (docs/membership.md): the answers owed to it
  /// are dropped (returned: how many) and it is owed none again.
  uint64_t forget(uint32_t rank) {
    if (rank >= workers_ || rank >= 64) return 0;
    gone_ |= uint64_t{1} << rank;
    uint64_t dropped = 0;
    for (uint64_t i = rank; i < owed_.size(); i += workers_) {
      dropped += owed_[i];
      owed_[i] = 0;
    }
    count_ -= dropped;
    return dropped;
  }

  /// A new process of rank `rank` joined the job: it is answered again.
  void admit(uint32_t rank) {
    if (rank < 64) gone_ &= ~(uint64_t{1} << rank);
  }

  /// The answers owed for chunk `chunk` that a slowest clock of `slowest`
  /// lets go (every rank's next clock in `clocks`): cleared and returned
  /// (bit w = rank w), each to be sent with the chunk's newest version.
  /// After a rank left, the slowest clock can move without an update.
  uint64_t release(uint64_t chunk, std::span<const uint32_t> clocks, uint32_t slowest,
                   uint32_t bound) {
    uint64_t out = 0;
    if (count_ == 0 || clocks.size() < workers_) return 0;
    uint8_t* owed = &owed_[chunk * workers_];
    for (uint32_t w = 0; w < workers_ && w < 64; ++w) {
      if (owed[w] == 0 || static_cast<int32_t>(clocks[w] - bound - slowest) > 0) continue;
      owed[w] = 0;
      --count_;
      out |= uint64_t{1} << w;
    }
    return out;
  }

 private:
  uint32_t workers_ = 0;
  uint64_t gone_ = 0;          // ranks that left the job: owed nothing
  std::vector<uint8_t> owed_;  // per (chunk, rank): 1 while its answer is held
  uint64_t count_ = 0;
};

/// Who gets update `u` of the shard's chunk number `chunk` under `rule`, and
/// which packets answer the recipient's own push: fanout_recipients, or under
/// kSlowest `ssp`'s route (staleness bound `bound`).
inline SspAnswers::Route fanout_route(Fanout rule, SspAnswers& ssp, const agg::Update& u,
                                      uint64_t chunk, uint32_t workers, uint32_t bound) {
  if (rule == Fanout::kSlowest) return ssp.route(u, chunk, bound);
  return {.to = fanout_recipients(rule, u, workers), .yours = u.contributors, .first = 0};
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
