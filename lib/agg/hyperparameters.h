// Versioned hyperparameters: the learning rate, momentum, weight decay and
// Adam's betas and epsilon that a trainer changes between steps, and the
// optimizer of one shard that applies them.
//
// What it is for. A schedule (warm-up, cosine, step decay) changes the
// learning rate every step, and a trainer may change the others too. Under
// BSP a run must stay bit-exact against one process, so every shard must
// apply a change from the same version on: a change is recorded with the
// version it takes effect from, and the update of a chunk at version v (the
// one that makes version v + 1 from gradients computed at v) uses the newest
// change from at or before v (SettingsMode::kFromVersion). Under ASP, SSP
// and PS+ a shard's chunks are not at one version, so a change applies from
// each chunk's next update (SettingsMode::kNextUpdate).
//
// Bounds. The table holds at most kCapacity changes. A change that no chunk
// can still need (a newer one is in effect at the lowest version the
// shard's chunks are at) is dropped when the next change is recorded, so
// the table fills only with changes scheduled ahead of the chunks; past
// kCapacity of those a change is refused (Change::kFull). A change for a
// version some chunk has already updated from is refused (Change::kTooLate):
// that chunk used the settings before it, so applying it to the others
// would make the shards disagree.
//
// Threads and costs. Both classes belong to the thread that owns the shard
// (the chunk table's); nothing is locked. change() is control path; at()
// and ShardOptimizer::step_for() are datapath: no allocation, throw, lock or
// log. A lookup for the version of the previous one is a compare; otherwise
// it scans at most kCapacity entries. The update's scalars (step_params())
// are recomputed only when the entry, the contribution count, the step or
// the scale differ from the previous update's: in BSP about once per
// iteration, not per chunk.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "agg/optimizer.h"

namespace mercury::agg {

enum class SettingsMode : uint8_t {
  kFromVersion,  ///< BSP: a change takes effect from the version it names
  kNextUpdate,   ///< asynchronous modes: from each chunk's next update
};

/// What HyperparameterTable::change() did.
enum class Change : uint8_t {
  kAdded,     ///< recorded; it applies from its version on
  kReplaced,  ///< a change from the same version (kNextUpdate: the settings in effect) replaced
  kInvalid,   ///< refused: hyperparameters_refused() names the value
  kTooLate,   ///< refused: a chunk has already updated from that version
  kFull,      ///< refused: kCapacity changes are still needed
};
std::string_view change_name(Change change);
constexpr bool accepted(Change c) { return c <= Change::kReplaced; }

/// The settings of one shard's optimizer over versions.
class HyperparameterTable {
 public:
  static constexpr uint32_t kCapacity = 8;
  struct Entry {
    uint32_t from = 0;  ///< the first version whose update uses `values`
    Hyperparameters values;
    friend bool operator==(const Entry&, const Entry&) = default;
  };

  /// `initial` applies from version 0. Throws std::invalid_argument with
  /// hyperparameters_refused()'s text if it cannot drive the optimizer.
  HyperparameterTable(OptimizerKind kind, bool decoupled_weight_decay,
                      const Hyperparameters& initial, SettingsMode mode);

  /// Records `values` from version `from` (kNextUpdate: from each chunk's
  /// next update; `from` is kept but not compared). `lowest` and `highest`
  /// are the least and the greatest version of the caller's chunks now: a
  /// chunk at version w has applied the updates from every version below w,
  /// so `from` < `highest` is too late, and an entry superseded at `lowest`
  /// is no longer needed. Versions compare serially (32-bit wrap safe).
  Change change(uint32_t from, const Hyperparameters& values, uint32_t lowest, uint32_t highest);

  /// Replaces every entry (a checkpoint's): sorted by `from`, at least one,
  /// at most kCapacity, each valid. Throws std::invalid_argument naming the
  /// entry that is not.
  void restore(std::span<const Entry> entries);

  /// The index of the entry the update of a chunk at `version` uses.
  [[nodiscard]] uint32_t index_at(uint32_t version) const;
  [[nodiscard]] const Hyperparameters& at(uint32_t version) const {
    return entries_[index_at(version)].values;
  }
  [[nodiscard]] std::span<const Entry> entries() const { return {entries_.data(), size_}; }
  /// Counts the accepted changes and restores: what a cached lookup compares.
  [[nodiscard]] uint64_t generation() const { return generation_; }
  [[nodiscard]] SettingsMode mode() const { return mode_; }
  [[nodiscard]] OptimizerKind kind() const { return kind_; }
  [[nodiscard]] bool decoupled_weight_decay() const { return decoupled_; }

 private:
  // Drops the entries that are superseded at `lowest`.
  void retire(uint32_t lowest);

  std::array<Entry, kCapacity> entries_{};
  uint32_t size_ = 1;
  uint64_t generation_ = 0;
  OptimizerKind kind_;
  bool decoupled_;
  SettingsMode mode_;
};

/// What one shard's chunk table applies: the optimizer's kind, its versioned
/// hyperparameters and the scalars of the last update.
class ShardOptimizer {
 public:
  /// Throws std::invalid_argument if the configuration's hyperparameters
  /// cannot drive its optimizer (hyperparameters_refused()).
  ShardOptimizer(const OptimizerConfig& config, SettingsMode mode);

  [[nodiscard]] OptimizerKind kind() const { return table_.kind(); }
  [[nodiscard]] bool decoupled_weight_decay() const { return table_.decoupled_weight_decay(); }
  /// The settings: change() and restore() them on the control path (a
  /// change is seen by the next step_for()).
  [[nodiscard]] HyperparameterTable& hyperparameters() { return table_; }
  [[nodiscard]] const HyperparameterTable& hyperparameters() const { return table_; }

  /// The scalars of the update of a chunk at `version` with `contributions`
  /// contributions, its `step`-th (1-based, Adam's t) and the policy's
  /// `lr_scale`: step_params() of the settings in effect at `version`.
  /// Valid until the next call. Datapath.
  const StepParams& step_for(uint32_t version, uint32_t contributions, uint64_t step,
                             float lr_scale);

 private:
  HyperparameterTable table_;
  StepParams step_{};
  bool cached_ = false;
  uint64_t generation_ = 0;
  uint32_t version_ = 0;
  uint32_t index_ = 0;
  uint32_t n_ = 0;
  uint64_t t_ = 0;
  float scale_ = 0;
};

}  // namespace mercury::agg
