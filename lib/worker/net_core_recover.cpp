// NetCore (net_core.h): a lost server, waited for (network.on_server_loss
// wait; docs/worker.md, "Errors").
//
// When liveness names a server lost, a push or control message to it fails,
// or the endpoint sees it back with a new epoch (its process started
// again), every pending request is abandoned (its handle fails, naming the
// server) and the net core waits for the server, at most server_wait_ms.
// A server that started again (ps-server --resume) probes this worker; the
// endpoint takes its new epoch (the old incarnation is dead, or silent to
// the challenge: docs/transport.md) and the net core declares again to it.
// Its kReady carries the version it resumed at: the trackers start afresh
// at that version, the server sends every chunk at it, and once every
// tensor has it in the trainer's buffers the rollback is done: published
// (rollback_version, rollbacks) and the trainer's roll_back() returns it.
// Requests made in between fail; so does one counted before the rollback
// (Request::rollbacks), whose versions the job no longer has.
//
// Several servers (docs/durability.md, "Several servers"): the others are
// still running. The kReady is taken once no push to them is in flight;
// then each is asked to roll back to the version too (kRollback), which it
// does from its own checkpoint once every rank asked, sending every chunk
// at that version. A server without a checkpoint of it answers with its
// newest older one (kRollback back): the rollback starts again at that
// version, which every server, the resumed one included, is asked for.
// Until the rollback is done, a chunk of another version (an update the
// servers made before they rolled back) is dropped.
//
// Control path: runs on failures and control messages, allocates.
#include <algorithm>
#include <utility>

#include "worker/net_core.h"

namespace mercury::worker {

uint16_t NetCore::server_of_key(uint32_t key) const {
  const TensorId t = pushes_->tensor_of_st(key);
  if (t == PushTracker::kNoTensor) return 0;
  for (const BlockGeometry& g : table_.blocks(t)) {
    if (g.key == key) return shard_server_[g.shard];
  }
  return 0;
}

void NetCore::lose_server_st(uint16_t server, const std::string& why) {
  const bool running = phase_ == Phase::kRunning || phase_ == Phase::kInitialising;
  if (!config_.wait_for_servers || !(running || phase_ == Phase::kRecovering) ||
      (phase_ == Phase::kInitialising && start_)) {
    // Not waiting, or the job never started: the worker breaks as it always did.
    break_st(why);
    return;
  }
  if (phase_ == Phase::kRecovering) return;  // waiting already
  phase_ = Phase::kRecovering;
  rolling_back_ = false;
  lost_server_ = server;
  lost_text_ = why;
  recover_deadline_ =
      now_ + uint64_t{config_.server_wait_ms} * (config_.endpoint.transport.tsc_hz / 1000);
  fail_pending_st(why +
                  "; waiting for it to come back (network.on_server_loss: wait): "
                  "roll_back() says the version the job resumes at");
}

void NetCore::handle_restarts_st() {
  const uint64_t restarted = std::exchange(restarted_servers_, 0);
  for (uint16_t s = 0; s < config_.servers.size() && s < 64; ++s) {
    if ((restarted >> s & 1) == 0) continue;
    lose_server_st(s, server_name(s) + " restarted (a new incarnation)");
    if (phase_ != Phase::kRecovering || s != lost_server_) continue;
    // The new process knows nothing of this job: the declarations again.
    agg::ControlMessage declare;
    declare.kind = agg::ControlKind::kDeclare;
    declare.rank = config_.rank;
    declare.tensors = table_.declarations();
    if (!send_control_st(s, declare)) {
      break_st(lost_text_ + "; the declarations to it could not be queued (endpoint full)");
    }
  }
}

bool NetCore::pushes_unsettled_st(uint16_t lost) const {
  for (uint16_t p = 0; p < unsettled_.size(); ++p) {
    if (p != lost && unsettled_[p] != 0) return true;
  }
  return false;
}

void NetCore::on_recovered_ready_st(uint16_t server, const agg::ControlMessage& m) {
  if (server != lost_server_) return;
  if (m.shards != table_.shards() || m.fingerprint != table_.fingerprint()) {
    break_st(lost_text_ + "; it came back with another placement of the tensors");
    return;
  }
  if (config_.servers.size() > 1 && pushes_unsettled_st(server)) {
    // The running servers settle (or drop) what was pushed to them first;
    // slow_st takes the kReady up again.
    held_ready_ = m;
    return;
  }
  held_ready_.reset();
  // Nothing sent to its old process completes any more.
  if (server < unsettled_.size()) unsettled_[server] = 0;
  // Every rank rolls back to the version the server resumed at: the
  // trackers start again there, and the server sends every chunk at it.
  roll_back_to_st(m.version, server);
}

void NetCore::roll_back_to_st(uint32_t version, uint16_t resumed) {
  start_version_ = version;
  PullTrackerConfig pulls = config_.pulls;
  pulls.first_version = start_version_;
  pulls_ = std::make_unique<PullTracker>(table_, pulls);
  pushes_ = std::make_unique<PushTracker>(table_);
  in_flight_.assign(table_.tensors(), std::nullopt);
  phase_ = Phase::kInitialising;
  rolling_back_ = true;
  start_deadline_ =
      now_ + uint64_t{config_.start_timeout_ms} * (config_.endpoint.transport.tsc_hz / 1000);
  // Several servers: the others still run, and roll back to the version
  // too, from their own checkpoints, once every rank asked (kRollback).
  agg::ControlMessage rollback;
  rollback.kind = agg::ControlKind::kRollback;
  rollback.rank = config_.rank;
  rollback.version = start_version_;
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    if (s != resumed && !send_control_st(s, rollback)) {
      break_st(lost_text_ + "; the rollback to version " + std::to_string(start_version_) +
               " could not be queued to " + server_name(s) + " (endpoint full)");
      return;
    }
  }
}

void NetCore::on_older_version_st(const agg::ControlMessage& m) {
  // Only ever back: a proposal at or past the version under way is one
  // taken already (every server that has no checkpoint of it says so).
  if (!rolling_back_ || m.version >= start_version_) return;
  roll_back_to_st(m.version, UINT16_MAX);
}

void NetCore::finish_rollback_st() {
  rolling_back_ = false;
  ++rollbacks_;
  stats_.rollback_version.store(start_version_, std::memory_order_relaxed);
  stats_.rollbacks.store(rollbacks_, std::memory_order_release);  // the trainer's acquire
  for (const Handle& h : roll_back_waiters_) h.complete();
  roll_back_waiters_.clear();
}

void NetCore::roll_back_st(const Request& r) {
  if (r.rollbacks != rollbacks_) {
    r.handle.complete();  // one the trainer has not acknowledged yet
  } else if (recovering()) {
    roll_back_waiters_.push_back(r.handle);
  } else {
    r.handle.fail(!broken_.empty() ? broken_
                                   : "roll_back: no server was lost (the job has not rolled back)");
  }
}

}  // namespace mercury::worker
