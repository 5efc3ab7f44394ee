// ServerNode (server_node.h): a running server rolls back when another
// server of the job was lost and resumed from its checkpoint
// (docs/durability.md, "Several servers").
//
// Every rank, once the resumed server's kReady said the version V the job
// resumes at, asks every other server to roll back to V (kRollback). The
// first ask loads this server's own checkpoint of V and checks it (none, or
// one that does not fit, refuses the job for every rank, naming the
// versions the server has); from then on every gradient is dropped
// (kRollingBack: the versions after V are taken back, none is applied) and
// each shard drops what it holds and what its fan-out still owes (kRewind).
// Once every rank in the job has asked, those tasks are done and the
// endpoints have nothing in flight, so no update of a version past V can
// reach a worker after V does: each shard restores its chunks at V from the
// checkpoint and sends them to every worker (kRollBack, JobState::
// roll_back_st), and gradients are taken again (the workers push V's next,
// in order behind the restore on a shard core's ring).
//
// Control path (the node's net core): reads a file, allocates.
#include <stdexcept>
#include <string>

#include "agg/shard_state.h"
#include "server/server_node.h"

namespace mercury::server {

std::shared_ptr<const CheckpointFile> ServerNode::rollback_file(uint32_t version) const {
  const ServerNodeConfig::Checkpoints& c = config_.checkpoints;
  if (!c.enabled || c.dir.empty()) throw std::runtime_error("this server writes no checkpoints");
  auto f = std::make_shared<CheckpointFile>(load_checkpoint(c.dir, c.node, version));
  if (const std::string why = checkpoint_fits(*f, config_.optimizer, config_.chunk_bytes);
      !why.empty()) {
    throw std::runtime_error(why);
  }
  check_checkpoint(*f, *placement_);
  return f;
}

void ServerNode::refuse_st(std::string why) {
  control_->refuse_st(std::move(why), now_);
  sync_state_st();
  send_replies_st();
}

void ServerNode::on_rollback_st(uint16_t rank, const agg::ControlMessage& m) {
  if (!running_ || placement_ == nullptr || m.rank != rank || config_.fanout != Fanout::kEvery) {
    count(ServerDrop::kBadControl);
    return;
  }
  const std::string v = std::to_string(m.version);
  if (!rollback_) {
    std::shared_ptr<const CheckpointFile> file;
    try {
      file = rollback_file(m.version);
    } catch (const std::exception& e) {
      refuse_st("cannot roll back to version " + v + " (another server resumed at it; " +
                rank_name_[rank] + " asks): " + e.what());
      return;
    }
    notices_.push_back("rolling back to version " + v +
                       " (another server resumed at it): " + file->path);
    rollback_.emplace();
    rollback_->version = m.version;
    rollback_->file = std::move(file);
    rolling_back_ = true;
    task_every_shard_st(rollback_->rewinds, ShardTask::Kind::kRewind, 0, m.version);
  } else if (m.version != rollback_->version) {
    refuse_st("the ranks roll back to different versions: " + rank_name_[rank] + " to " + v +
              ", another rank to " + std::to_string(rollback_->version));
    return;
  }
  rollback_->asked |= uint64_t{1} << rank;
  poll_rollback_st();
}

void ServerNode::poll_rollback_st() {
  // Refused or stopped: nothing more is served (the tasks stay owned here).
  if (!rolling_back_ || control_->state() != NodeState::kRunning) return;
  for (uint32_t r = 0; r < workers(); ++r) {
    if (control_->in_job(r) && (rollback_->asked >> r & 1) == 0) return;
  }
  for (const auto& t : rollback_->rewinds) {
    if (!t->finished()) return;
  }
  // Every update sent before the rewinds is acknowledged: none of a
  // version past the rollback's can arrive after the restored chunks.
  for (const auto& e : endpoints_) {
    if (!e->idle_st()) return;
  }
  rolling_back_ = false;
  ++rollbacks_;
  notices_.push_back("rolled back to version " + std::to_string(rollback_->version) +
                     ": every rank asked; the shards restore " + rollback_->file->path);
  // The ranks' barrier generations count from 0 again (Worker::roll_back):
  // forgotten before any rank can have its rollback done.
  control_->restart_barriers_st();
  job_state_->roll_back_st(rollback_->file->bytes, rollback_->version);
  rollback_->file.reset();
  poll_job_state_st();
}

}  // namespace mercury::server
