#include "agg/hyperparameters.h"

#include <stdexcept>
#include <string>

#include "base/serial.h"

namespace mercury::agg {

using base::serial_diff;

std::string_view change_name(Change change) {
  switch (change) {
    case Change::kAdded:
      return "added";
    case Change::kReplaced:
      return "replaced";
    case Change::kInvalid:
      return "invalid";
    case Change::kTooLate:
      return "too_late";
    case Change::kFull:
      return "full";
  }
  return "?";
}

HyperparameterTable::HyperparameterTable(OptimizerKind kind, bool decoupled,
                                         const Hyperparameters& initial, SettingsMode mode)
    : kind_(kind), decoupled_(decoupled), mode_(mode) {
  const std::string why = hyperparameters_refused(kind, decoupled, initial);
  if (!why.empty()) throw std::invalid_argument("optimizer " + why);
  entries_[0] = Entry{.from = 0, .values = initial};
}

void HyperparameterTable::retire(uint32_t lowest) {
  uint32_t drop = 0;  // entries before the one in effect at `lowest`
  while (drop + 1 < size_ && serial_diff(entries_[drop + 1].from, lowest) <= 0) ++drop;
  if (drop == 0) return;
  for (uint32_t i = drop; i < size_; ++i) entries_[i - drop] = entries_[i];
  size_ -= drop;
}

Change HyperparameterTable::change(uint32_t from, const Hyperparameters& values, uint32_t lowest,
                                   uint32_t highest) {
  if (!hyperparameters_refused(kind_, decoupled_, values).empty()) return Change::kInvalid;
  if (mode_ == SettingsMode::kNextUpdate) {
    entries_[0] = Entry{.from = from, .values = values};
    ++generation_;
    return Change::kReplaced;
  }
  if (serial_diff(from, highest) < 0) return Change::kTooLate;
  retire(lowest);
  uint32_t at = size_;  // the first entry from a later version
  while (at > 0 && serial_diff(entries_[at - 1].from, from) > 0) --at;
  if (at > 0 && entries_[at - 1].from == from) {
    entries_[at - 1].values = values;
    ++generation_;
    return Change::kReplaced;
  }
  if (size_ == kCapacity) return Change::kFull;
  for (uint32_t i = size_; i > at; --i) entries_[i] = entries_[i - 1];
  entries_[at] = Entry{.from = from, .values = values};
  ++size_;
  ++generation_;
  return Change::kAdded;
}

void HyperparameterTable::restore(std::span<const Entry> entries) {
  if (entries.empty() || entries.size() > kCapacity) {
    throw std::invalid_argument("hyperparameter table: " + std::to_string(entries.size()) +
                                " entries, not 1.." + std::to_string(kCapacity));
  }
  if (mode_ == SettingsMode::kNextUpdate && entries.size() != 1) {
    throw std::invalid_argument(
        "hyperparameter table: the asynchronous modes keep one entry, not " +
        std::to_string(entries.size()));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string why = hyperparameters_refused(kind_, decoupled_, entries[i].values);
    if (!why.empty()) {
      throw std::invalid_argument("hyperparameter table: entry " + std::to_string(i) + ": " + why);
    }
    if (i > 0 && serial_diff(entries[i].from, entries[i - 1].from) <= 0) {
      throw std::invalid_argument("hyperparameter table: entry " + std::to_string(i) +
                                  " (from version " + std::to_string(entries[i].from) +
                                  ") does not come after the one before");
    }
  }
  for (size_t i = 0; i < entries.size(); ++i) entries_[i] = entries[i];
  size_ = static_cast<uint32_t>(entries.size());
  ++generation_;
}

uint32_t HyperparameterTable::index_at(uint32_t version) const {
  if (mode_ == SettingsMode::kNextUpdate) return 0;
  uint32_t i = size_ - 1;
  // A version before every entry cannot come from a chunk once retire() has
  // run with the chunks' lowest version; the oldest entry is the answer.
  while (i > 0 && serial_diff(entries_[i].from, version) > 0) --i;
  return i;
}

ShardOptimizer::ShardOptimizer(const OptimizerConfig& config, SettingsMode mode)
    : table_(config.kind, config.decoupled_weight_decay, hyperparameters_of(config), mode) {}

const StepParams& ShardOptimizer::step_for(uint32_t version, uint32_t contributions, uint64_t step,
                                           float lr_scale) {
  const uint64_t generation = table_.generation();
  const bool same_table = cached_ && generation == generation_;
  const uint32_t index = same_table && version == version_ ? index_ : table_.index_at(version);
  if (table_.kind() != OptimizerKind::kAdam) step = 0;  // only Adam's scalars depend on it
  if (!same_table || index != index_ || contributions != n_ || step != t_ || lr_scale != scale_) {
    step_ = step_params(table_.kind(), table_.decoupled_weight_decay(),
                        table_.entries()[index].values, contributions, step, lr_scale);
    n_ = contributions;
    t_ = step;
    scale_ = lr_scale;
  }
  cached_ = true;
  generation_ = generation;
  version_ = version;
  index_ = index;
  return step_;
}

}  // namespace mercury::agg
