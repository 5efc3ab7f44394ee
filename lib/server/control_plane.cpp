#include "server/control_plane.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <utility>

#include "agg/chunk_table.h"

namespace mercury::server {

ControlPlane::ControlPlane(std::vector<std::string> rank_names, uint32_t job_shards,
                           bool runs_barrier, Starter start, Tick now,
                           agg::PlacementOptions placement, bool asynchronous, bool shrinks)
    : names_(std::move(rank_names)),
      job_shards_(job_shards),
      placement_options_(placement),
      runs_barrier_(runs_barrier),
      start_(std::move(start)),
      since_(now),
      asynchronous_(asynchronous),
      shrinks_(shrinks && !asynchronous) {
  if (names_.empty() || names_.size() > agg::kMaxWorkers) {
    throw std::invalid_argument("server: 1.." + std::to_string(agg::kMaxWorkers) +
                                " workers, got " + std::to_string(names_.size()));
  }
  if (job_shards_ == 0) throw std::invalid_argument("server: the job has no shards");
  declared_.resize(names_.size());
  joined_at_.assign(names_.size(), 0);
  wait_until_.assign(names_.size(), 0);
  wait_why_.resize(names_.size());
  removed_at_.assign(names_.size(), 0);
  for (uint32_t r = 0; r < names_.size(); ++r) {
    peer_rank_.push_back(r);
    rank_peer_.push_back(r);
  }
}

std::string ControlPlane::rank_text(uint16_t rank) const {
  return "worker " + names_[rank] + " (rank " + std::to_string(rank) + ")";
}

std::vector<ControlReply> ControlPlane::take_replies_st() {
  MERCURY_OWNED(owner_);
  return std::exchange(replies_, {});
}

void ControlPlane::enter(NodeState s, Tick now) {
  state_ = s;
  since_ = now;
}

ControlVerdict ControlPlane::on_message_st(uint16_t rank, agg::ControlMessage m, Tick now) {
  MERCURY_OWNED(owner_);
  switch (m.kind) {
    case agg::ControlKind::kDeclare:
      ++counters_.declares;
      if (!sender_is(rank, m.rank, "declare")) {
        ++counters_.declares_refused;
        return ControlVerdict::kWrongRank;
      }
      on_declare(rank, m, now);
      return ControlVerdict::kTaken;
    case agg::ControlKind::kBarrier:
      return on_barrier(rank, m);
    case agg::ControlKind::kHeartbeat:
      return ControlVerdict::kTaken;  // its acknowledgement was the point (agg/control.h)
    case agg::ControlKind::kLeave:
      ++counters_.leaves;
      if (!sender_is(rank, m.rank, "leave")) return ControlVerdict::kWrongRank;
      on_leave(rank, now);
      return ControlVerdict::kTaken;
    default:
      return ControlVerdict::kBadControl;  // kReady, kRefused, kBarrierDone go to workers
  }
}

bool ControlPlane::sender_is(uint16_t rank, uint32_t claimed, const char* what) {
  if (claimed == rank) return true;
  const uint32_t n = workers();
  std::string text = "server: " + names_[rank] + " is rank " + std::to_string(rank) +
                     " in the job file, but its " + what + " says rank " + std::to_string(claimed);
  if (claimed >= n) {
    text += ", which is not in this job (" + std::to_string(n) + " workers: ranks 0.." +
            std::to_string(n - 1) + ")";
  }
  reply_refused(rank, std::move(text));
  return false;
}

void ControlPlane::on_declare(uint16_t rank, agg::ControlMessage& m, Tick now) {
  if (declared_[rank].has_value()) ++counters_.declares_repeated;
  switch (state_) {
    case NodeState::kStopped:
      return;
    case NodeState::kFinished:
      ++counters_.declares_refused;
      reply_refused(rank, "server: the job is finished: every worker left");
      return;
    case NodeState::kRefused:
      ++counters_.declares_refused;
      reply_refused(rank, refusal_);
      return;
    case NodeState::kRunning:
      if (has_left(rank)) {
        ++counters_.declares_refused;
        // Its job is over; the others may still be finishing their last
        // round, which needs nothing from it: only the newcomer is refused.
        reply_refused(rank, "server: worker " + names_[rank] + " (rank " + std::to_string(rank) +
                                ") left this job; a job cannot take a rank back: start the job "
                                "again");
        return;
      }
      if (waits_) {
        await_declare(rank, m.tensors, now);
        return;
      }
      if (shrinks_ && (rank != 0 || gone(rank))) {
        // A BSP job that shrank goes on without the rank (removed now, if
        // its old incarnation's end went unseen); its new process is
        // refused alone.
        if (!gone(rank)) remove(rank, true, "restarted mid-job (declared again)", now);
        ++counters_.declares_refused;
        reply_refused(rank, state_ != NodeState::kRunning
                                ? "server: the job is finished: every worker left"
                                : "server: " + rank_text(rank) +
                                      " was removed from the job (training.on_worker_loss "
                                      "shrink): a BSP job that shrank does not take a rank back");
        return;
      }
      if (asynchronous_) {
        // A new process of a rank the others go on without (removed now,
        // if its old incarnation's end went unseen): it joins.
        if (!gone(rank)) remove(rank, true, "restarted mid-job (declared again)", now);
        if (state_ != NodeState::kRunning) {  // it was the last rank in the job
          ++counters_.declares_refused;
          reply_refused(rank, "server: the job is finished: every worker left");
          return;
        }
        join(rank, m.tensors);
        return;
      }
      // A worker declares once per process: this is a new incarnation whose
      // transport restart went unseen. It holds none of the job's state.
      ++counters_.declares_refused;
      end_restarted(rank, "declared again", now);
      return;
    case NodeState::kWaiting:
      // The latest list from a rank counts (a worker restarted before the
      // job started may have changed it); the answer comes when all are in.
      declared_[rank] = std::move(m.tensors);
      if (rank == 0) {
        seeded_ = m.seeded;
        start_version_ = own_version_ ? *own_version_ : m.seeded ? m.version : 0;
      }
      for (const auto& d : declared_) {
        if (!d.has_value()) return;
      }
      start(now);
      return;
  }
}

void ControlPlane::start(Tick now) {
  for (uint32_t r = 1; r < workers(); ++r) {
    const std::string diff = agg::first_difference(*declared_[0], *declared_[r]);
    if (!diff.empty()) {
      refuse_all("server: rank " + std::to_string(r) +
                     "'s tensor list differs from rank 0's (rank 0's vs rank " + std::to_string(r) +
                     "'s): " + diff,
                 true, now);
      return;
    }
  }
  std::string why;
  try {
    owned_placement_.emplace(
        agg::Placement::compute(*declared_[0], job_shards_, placement_options_));
    why = start_ ? start_(*owned_placement_) : std::string();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    owned_placement_.reset();
    refuse_all("server: cannot start the job: " + why, true, now);
    return;
  }
  placement_ = &*owned_placement_;
  enter(NodeState::kRunning, now);
  for (uint32_t r = 0; r < workers(); ++r) reply_ready(static_cast<uint16_t>(r));
}

void ControlPlane::on_worker_lost_st(uint16_t rank, Tick now) {
  MERCURY_OWNED(owner_);
  if (state_ != NodeState::kRunning || rank >= workers()) return;
  ++counters_.workers_lost;
  if (waits_) {
    if (!gone(rank) && (awaited_ >> rank & 1) == 0) {
      await(rank, "stopped answering and its transport gave up on it (network.peer_timeout_ms)",
            now);
    }
    return;
  }
  if (asynchronous_ || (shrinks_ && rank != 0)) {
    if (!gone(rank)) {
      remove(rank, true,
             "stopped answering and its transport gave up on it (network.peer_timeout_ms)", now);
    }
    return;
  }
  refuse_all("worker " + names_[rank] + " (rank " + std::to_string(rank) +
                 ") stopped answering and its transport gave up on it "
                 "(network.peer_timeout_ms): the job cannot continue without its gradients" +
                 (shrinks_ ? " (a job shrinks without any rank but rank 0)" : ""),
             false, now);
}

void ControlPlane::on_worker_restarted_st(uint16_t rank, Tick now) {
  MERCURY_OWNED(owner_);
  if (rank >= workers()) return;
  if (state_ == NodeState::kWaiting) {
    declared_[rank].reset();  // the old process's declare: the new one declares again
    return;
  }
  // A rank that left is done with the job; its new process is refused when
  // it declares (on_declare).
  if (state_ != NodeState::kRunning || gone(rank)) return;
  if (waits_) {
    if ((awaited_ >> rank & 1) == 0) {
      await(rank, "restarted mid-job (a new incarnation, new epoch)", now);
    }
    return;
  }
  if (asynchronous_ || (shrinks_ && rank != 0)) {
    remove(rank, true, "restarted mid-job (a new incarnation, new epoch)", now);
    return;
  }
  end_restarted(rank, "new epoch", now);
}

void ControlPlane::remove(uint16_t rank, bool lost, const std::string& why, Tick now) {
  // Nothing the others do waits for this rank's gradients: the job goes on
  // without it. What it pushed and the server took stays applied (each
  // push applies on its own); what it had not pushed is never counted.
  if (lost) {
    ++counters_.workers_removed;
    removed_ |= uint64_t{1} << rank;
    removed_at_[rank] = now;
  }
  changes_.push_back({rank, false});
  const uint32_t still = workers() - static_cast<uint32_t>(std::popcount(left_ | removed_));
  std::string text = "worker " + names_[rank] + " (rank " + std::to_string(rank) + ") " + why +
                     ": removed from the job, which goes on with " + std::to_string(still) +
                     (still == 1 ? " rank" : " ranks");
  if (shrinks_) text += " (training.on_worker_loss shrink: its rounds average over them)";
  agg::ControlMessage gone_message;
  gone_message.kind = agg::ControlKind::kWorkerGone;
  gone_message.rank = rank;
  gone_message.lost = lost;
  gone_message.text = text;
  for (uint32_t r = 0; r < workers(); ++r) {
    if (!gone(r)) reply(static_cast<uint16_t>(r), gone_message);
  }
  if (lost) notices_.push_back(text);  // a leave is the job's normal end: said by leaves
  complete_barriers();
  finish_if_all_gone(now);
}

void ControlPlane::join(uint16_t rank, const std::vector<agg::TensorDecl>& tensors,
                        std::string text) {
  // The rank's old incarnation is out of the job (removed): what it pushed
  // and the server took stays applied, and the shards forgot what they
  // owed it. The new process starts from every chunk's newest version.
  if (refuse_another_list(rank_peer_[rank], rank_text(rank), tensors)) return;
  removed_ &= ~(uint64_t{1} << rank);
  ++counters_.workers_joined;
  changes_.push_back({rank, true});
  // Barriers: it takes part from the generation after every one a rank has
  // reached (its own calls are numbered from there), so no generation
  // already begun waits for it.
  uint64_t first = barrier_floor_;
  if (!barrier_arrived_.empty()) first = std::max(first, barrier_arrived_.rbegin()->first + 1);
  if (!barrier_completed_.empty()) first = std::max(first, *barrier_completed_.rbegin() + 1);
  joined_at_[rank] = first;
  const uint32_t in = workers() - static_cast<uint32_t>(std::popcount(left_ | removed_));
  if (text.empty()) text = rank_text(rank) + " joined the running job (a new process)";
  announce_join(rank,
                text + ": it goes on with " + std::to_string(in) + (in == 1 ? " rank" : " ranks"),
                start_version_, first);
}

bool ControlPlane::refuse_another_list(uint32_t peer, const std::string& who,
                                       const std::vector<agg::TensorDecl>& tensors) {
  const std::string diff = agg::first_difference(*declared_[0], tensors);
  if (diff.empty()) return false;
  ++counters_.declares_refused;
  reply_refused_peer(peer, "server: " + who +
                               " cannot join the running job: its tensor list differs from the "
                               "job's (the job's vs its): " +
                               diff);
  return true;
}

void ControlPlane::announce_join(uint16_t rank, const std::string& text, uint32_t version,
                                 uint64_t generation) {
  agg::ControlMessage told;
  told.kind = agg::ControlKind::kWorkerJoined;
  told.rank = rank;
  told.text = text;
  for (uint32_t r = 0; r < workers(); ++r) {
    if (r != rank && in_job(r)) reply(static_cast<uint16_t>(r), told);
  }
  notices_.push_back(text);
  agg::ControlMessage joined;
  joined.kind = agg::ControlKind::kJoined;
  joined.fingerprint = placement_->fingerprint();
  joined.shards = placement_->shards();
  joined.version = version;
  joined.generation = runs_barrier_ ? generation : 0;
  joined.rank = rank;
  reply(rank, std::move(joined));
}

std::vector<ControlPlane::MembershipChange> ControlPlane::take_membership_st() {
  MERCURY_OWNED(owner_);
  if (!asynchronous_ && !shrinks_ && !waits_) return {};
  return std::exchange(changes_, {});
}

void ControlPlane::wait_for_lost(Tick limit, std::string setting) {
  if (asynchronous_ || shrinks_) return;
  waits_ = true;
  wait_limit_ = limit;
  wait_setting_ = std::move(setting);
}

void ControlPlane::await(uint16_t rank, const std::string& why, Tick now) {
  // The rank's sets keep what its old incarnation gave and wait for the
  // rest from its new process; it is sent nothing meanwhile.
  const uint64_t bit = uint64_t{1} << rank;
  awaited_ |= bit;
  joining_ &= ~bit;  // a newer process than the one joining
  wait_until_[rank] = now + wait_limit_;
  wait_why_[rank] = why;
  changes_.push_back({rank, false});
  notices_.push_back(rank_text(rank) + " " + why + ": the round waits for its new process (" +
                     wait_setting_ + ")");
}

void ControlPlane::await_declare(uint16_t rank, const std::vector<agg::TensorDecl>& tensors,
                                 Tick now) {
  // A declare is a new process: its old incarnation's end may have gone
  // unseen.
  if ((awaited_ >> rank & 1) == 0) await(rank, "restarted mid-job (declared again)", now);
  if (refuse_another_list(rank_peer_[rank], rank_text(rank), tensors)) return;
  // The node finds the iteration in progress, then calls finish_join_st.
  const uint64_t bit = uint64_t{1} << rank;
  awaited_ &= ~bit;
  joining_ |= bit;
  changes_.push_back({rank, true});
}

bool ControlPlane::finish_join_st(uint16_t rank, uint32_t version) {
  MERCURY_OWNED(owner_);
  const uint64_t bit = uint64_t{1} << rank;
  if (state_ != NodeState::kRunning || rank >= workers() || (joining_ & bit) == 0) return false;
  joining_ &= ~bit;
  ++counters_.workers_joined;
  // Its barrier calls from the highest generation a rank has reached: a
  // trainer that begins each iteration with a barrier calls that one for the
  // iteration it joins at (answered again if complete).
  uint64_t generation = barrier_floor_ > 0 ? barrier_floor_ - 1 : 0;
  if (!barrier_completed_.empty()) generation = std::max(generation, *barrier_completed_.rbegin());
  if (!barrier_arrived_.empty()) {
    generation = std::max(generation, barrier_arrived_.rbegin()->first);
  }
  announce_join(rank,
                rank_text(rank) + " joined the running job (a new process) at version " +
                    std::to_string(version) + ": the round goes on with " +
                    std::to_string(workers()) + " ranks",
                version, generation);
  return true;
}

bool ControlPlane::check_waits_st(Tick now) {
  MERCURY_OWNED(owner_);
  if (state_ != NodeState::kRunning) return false;
  for (uint64_t w = awaited_ | joining_; w != 0; w &= w - 1) {
    const auto rank = static_cast<uint16_t>(std::countr_zero(w));
    if (static_cast<int64_t>(now - wait_until_[rank]) < 0) continue;
    // The reason first: a worker's handle keeps the first 191 bytes.
    refuse_all(rank_text(rank) + ": no new process of it joined within " + wait_setting_ + " (it " +
                   wait_why_[rank] + "): the job cannot continue without its gradients",
               false, now);
    return true;
  }
  return false;
}

std::vector<std::string> ControlPlane::take_notices_st() {
  MERCURY_OWNED(owner_);
  return std::exchange(notices_, {});
}

void ControlPlane::finish_if_all_gone(Tick now) {
  if (state_ == NodeState::kRunning &&
      static_cast<uint32_t>(std::popcount(left_ | removed_)) == workers()) {
    enter(NodeState::kFinished, now);
    release_spares("server: the job is finished (every rank left or was removed)", false);
  }
}

void ControlPlane::end_restarted(uint16_t rank, const char* how, Tick now) {
  // The new process has no version and no round of the job: under BSP the
  // server would have to send it every parameter and let it into the
  // current round. Not done: the job ends for every rank, the new
  // incarnation included, as for a lost worker. The text is short enough
  // for a worker's handle (191 bytes) behind "server NAME (IP:PORT) stopped
  // the job: ".
  ++counters_.workers_restarted;
  refuse_all("worker " + names_[rank] + " (rank " + std::to_string(rank) +
                 ") restarted mid-job (a new incarnation, " + how +
                 "); a job cannot take a rank back: start the job again",
             false, now);
}

void ControlPlane::on_leave(uint16_t rank, Tick now) {
  if (state_ == NodeState::kWaiting) {
    declared_[rank].reset();  // stopped before the job started: it must declare again
    return;
  }
  if (state_ != NodeState::kRunning || gone(rank)) return;
  if (asynchronous_) {
    // The others go on without it: told, and their barriers no longer wait
    // for it.
    left_ |= uint64_t{1} << rank;
    remove(rank, false, "left the job", now);
    return;
  }
  left_ |= uint64_t{1} << rank;
  finish_if_all_gone(now);
}

void ControlPlane::on_push_after_leave_st(uint16_t rank, Tick now) {
  MERCURY_OWNED(owner_);
  if (state_ != NodeState::kRunning || rank >= workers() || left_ == 0) return;
  ++counters_.pushes_after_leave;
  const auto gone = static_cast<uint32_t>(std::countr_zero(left_));
  refuse_all("worker " + names_[gone] + " (rank " + std::to_string(gone) + ") left the job, and " +
                 names_[rank] + " (rank " + std::to_string(rank) +
                 ") pushed gradients after it: under BSP every round needs every rank's (did "
                 "the workers run different numbers of rounds?)",
             false, now);
}

void ControlPlane::on_stopped_st(Tick now) {
  MERCURY_OWNED(owner_);
  if (state_ == NodeState::kRunning) enter(NodeState::kStopped, now);
}

void ControlPlane::refuse_st(std::string why, Tick now) {
  if (state_ == NodeState::kRunning) refuse_all(std::move(why), false, now);
}

void ControlPlane::refuse_all(std::string why, bool answering_declares, Tick now) {
  refusal_ = std::move(why);
  enter(NodeState::kRefused, now);
  for (uint32_t rank = 0; rank < workers(); ++rank) {
    if (answering_declares) ++counters_.declares_refused;
    reply_refused(static_cast<uint16_t>(rank), refusal_);
  }
  release_spares(refusal_, true);
}

ControlVerdict ControlPlane::on_barrier(uint16_t rank, const agg::ControlMessage& m) {
  ++counters_.barriers;
  if (!runs_barrier_) return ControlVerdict::kBarrierNotHere;
  if (!sender_is(rank, m.rank, "barrier")) return ControlVerdict::kWrongRank;
  agg::ControlMessage done;
  done.kind = agg::ControlKind::kBarrierDone;
  done.generation = m.generation;
  if (m.generation < barrier_floor_ || barrier_completed_.contains(m.generation)) {
    // Already complete: the rank asks again; it gets the answer again.
    ++counters_.barriers_repeated;
    reply(rank, std::move(done));
    return ControlVerdict::kTaken;
  }
  uint64_t& arrived = barrier_arrived_[m.generation];
  const uint64_t bit = uint64_t{1} << rank;
  if ((arrived & bit) != 0) {
    ++counters_.barriers_repeated;
    return ControlVerdict::kTaken;
  }
  arrived |= bit;
  complete_barriers();
  return ControlVerdict::kTaken;
}

uint64_t ControlPlane::barrier_needs(uint64_t generation) const {
  const uint64_t all = workers() >= 64 ? ~uint64_t{0} : (uint64_t{1} << workers()) - 1;
  // Under BSP every rank (one that left holds the job's last barrier up,
  // as before) but those removed from a job that shrank; an asynchronous
  // job's only those still in it, and a rank that joined from the
  // generation it was given on.
  if (!asynchronous_) return all & ~removed_;
  uint64_t needs = all & ~(left_ | removed_);
  for (uint32_t r = 0; r < workers(); ++r) {
    if (joined_at_[r] > generation) needs &= ~(uint64_t{1} << r);
  }
  return needs;
}

void ControlPlane::complete_barriers() {
  if (!runs_barrier_) return;
  for (auto it = barrier_arrived_.begin(); it != barrier_arrived_.end();) {
    const uint64_t needs = barrier_needs(it->first);
    if ((it->second & needs) != needs) {
      ++it;
      continue;
    }
    const uint64_t generation = it->first;
    it = barrier_arrived_.erase(it);
    // Fold the complete generations from the floor up into the floor.
    barrier_completed_.insert(generation);
    while (barrier_completed_.erase(barrier_floor_) != 0) ++barrier_floor_;
    ++counters_.barriers_completed;
    agg::ControlMessage done;
    done.kind = agg::ControlKind::kBarrierDone;
    done.generation = generation;
    for (uint32_t r = 0; r < workers(); ++r) {
      if (in_job(r)) reply(static_cast<uint16_t>(r), done);
    }
  }
}

void ControlPlane::reply(uint16_t rank, agg::ControlMessage m) {
  reply_peer(rank_peer_[rank], std::move(m));
}

void ControlPlane::reply_peer(uint32_t peer, agg::ControlMessage m) {
  ++counters_.replies;
  replies_.push_back(ControlReply{static_cast<uint16_t>(peer), std::move(m)});
}

void ControlPlane::reply_refused(uint16_t rank, std::string text) {
  reply_refused_peer(rank_peer_[rank], std::move(text));
}

void ControlPlane::reply_refused_peer(uint32_t peer, std::string text) {
  agg::ControlMessage r;
  r.kind = agg::ControlKind::kRefused;
  r.text = std::move(text);
  reply_peer(peer, std::move(r));
}

void ControlPlane::reply_ready(uint16_t rank) {
  agg::ControlMessage r;
  r.kind = agg::ControlKind::kReady;
  r.fingerprint = placement_->fingerprint();
  r.shards = placement_->shards();
  r.version = start_version_;
  reply(rank, std::move(r));
}

}  // namespace mercury::server
