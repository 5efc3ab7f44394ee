// Control-path work a shard does on its own thread: a change of its
// settings, a page of its state for a checkpoint, records to resume from
// (docs/server.md, "Settings and the job's state"), a rank that left or
// joined the job (docs/membership.md), a running server's rollback to its
// checkpoint (docs/durability.md, "Several servers").
//
// The net core builds a task (JobState), runs it at once on a shard that
// runs inline, or queues it to the shard's core through the same ring as
// the packets (ShardItem::kTask), so that it runs between two bursts on the
// thread that owns the table, in order with the packets before it. It
// reads the results once `done` is set.
//
// Threads: the fields before the results are written by the net core
// before the task is queued (the ring's release orders them); the results
// belong to the shard's thread until it sets `done` (release), and to the
// net core once it has seen it (acquire). Costs: control path (a task
// allocates and may scan the table: ChunkTable::version_range, pages).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "agg/optimizer.h"
#include "agg/shard_state.h"

namespace mercury::transport {
class Endpoint;
}

namespace mercury::server {

struct ShardTask {
  enum class Kind : uint8_t {
    kSettings,  ///< the hyperparameters `values` from version `version` on
    kExport,    ///< a page of the shard's records from chunk `first` on
    kRestore,   ///< `records` restored, every chunk at version `version`
    kCheck,     ///< how many chunks have no values yet (into `next`)
    kRemove,    ///< rank `first` left the job (docs/membership.md): Shard::remove_rank_st
    kJoin,      ///< rank `first` joined it: Shard::join_rank_st
    // BSP, training.on_worker_loss wait (docs/membership.md):
    kSuspend,  ///< rank `first` is lost and waited for: Shard::suspend_rank_st
    kLeast,    ///< the least version of the shard's chunks (into `next`)
    kRejoin,   ///< rank `first`'s new process, at version `version`: Shard::rejoin_rank_st
    // A running server rolls back (docs/durability.md, "Several servers"):
    kRewind,    ///< what the shard holds and owes dropped: Shard::rewind_st(version)
    kRollBack,  ///< kRewind, then `records` restored at version `version`
  };
  Kind kind = Kind::kSettings;
  uint64_t job = 0;  ///< the placement fingerprint (the records')
  /// kSettings: the first version to use them; kRestore: the job's; kRewind,
  /// kRollBack: the version rolled back to
  uint32_t version = 0;
  agg::Hyperparameters values;
  uint64_t first = 0;
  std::vector<agg::RecordRef> records;  ///< into bytes the net core keeps until `done`
  /// kJoin: where the rank is reached now (its own node, or the spare that
  /// took it over: docs/membership.md, "Spare workers").
  transport::Endpoint* endpoint = nullptr;
  uint16_t peer = 0;

  // Results.
  std::string error;             ///< "" when it went well
  std::vector<std::byte> bytes;  ///< kExport: the page
  uint64_t next = 0;  ///< kExport: the next chunk; kCheck: chunks without values; kLeast: it
  bool end = false;   ///< kExport: the shard has no chunk past the page

  /// The shard's thread: the results are written.
  void finish(std::string why) {
    error = std::move(why);
    done.store(true, std::memory_order_release);  // pairs with finished()'s acquire
  }
  [[nodiscard]] bool finished() const { return done.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> done{false};
};

}  // namespace mercury::server
