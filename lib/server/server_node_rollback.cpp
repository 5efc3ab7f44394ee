// ServerNode (server_node.h): a server rolls back to a checkpoint when
// another server of the job was lost and resumed from its own
// (docs/durability.md, "Several servers").
//
// Every rank, once the resumed server's kReady said the version V the job
// resumes at, asks every other server to roll back to V (kRollback). The
// first ask starts the rollback: from then on every gradient is dropped
// (kRollingBack: the versions after V are taken back, none is applied) and
// each shard drops what it holds and what its fan-out still owes (kRewind).
// The node's version is the newest it has a checkpoint of at or before the
// versions asked: read and checked at once (none refuses the job for every
// rank, naming the versions the server has). A rank that asked for a newer
// version than that is told the node's (kRollback back to it), and asks
// every server, the resumed one included, for it: the job goes back to the
// newest version every server has. Once every rank in the job has asked for
// the node's version, the rewinds are done and the endpoints have nothing in
// flight, so no update of a newer version can reach a worker after the
// restored ones do: each shard restores its chunks from the checkpoint and
// sends them to every worker (kRollBack, JobState::roll_back_st), and
// gradients are taken again (the workers' pushes of that version, in order
// behind the restore on a shard core's ring).
//
// Control path (the node's net core): reads files, allocates.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "agg/shard_state.h"
#include "server/server_node.h"

namespace mercury::server {

std::shared_ptr<const CheckpointFile> ServerNode::rollback_file(uint32_t version) const {
  const ServerNodeConfig::Checkpoints& c = config_.checkpoints;
  if (!c.enabled || c.dir.empty()) throw std::runtime_error("this server writes no checkpoints");
  const std::vector<uint32_t> have = checkpoint_versions(c.dir, c.node);  // newest first
  const auto newest =
      std::find_if(have.begin(), have.end(), [&](uint32_t v) { return v <= version; });
  if (newest == have.end()) {
    std::string list;
    for (uint32_t v : have) list += (list.empty() ? "" : ", ") + std::to_string(v);
    throw std::runtime_error("no checkpoint of node " + c.node + " at or before version " +
                             std::to_string(version) + " in " + c.dir + " (it has " +
                             (list.empty() ? std::string("none") : "versions " + list) +
                             "; checkpoint.keep says how many are kept)");
  }
  auto f = std::make_shared<CheckpointFile>(load_checkpoint(c.dir, c.node, *newest));
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
  if (!rollback_) {
    notices_.push_back("rolling back: " + rank_name_[rank] + " asks for version " +
                       std::to_string(m.version) + " (a server was lost and resumed)");
    rollback_.emplace();
    rolling_back_ = true;
    task_every_shard_st(rollback_->rewinds, ShardTask::Kind::kRewind, 0, m.version);
  }
  Rollback& rb = *rollback_;
  if (!rb.file || m.version < rb.version) {
    // A version older than the node's: its newest checkpoint at or before it.
    try {
      rb.file = rollback_file(m.version);
    } catch (const std::exception& e) {
      refuse_st("cannot roll back to version " + std::to_string(m.version) + " (" +
                rank_name_[rank] + " asks: a server was lost and resumed): " + e.what());
      return;
    }
    rb.version = rb.file->version;
    rb.asked = 0;
    notices_.push_back("rolling back to version " + std::to_string(rb.version) + ": " +
                       rb.file->path);
  }
  if (m.version == rb.version) {
    rb.asked |= uint64_t{1} << rank;
  } else {
    // No checkpoint of the version asked: the rank goes back to this one.
    agg::ControlMessage older;
    older.kind = agg::ControlKind::kRollback;
    older.rank = rank;
    older.version = rb.version;
    control_channel_->send_st(rank, older);
  }
  poll_rollback_st();
}

void ServerNode::poll_rollback_st() {
  // Refused or stopped: nothing more is served (the tasks stay owned here).
  if (!rolling_back_ || control_->state() != NodeState::kRunning) return;
  // A resumed server restores its own checkpoint first (in order on the shards).
  if (own_resume_pending_) return;
  for (uint32_t r = 0; r < workers(); ++r) {
    if (control_->in_job(r) && (rollback_->asked >> r & 1) == 0) return;
  }
  for (const auto& t : rollback_->rewinds) {
    if (!t->finished()) return;
  }
  // Every update sent before the rewinds is acknowledged: none of a newer
  // version can arrive after the restored chunks.
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
  // Done (the rewinds finished): another loss starts another rollback.
  rollback_.reset();
  poll_job_state_st();
}

}  // namespace mercury::server
