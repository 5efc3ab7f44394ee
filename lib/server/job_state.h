// The server node's side of settings and the job's state (agg/control.h,
// docs/server.md "Settings and the job's state"): rank 0's kSettings,
// every worker's kStatePull and rank 0's kStateSeed, each turned into a
// task per shard (shard_task.h) that runs on the shard's own thread, and
// answered once every task of it is done.
//
//  * kSettings (rank 0 only): every shard of the node changes its
//    hyperparameters from the message's version (agg::HyperparameterTable:
//    under BSP from that version on, which the worker makes sure no chunk
//    has passed; in the asynchronous modes from each chunk's next update);
//    kSettingsDone answers, with the shards' refusals if any.
//  * kStatePull(cursor): a page of the node's state from the cursor (the
//    shard in its high 32 bits, the chunk in the low ones; 0 the start),
//    answered kStatePage with the records, the next cursor and whether it
//    is the last page. A page holds one shard's records.
//  * kStateSeed (rank 0, a job whose rank 0 declared it resumes): the
//    page's records go to their shards (the hyperparameter record to
//    every shard), which restore them at the job's start version and send
//    each chunk to every worker; after the last page every shard is
//    checked for chunks the checkpoint did not give values. A page that
//    fails, or chunks left without values, end the job (the refusal
//    poll_st returns, which the node hands to its control plane).
//
// Threads: the node's net core (the owner of every _st function); the
// tasks run on the shards' threads and are read back here once done.
// Costs: control path; a request allocates its tasks and keeps its page.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "server/control_plane.h"
#include "server/counters.h"
#include "server/shard_task.h"

namespace mercury::server {

class JobState {
 public:
  /// Runs `task` on the shard in slot `slot` of the node (inline at once,
  /// or queued to its core); the task stays alive until it is done.
  using Submit = std::function<void(uint32_t slot, ShardTask& task)>;

  explicit JobState(Submit submit) : submit_(std::move(submit)) {}

  /// The kinds this class answers.
  [[nodiscard]] static bool handles(agg::ControlKind kind);

  /// The job runs: its placement (which outlives this), the slot of each
  /// global shard id on this node (-1: another node's), the node's shard
  /// count, the version the job starts at and whether rank 0 resumes it.
  void start_st(const agg::Placement& placement, std::vector<int32_t> slot_of_shard,
                uint32_t shards, uint32_t version, bool seeded);

  /// This server resumes from its own checkpoint (ps-server --resume):
  /// `file`'s records go to their shards as rank 0's kStateSeed pages do,
  /// as one last page with no answer; a failure ends the job as a failed
  /// seed does. After start_st with `seeded`.
  void resume_st(std::span<const std::byte> file);

  /// A running server rolls back to `version` (docs/durability.md,
  /// "Several servers"): `file`'s records (its checkpoint of that version)
  /// go to their shards as kRollBack tasks, which drop what the shard
  /// holds and restore every chunk at `version`, sending it to every
  /// worker; nobody is answered, and a failure ends the job as a failed
  /// resume does. Settings and state requests after it use `version`.
  void roll_back_st(std::span<const std::byte> file, uint32_t version);

  /// A message of a kind handles() takes, from worker `rank`. Its answer
  /// comes from poll_st() (at once for a request refused before any task).
  void on_message_st(uint16_t rank, agg::ControlMessage&& m);

  /// The requests every task of which is done: their answers appended to
  /// `replies`. A resume that failed sets `refusal` (the job cannot go
  /// on). Returns how many requests were answered.
  uint32_t poll_st(std::vector<ControlReply>& replies, std::string& refusal);
  [[nodiscard]] bool pending_st() const { return !requests_.empty(); }

  /// Counted here: settings, state_pages, seed_pages, state_refused.
  [[nodiscard]] const ControlCounters& counters() const { return counters_; }

 private:
  // The rank of resume_st's request, which nobody is answered.
  static constexpr uint16_t kThisServer = UINT16_MAX;
  struct Request {
    uint16_t rank = 0;
    agg::ControlKind kind = agg::ControlKind::kSettings;
    uint64_t sequence = 0;
    uint32_t slot = 0;      // kStatePull: the shard whose page it is
    bool last = false;      // kStateSeed: the last page
    bool checked = false;   // kStateSeed, last: the shards were asked for chunks without values
    bool rollback = false;  // roll_back_st's
    std::string error;      // refused before any task
    std::vector<std::byte> page;  // kStateSeed: the records the tasks read
    std::vector<std::unique_ptr<ShardTask>> tasks;
    std::vector<uint32_t> slots;  // each task's shard slot
  };
  ShardTask& add_task(Request& r, uint32_t slot, ShardTask::Kind kind);
  void submit_st(Request& r);
  void seed_st(Request& r, ShardTask::Kind kind = ShardTask::Kind::kRestore);
  // Whether r is done; the answer into `replies`, a failed resume into `refusal`.
  bool finish_st(Request& r, std::vector<ControlReply>& replies, std::string& refusal);

  Submit submit_;
  const agg::Placement* placement_ = nullptr;  // set by start_st
  std::vector<int32_t> slot_of_shard_;
  std::vector<uint32_t> shard_of_slot_;  // the global ids, for messages
  uint32_t shards_ = 0;
  uint32_t version_ = 0;
  bool seeded_ = false;
  bool resumed_ = false;  // the last seed page was applied and checked
  std::vector<std::unique_ptr<Request>> requests_;
  ControlCounters counters_;
};

}  // namespace mercury::server
