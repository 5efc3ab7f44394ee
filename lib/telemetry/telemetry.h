// Telemetry: the counters of every component, readable while Mercury runs.
//
// A Registry holds named groups of counters. Each group is a function that
// appends (name, value) pairs by reading counters that some lcore owns and
// bumps on the datapath; the datapath itself does nothing more than its own
// counter increments. The registry serves the groups three ways:
//   * rte_telemetry commands (expose()): /mercury/stats (every group, as a
//     dict of dicts) and /mercury/groups (their names), readable with
//     `dpdk-telemetry.py -f <file-prefix>`;
//   * a one-line summary for the operator's per-second stats line (line());
//   * a snapshot as plain values, for tests and reports (snapshot()).
//
// Threads: add() and expose() are control path (main thread, before the poll
// loops start). Readers (the telemetry thread, the stats printer) run
// concurrently with the owning lcores: counters are read with relaxed atomic
// loads of naturally aligned 64-bit words (read_counter()), and each owner
// only ever stores to its own counters, so a reader sees each value whole,
// possibly a few increments old. Groups must outlive the registry's exposure.
// Cost: nothing on the datapath; a read walks the groups (microseconds).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mercury::telemetry {

/// Reads a counter that another thread owns and writes with plain stores.
inline uint64_t read_counter(const uint64_t& c) {
  return std::atomic_ref<const uint64_t>(c).load(std::memory_order_relaxed);
}

using Values = std::vector<std::pair<std::string, uint64_t>>;
/// Appends a group's current values.
using GroupReader = std::function<void(Values&)>;

class Registry {
 public:
  Registry() = default;
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Adds a group (control path). Names are unique: a repeat throws
  /// std::invalid_argument. Group and value names must be usable as JSON
  /// keys: [A-Za-z0-9_] (rte_telemetry's rule for dict keys).
  void add(const std::string& group, GroupReader read);

  /// Registers the rte_telemetry commands for this registry. EAL must be up.
  /// One registry per process may be exposed; a second throws.
  void expose();

  /// Every group's values now.
  std::vector<std::pair<std::string, Values>> snapshot() const;
  /// The sum of value `name` over every group that has it.
  uint64_t total(const std::string& name) const;
  /// "group.name=value ..." for the values whose name is in `names`, groups
  /// in registration order: one line for a stats printer.
  std::string line(const std::vector<std::string>& names) const;

 private:
  struct Group {
    std::string name;
    GroupReader read;
  };
  mutable std::mutex mu_;  // control path and readers only; never on the datapath
  std::vector<Group> groups_;
  bool exposed_ = false;
};

}  // namespace mercury::telemetry
