// Shard::run_task_st (shard.h): settings, checkpoints, membership and a
// rollback on the shard's thread.
#include "agg/shard_state.h"
#include "server/shard.h"

namespace mercury::server {

void Shard::run_task_st(ShardTask& task) {
  MERCURY_OWNED(owner_);
  agg::ChunkTable& table = *table_;
  std::string error;
  switch (task.kind) {
    case ShardTask::Kind::kSettings: {
      // Every chunk at or past `lowest` has left the older entries behind;
      // a chunk at `highest` already used the settings for the versions below.
      const auto [lowest, highest] = table.version_range();
      agg::HyperparameterTable& settings = table.optimizer().hyperparameters();
      const agg::Change c = settings.change(task.version, task.values, lowest, highest);
      if (agg::accepted(c)) break;
      error = "settings from version " + std::to_string(task.version) + " " +
              std::string(agg::change_name(c));
      if (c == agg::Change::kInvalid) {
        error += ": " + agg::hyperparameters_refused(
                            settings.kind(), settings.decoupled_weight_decay(), task.values);
      } else if (c == agg::Change::kTooLate) {
        error += ": a chunk is at version " + std::to_string(highest);
      }
      break;
    }
    case ShardTask::Kind::kExport:
      task.next = agg::export_page(table, task.job, task.first, agg::kStatePageBytes, task.bytes);
      task.end = task.next >= table.chunks();
      break;
    case ShardTask::Kind::kRestore:
      error = agg::restore_records(table, task.job, task.version, task.records);
      break;
    case ShardTask::Kind::kCheck:
      task.next = agg::chunks_without_values(table);
      break;
    case ShardTask::Kind::kRemove:
      remove_rank_st(static_cast<uint16_t>(task.first));
      break;
    case ShardTask::Kind::kJoin:
      join_rank_st(static_cast<uint16_t>(task.first), FanOut{task.endpoint, task.peer});
      break;
    case ShardTask::Kind::kSuspend:
      suspend_rank_st(static_cast<uint16_t>(task.first));
      break;
    case ShardTask::Kind::kLeast:
      task.next = table.version_range().first;
      break;
    case ShardTask::Kind::kRejoin:
      rejoin_rank_st(static_cast<uint16_t>(task.first), task.version);
      break;
    case ShardTask::Kind::kRewind:
      rewind_st(task.version);
      break;
    case ShardTask::Kind::kRollBack:
      rewind_st(task.version);
      error = agg::restore_records(table, task.job, task.version, task.records);
      if (error.empty() && agg::chunks_without_values(table) != 0) {
        error = "the checkpoint gives no values to " +
                std::to_string(agg::chunks_without_values(table)) + " chunks";
      }
      break;
  }
  task.finish(std::move(error));
}

}  // namespace mercury::server
