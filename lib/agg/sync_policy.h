// Sync policies: when a chunk's contributions may be combined into an update,
// which contributions are admitted, and how a stale gradient's step is scaled.
//
// What it is for. The chunk table (chunk_table.h) does the bookkeeping that
// every mode shares (exactly-once bitmaps, holding, rank-order reduction,
// the optimizer); a SyncPolicy answers the three questions that differ
// between BSP, ASP, SSP and PS+. A new mode is a new subclass; the table
// does not change.
//
// Versions and iterations. Every chunk has a version: the number of updates
// applied to it (0 = initial parameters). A contribution carries an
// `iteration`: the version of the parameters the gradient was computed from.
// In BSP all chunks move in lock step, so it is simply the iteration number.
// staleness = version - iteration (>= 0 for an admitted contribution). All
// comparisons are serial (32-bit wrap safe).
//
// BSP decision (a contribution for iteration i+1 while i is not done): it is
// REFUSED (Outcome::kFuture), not held. A worker cannot legitimately send
// one: its gradient for i+1 is computed from this very chunk's update i,
// which the server has not produced yet. So it only comes from a confused or
// replayed peer, and refusing keeps the memory bound at one set per chunk.
//
// Threads and costs. Policies are immutable after construction; the table
// calls them from its own lcore, once or twice per contribution (a virtual
// call, a compare). They never allocate, throw, lock or log.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

namespace mercury::agg {

enum class Admission : uint8_t {
  kAccept,
  kStale,   ///< too old for this policy (BSP: an earlier iteration; SSP: beyond the bound)
  kFuture,  ///< computed from parameters this chunk has not reached yet
};

class SyncPolicy {
 public:
  virtual ~SyncPolicy() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  /// Contributions that complete a set and trigger an update, for N workers
  /// (1..N). BSP: N. ASP/SSP/PS+: 1.
  [[nodiscard]] virtual uint32_t quorum(uint32_t workers) const = 0;
  /// May a gradient computed from version `iteration` join a chunk now at
  /// `version`? (The duplicate check is the table's, before this.)
  [[nodiscard]] virtual Admission admit(uint32_t version, uint32_t iteration) const = 0;
  /// Learning-rate multiplier for an update whose oldest contribution is
  /// `staleness` versions behind. BSP, ASP, SSP: 1; PS+: its StalenessLr rule.
  [[nodiscard]] virtual float lr_scale(uint32_t staleness) const = 0;
  /// True when versions advance without every rank contributing (quorum < N):
  /// then the per-chunk bitmap cannot tell a replay of an older push, and
  /// the table keeps, per chunk and rank, the next clock it accepts
  /// (Contribution::clock; 4 bytes x N per chunk), which also gives each
  /// update the chunk's slowest clock (Update::slowest).
  [[nodiscard]] virtual bool tracks_rank_iterations() const = 0;
};

/// Bulk synchronous: every rank's gradient for iteration i == version, then
/// one update; anything older is stale, anything newer refused as future.
class BspPolicy final : public SyncPolicy {
 public:
  [[nodiscard]] std::string_view name() const override { return "bsp"; }
  [[nodiscard]] uint32_t quorum(uint32_t workers) const override { return workers; }
  [[nodiscard]] Admission admit(uint32_t version, uint32_t iteration) const override {
    return admit_bsp(version, iteration);
  }
  /// The same rule without a virtual call, for the chunk table's hot path.
  static Admission admit_bsp(uint32_t version, uint32_t iteration) {
    const auto d = static_cast<int32_t>(iteration - version);
    return d == 0 ? Admission::kAccept : d < 0 ? Admission::kStale : Admission::kFuture;
  }
  [[nodiscard]] float lr_scale(uint32_t) const override { return 1.0f; }
  [[nodiscard]] bool tracks_rank_iterations() const override { return false; }
};

/// How PS+ modulates the learning rate of an update `s` versions stale.
enum class StalenessLr : uint8_t {
  kNone,         ///< lr
  kInverse,      ///< lr / (1 + s), as in staleness-aware async SGD
  kInverseSqrt,  ///< lr / sqrt(1 + s)
};

/// Asynchronous family: each admitted contribution is applied on its own at
/// once (quorum 1, the gradient unaveraged). With max_staleness = UINT32_MAX
/// it is ASP (and the server side of SSP, whose bound the workers keep: they
/// wait rather than push too far ahead); a finite bound refuses a gradient
/// more than that many versions behind as stale; with a StalenessLr rule it
/// is PS+'s modulation.
class AsyncPolicy final : public SyncPolicy {
 public:
  struct Options {
    uint32_t max_staleness = UINT32_MAX;
    StalenessLr lr = StalenessLr::kNone;
  };
  AsyncPolicy() = default;
  explicit AsyncPolicy(Options options) : options_(options) {}
  [[nodiscard]] std::string_view name() const override;
  [[nodiscard]] uint32_t quorum(uint32_t) const override { return 1; }
  [[nodiscard]] Admission admit(uint32_t version, uint32_t iteration) const override;
  [[nodiscard]] float lr_scale(uint32_t staleness) const override;
  [[nodiscard]] bool tracks_rank_iterations() const override { return true; }

 private:
  Options options_;
};

std::unique_ptr<SyncPolicy> make_bsp();
std::unique_ptr<SyncPolicy> make_asp();
std::unique_ptr<SyncPolicy> make_ssp(uint32_t max_staleness);
std::unique_ptr<SyncPolicy> make_staleness_scaled(uint32_t max_staleness = UINT32_MAX,
                                                  StalenessLr lr = StalenessLr::kInverse);

}  // namespace mercury::agg
