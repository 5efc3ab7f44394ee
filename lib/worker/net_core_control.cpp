// NetCore (net_core.h): control messages. Declarations and barriers go out
// as whole kControl messages through the node::ControlChannel; the servers'
// answers (ready, refused, barrier done) come back whole through the
// MessageReceiver and the channel, and drive the start and the barriers.
// Control path: encoding, decoding and buffering allocate.
#include "worker/net_core.h"

#include <algorithm>
#include <cstdio>

namespace mercury::worker {

void NetCore::on_ready_st(uint16_t server, const agg::ControlMessage& m) {
  if (phase_ == Phase::kRecovering) {
    on_recovered_ready_st(server, m);
    return;
  }
  if (phase_ != Phase::kDeclaring || server >= ready_.size()) return;
  const bool joins = m.kind == agg::ControlKind::kJoined;
  if (spare_waits_) {
    // A spare: server 0 gave it a removed rank (docs/membership.md, "Spare
    // workers"). It is that rank from now on, joins the running job as a
    // restarted process does, and declares it to the other servers.
    if (server != 0 || !joins || m.rank >= config_.workers) {
      ++control_malformed_;
      return;
    }
    spare_waits_ = false;
    config_.rank = m.rank;
    stats_.rank.store(m.rank, std::memory_order_relaxed);  // the start's completion releases it
    start_deadline_ = now_ + config_.start_timeout_ms * (config_.endpoint.transport.tsc_hz / 1000);
    agg::ControlMessage declare;
    declare.kind = agg::ControlKind::kDeclare;
    declare.rank = config_.rank;
    declare.tensors = table_.declarations();
    if (!send_declarations_st(declare, 1)) return;
  }
  const bool any = std::find(ready_.begin(), ready_.end(), true) != ready_.end();
  if (any && joins != joining_) {
    fail_start_st("start: " + server_name(server) +
                  (joins ? " takes this worker into a running job, another server starts a new one"
                         : " starts a new job, another server takes this worker into a running "
                           "one") +
                  " (were the servers started at different times?)");
    return;
  }
  joining_ = joins;
  if (joins && server == 0) barrier_base_ = m.generation;
  if (m.shards != table_.shards()) {
    fail_start_st("start: " + server_name(server) + " says the job has " +
                  std::to_string(m.shards) + " shards, this worker counts " +
                  std::to_string(table_.shards()) + " (do both read the same job file?)");
    return;
  }
  if (m.fingerprint != table_.fingerprint()) {
    char text[160];
    std::snprintf(text, sizeof text, "placement fingerprint %016llx, this worker %016llx",
                  static_cast<unsigned long long>(m.fingerprint),
                  static_cast<unsigned long long>(table_.fingerprint()));
    fail_start_st("start: " + server_name(server) + " computed " + text +
                  ": the nodes disagree on the tensors or the shards");
    return;
  }
  if (m.version != start_version_ && any) {
    fail_start_st("start: " + server_name(server) + " starts the job at version " +
                  std::to_string(m.version) + ", another server at " +
                  std::to_string(start_version_));
    return;
  }
  start_version_ = m.version;
  ready_[server] = true;
  if (std::find(ready_.begin(), ready_.end(), false) != ready_.end()) return;
  phase_ = Phase::kInitialising;
  // The job has started (every server placed it): link.rate_steps count from here.
  port_.start_link_schedule_st(now_);
  if (start_version_ != 0 && !async()) {
    // A resumed job: the first version every tensor waits for is the state's.
    PullTrackerConfig pulls = config_.pulls;
    pulls.first_version = start_version_;
    pulls_ = std::make_unique<PullTracker>(table_, pulls);
  }
  if (resume_) {
    // Rank 0 resumes the job: its pages instead of its buffers, one page in
    // flight per server (net_core_state.cpp).
    seed_next_.assign(config_.servers.size(), 0);
    seed_sequence_ = next_sequence_++;
    for (uint16_t s = 0; s < config_.servers.size(); ++s) send_seed_page_st(s);
    return;
  }
  if (config_.rank == 0 && !joining_) {
    // Rank 0's buffers as they are now become version 0 on every rank (a
    // process joining a running job gets the servers' newest instead).
    init_pushes_.reserve(table_.tensors());
    for (TensorId t = 0; t < table_.tensors(); ++t) {
      init_pushes_.emplace_back();
      push_st(t, 0, 0, table_.tensor(t).buffer.data(), wire::PacketType::kInit,
              init_pushes_.back());
    }
  }
}

bool NetCore::send_control_st(uint16_t server, const agg::ControlMessage& m) {
  return control_->send_st(server < server_peer_.size() ? server_peer_[server] : server, m);
}

void NetCore::on_control_failed_st(uint32_t server, const transport::SendResult& r) {
  if (stopped_ || stop_) return;
  if (phase_ == Phase::kDeclaring) {
    fail_start_st("start: the declarations did not reach " +
                  server_name(static_cast<uint16_t>(server)) + ": " + std::string(r.error));
  } else {
    lose_peer_st(static_cast<uint16_t>(server), std::string(r.error));
  }
}

std::byte* NetCore::on_message_begin(uint16_t peer, const wire::HeaderFields& h) {
  return control_->begin_st(peer, h);
}

void NetCore::on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte*) {
  control_->complete_st(peer, h);
}

void NetCore::on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte*) {
  control_->abandon_st(peer, msg_id);
}

void NetCore::on_control_st(uint32_t server, agg::ControlMessage&& m) {
  const auto peer = static_cast<uint16_t>(server);
  switch (m.kind) {
    case agg::ControlKind::kReady:
    case agg::ControlKind::kJoined:
      on_ready_st(peer, m);
      break;
    case agg::ControlKind::kRefused:
      if (phase_ == Phase::kDeclaring) {
        fail_start_st("start: " + server_name(peer) + " refused the declarations: " + m.text);
      } else if (phase_ == Phase::kInitialising || phase_ == Phase::kRunning ||
                 phase_ == Phase::kRecovering) {
        // A server giving up on the job (e.g. another rank died): every
        // pending and later request fails with its reason instead of waiting
        // for aggregates that will never come.
        break_st(server_name(peer) + " stopped the job: " + m.text);
      }
      break;
    case agg::ControlKind::kBarrierDone:
      std::erase_if(barriers_, [&](const PendingBarrier& b) {
        if (b.generation != m.generation) return false;
        b.handle.complete();
        return true;
      });
      break;
    case agg::ControlKind::kHeartbeat:
      break;  // its acknowledgement was the point (agg/control.h)
    case agg::ControlKind::kPromoted:
      on_promoted_st(peer, m);
      break;
    case agg::ControlKind::kStandbyLost:
      on_standby_lost_st(peer, m);
      break;
    case agg::ControlKind::kRollback:
      on_older_version_st(m);
      break;
    case agg::ControlKind::kSettingsDone:
    case agg::ControlKind::kStatePage:
    case agg::ControlKind::kStateSeeded:
      on_state_reply_st(peer, m);
      break;
    case agg::ControlKind::kWorkerGone:
    case agg::ControlKind::kWorkerJoined:
      on_membership_st(peer, m);
      break;
    case agg::ControlKind::kReleased:
      if (!spare_waits_ || peer != 0) {
        ++control_malformed_;
        break;
      }
      // The job ended without needing this spare: its start fails with the
      // reason, marked as a release (Worker::start throws SpareReleased).
      spare_waits_ = false;
      stats_.released.store(true, std::memory_order_relaxed);  // before the handle fails
      fail_start_st(server_name(peer) + " released this spare: " + m.text);
      break;
    default:
      ++control_malformed_;  // a worker is never sent declarations or barriers
      break;
  }
}

void NetCore::on_membership_st(uint16_t server, const agg::ControlMessage& m) {
  // An asynchronous job goes on without that rank, or took a new process
  // of it (docs/membership.md). Every server says so: counted, and said,
  // once per event.
  if (m.rank >= 64) return;
  if (m.kind == agg::ControlKind::kWorkerGone && !m.lost) {
    ranks_left_ |= uint64_t{1} << m.rank;  // a rank leaves once
    publish_st();
    return;
  }
  if (told_.size() < config_.servers.size()) told_.resize(config_.servers.size());
  if (server >= told_.size()) return;
  const bool joined = m.kind == agg::ControlKind::kWorkerJoined;
  uint32_t& mine = joined ? told_[server].joined[m.rank] : told_[server].removed[m.rank];
  uint32_t& most = joined ? most_told_.joined[m.rank] : most_told_.removed[m.rank];
  if (++mine <= most) return;  // another server told it first
  most = mine;
  ++(joined ? workers_joined_ : workers_removed_);
  publish_st();  // counted before any answer that follows (a barrier's)
  std::fprintf(stderr, "mercury: %s: %s\n", server_name(server).c_str(), m.text.c_str());
}

}  // namespace mercury::worker
