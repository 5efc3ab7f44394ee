// ControlPlane (control_plane.h): spare workers, nodes outside the ranks
// that take a removed rank over (docs/membership.md, "Spare workers").
// Control path: it allocates (texts, lists).
#include <bit>
#include <stdexcept>
#include <utility>

#include "agg/chunk_table.h"
#include "server/control_plane.h"

namespace mercury::server {

void ControlPlane::add_spares(std::vector<std::string> names, Tick grace) {
  if (!asynchronous_ || names.empty()) return;
  if (workers() + names.size() > agg::kMaxWorkers) {
    throw std::invalid_argument("server: " + std::to_string(workers()) + " ranks and " +
                                std::to_string(names.size()) + " spares, at most " +
                                std::to_string(agg::kMaxWorkers) + " in all");
  }
  spare_names_ = std::move(names);
  spare_grace_ = grace;
  spare_lists_.resize(spare_names_.size());
  peer_rank_.resize(workers() + spare_names_.size(), kNoPeer);
}

ControlVerdict ControlPlane::on_peer_message_st(uint32_t peer, agg::ControlMessage m, Tick now) {
  MERCURY_OWNED(owner_);
  if (peer >= peers()) return ControlVerdict::kBadControl;
  const bool spare = peer >= workers();
  if (peer_rank_[peer] != kNoPeer) {
    const auto rank = static_cast<uint16_t>(peer_rank_[peer]);
    if (!spare || m.kind != agg::ControlKind::kDeclare || m.rank != agg::kSpareRank) {
      return on_message_st(rank, std::move(m), now);
    }
    // The spare that held the rank announces itself again: a new process
    // (the declare itself is the proof). The rank is removed; the spare
    // waits again.
    if (state_ == NodeState::kRunning && !gone(rank)) {
      remove(rank, true,
             "restarted mid-job (spare " + spare_names_[peer - workers()] +
                 ", which held it, declared again)",
             now);
    }
    peer_rank_[peer] = kNoPeer;
  }
  if (spare) return on_spare_st(peer - workers(), m, now);
  // A rank's own node, whose rank a spare took over.
  if (m.kind == agg::ControlKind::kHeartbeat) return ControlVerdict::kTaken;
  if (m.kind != agg::ControlKind::kDeclare) return ControlVerdict::kNoRank;
  ++counters_.declares;
  ++counters_.declares_refused;
  // Only a takeover leaves a rank's own node without its rank: a spare's
  // peer speaks for it.
  const uint32_t holder = rank_peer_[peer];
  reply_refused_peer(
      peer, "server: " + rank_text(static_cast<uint16_t>(peer)) + " was taken over by spare " +
                (holder >= workers() ? spare_names_[holder - workers()] : names_[holder]) +
                ": the job does not take " + names_[peer] + " back");
  return ControlVerdict::kTaken;
}

ControlVerdict ControlPlane::on_spare_st(uint32_t spare, agg::ControlMessage& m, Tick now) {
  const uint32_t peer = workers() + spare;
  const uint64_t bit = uint64_t{1} << spare;
  const std::string& name = spare_names_[spare];
  auto refuse = [&](std::string text) {
    ++counters_.declares_refused;
    reply_refused_peer(peer, std::move(text));
    return ControlVerdict::kTaken;
  };
  switch (m.kind) {
    case agg::ControlKind::kHeartbeat:
      return ControlVerdict::kTaken;
    case agg::ControlKind::kLeave:
      // Its process stops before it took a rank: it waits no more.
      ++counters_.leaves;
      spares_waiting_ &= ~bit;
      return ControlVerdict::kTaken;
    case agg::ControlKind::kDeclare:
      break;
    default:
      return ControlVerdict::kNoRank;  // a spare sends nothing else before it holds a rank
  }
  ++counters_.declares;
  if (state_ == NodeState::kStopped) return ControlVerdict::kTaken;
  if (state_ == NodeState::kRefused) return refuse(refusal_);
  if (m.rank == agg::kSpareRank) {
    if (!runs_barrier_) {
      return refuse("server: spare " + name +
                    " announced itself to a server other than server 0 (server 0 gives the "
                    "spares their ranks)");
    }
    if (state_ == NodeState::kFinished) {
      ++counters_.spares_released;
      agg::ControlMessage r;
      r.kind = agg::ControlKind::kReleased;
      r.text = "server: the job is finished (every rank left or was removed): spare " + name +
               " was not needed";
      reply_peer(peer, std::move(r));
      return ControlVerdict::kTaken;
    }
    if (state_ == NodeState::kRunning && refuse_another_list(peer, "spare " + name, m.tensors)) {
      return ControlVerdict::kTaken;
    }
    if ((spares_waiting_ & bit) != 0) ++counters_.declares_repeated;
    spare_lists_[spare] = std::move(m.tensors);
    spares_waiting_ |= bit;
    check_spares_st(now);
    return ControlVerdict::kTaken;
  }
  // The rank server 0 gave it, declared to another server.
  if (m.rank >= workers()) {
    return refuse("server: spare " + name + "'s declare says rank " + std::to_string(m.rank) +
                  ", which is not in this job (" + std::to_string(workers()) + " ranks)");
  }
  if (runs_barrier_) {
    return refuse("server: spare " + name + " declares rank " + std::to_string(m.rank) +
                  ", which server 0 did not give it");
  }
  if (state_ != NodeState::kRunning) {
    return refuse(state_ == NodeState::kFinished
                      ? "server: the job is finished (every rank left or was removed)"
                      : "server: spare " + name + " declared before the job started");
  }
  take_over(static_cast<uint16_t>(m.rank), spare, m.tensors, now);
  return ControlVerdict::kTaken;
}

bool ControlPlane::check_spares_st(Tick now) {
  MERCURY_OWNED(owner_);
  if (!runs_barrier_ || state_ != NodeState::kRunning || spares_waiting_ == 0) return false;
  bool any = false;
  for (uint64_t w = removed_ & ~left_; w != 0 && spares_waiting_ != 0; w &= w - 1) {
    const auto rank = static_cast<uint16_t>(std::countr_zero(w));
    if (now - removed_at_[rank] < spare_grace_) continue;  // its own new process may come
    const auto spare = static_cast<uint32_t>(std::countr_zero(spares_waiting_));
    take_over(rank, spare, spare_lists_[spare], now);
    any = true;
    if (state_ != NodeState::kRunning) break;
  }
  return any;
}

void ControlPlane::take_over(uint16_t rank, uint32_t spare,
                             const std::vector<agg::TensorDecl>& tensors, Tick now) {
  const uint32_t peer = workers() + spare;
  const std::string& name = spare_names_[spare];
  if (refuse_another_list(peer, "spare " + name, tensors)) {
    spares_waiting_ &= ~(uint64_t{1} << spare);
    return;
  }
  // Its rank's process may still run here (a server other than server 0
  // learns of the takeover from the spare's declare).
  if (!gone(rank)) remove(rank, true, "was taken over by spare " + name, now);
  if (state_ != NodeState::kRunning) return;
  // The spare's peer speaks for the rank from now on; the rank's own node
  // (or the spare that held it before) for none.
  peer_rank_[rank_peer_[rank]] = kNoPeer;
  rank_peer_[rank] = peer;
  peer_rank_[peer] = rank;
  spares_waiting_ &= ~(uint64_t{1} << spare);
  takeovers_.push_back({rank, peer});
  ++counters_.spares_joined;
  join(rank, tensors, "spare " + name + " took over " + rank_text(rank));
}

void ControlPlane::on_peer_lost_st(uint32_t peer, Tick now) { on_peer_gone(peer, false, now); }

void ControlPlane::on_peer_restarted_st(uint32_t peer, Tick now) { on_peer_gone(peer, true, now); }

void ControlPlane::on_peer_gone(uint32_t peer, bool restarted, Tick now) {
  MERCURY_OWNED(owner_);
  if (const std::optional<uint32_t> rank = rank_of_peer(peer)) {
    if (restarted) {
      on_worker_restarted_st(static_cast<uint16_t>(*rank), now);
    } else {
      on_worker_lost_st(static_cast<uint16_t>(*rank), now);
    }
  } else if (peer >= workers() && peer < peers()) {
    spares_waiting_ &= ~(uint64_t{1} << (peer - workers()));  // its new process announces again
  }
}

void ControlPlane::release_spares(const std::string& why, bool refused) {
  for (uint64_t w = spares_waiting_; w != 0; w &= w - 1) {
    const auto spare = static_cast<uint32_t>(std::countr_zero(w));
    agg::ControlMessage r;
    r.kind = refused ? agg::ControlKind::kRefused : agg::ControlKind::kReleased;
    r.text = refused ? why : why + ": spare " + spare_names_[spare] + " was not needed";
    if (!refused) ++counters_.spares_released;
    reply_peer(workers() + spare, std::move(r));
  }
  spares_waiting_ = 0;
}

std::vector<ControlPlane::Takeover> ControlPlane::take_takeovers_st() {
  MERCURY_OWNED(owner_);
  return std::exchange(takeovers_, {});
}

}  // namespace mercury::server
