// NetCore (net_core.h): a server's hot standby (docs/durability.md, "A hot
// standby"; docs/worker.md, "Errors").
//
// A server with a standby has it as one more peer of the endpoint (after
// the servers), declared to and answered like a server and otherwise sent
// nothing but heartbeats and settings. When the server is lost (liveness
// names it, or a push or control message to it fails) nothing fails: pushes
// to it are settled as sent (its standby gets them again), new pushes wait,
// and the net core waits for the standby's kPromoted, at most
// server_wait_ms. Then every message for the server goes to the standby,
// and each tensor whose last push's version is not in yet is pushed again
// to it, the blocks of the lost server's shards only, from the trainer's
// gradient (still in place: its pull has not completed). The standby
// aggregates what the server had not (every rank resends those) and answers
// again what it had; no trainer call fails and nothing rolls back.
//
// The worker takes a promotion only once it has lost the server itself. A
// kPromoted that comes while the server is not lost here is held, and the
// server probed: lost meanwhile (liveness, or the probe fails), the held
// promotion is taken at once; the probe answered, the server lives after
// the standby named it lost (the pair was cut apart, not the server lost),
// and the worker refuses the promotion (kPromotionRefused to the standby,
// which then serves nothing): the server, having lost its standby too,
// serves versions the standby does not have, and following the standby
// would go on from diverged parameters. A server that names its standby
// lost says so first (kStandbyLost, before any update goes out
// unreplicated): that standby is followed no more, and its promotion, if
// it comes, is refused at once.
//
// Control path: runs on failures and a control message, allocates. The
// resends go out on later passes as the endpoint takes them.
#include <bit>
#include <cstdio>

#include "worker/net_core.h"

namespace mercury::worker {

uint16_t NetCore::server_of_standby(uint16_t peer) const {
  for (uint16_t s = 0; s < standby_peer_.size(); ++s) {
    if (standby_peer_[s] == peer) return s;
  }
  return kNoStandby;
}

bool NetCore::standby_covers_st(uint16_t server, uint16_t peer) const {
  return server < standby_peer_.size() && standby_peer_[server] != kNoStandby && peer == server &&
         ((standby_lost_ | refused_) >> server & 1) == 0;
}

void NetCore::lose_peer_st(uint16_t peer, const std::string& why) {
  if (peer >= config_.servers.size()) {
    const uint16_t s = server_of_standby(peer);
    if (s == kNoStandby) return;
    const uint64_t bit = uint64_t{1} << s;
    if ((standby_lost_ & bit) != 0) return;
    standby_lost_ |= bit;
    held_ &= ~bit;
    if ((refused_ & bit) != 0) return;  // it stood by no more: said when refused
    if (((failed_over_ | failing_over_) & bit) != 0) {
      // It was (or was to become) the server: the job has lost both.
      break_st(why + "; " + server_name(s) + " was lost before it");
      return;
    }
    std::fprintf(stderr, "mercury: %s was lost: %s goes on without a standby\n",
                 server_name(peer).c_str(), server_name(s).c_str());
    return;
  }
  if (!standby_covers_st(peer, peer)) {
    if (peer < config_.servers.size() && (refused_ >> peer & 1) != 0) {
      lose_server_st(peer, why +
                               " (it went on without its standby, which lacks what it served "
                               "since)");
      return;
    }
    lose_server_st(peer, why);
    return;
  }
  const uint64_t bit = uint64_t{1} << peer;
  if (((failed_over_ | failing_over_) & bit) != 0) return;  // its standby takes (took) over
  failing_over_ |= bit;
  failover_deadline_ =
      now_ + uint64_t{config_.server_wait_ms} * (config_.endpoint.transport.tsc_hz / 1000);
  std::fprintf(stderr, "mercury: %s: %s; waiting for its standby to take over\n",
               server_name(peer).c_str(), why.c_str());
  // Its standby said so first: lost here too now, the promotion is taken.
  if ((held_ & bit) != 0) take_promotion_st(peer, held_promotion_[peer]);
}

void NetCore::on_promoted_st(uint16_t peer, const agg::ControlMessage& m) {
  const uint16_t s = server_of_standby(peer);
  if (s == kNoStandby) return;
  const uint64_t bit = uint64_t{1} << s;
  if (held_promotion_.size() < config_.servers.size()) {
    held_promotion_.resize(config_.servers.size());
  }
  if ((refused_ & bit) != 0 && (refusal_sent_ & bit) == 0 && (standby_lost_ & bit) == 0) {
    // Its server named it lost before: it lacks what the server served since.
    held_promotion_[s] = m;
    refuse_standby_st(s, false);
    return;
  }
  if (((failed_over_ | standby_lost_ | refused_ | held_) & bit) != 0) return;
  if ((failing_over_ & bit) != 0) {
    take_promotion_st(s, m);
    return;
  }
  // The server is not lost here: held until it is (liveness, or the probe
  // fails), or refused when the server answers the probe sent now.
  held_ |= bit;
  held_promotion_[s] = m;
  const std::string& name = config_.servers[s].peer.name;
  std::fprintf(
      stderr,
      "mercury: %s announced its promotion (%s lost) at version %u; %s is not lost here: held "
      "while %s is probed\n",
      server_name(peer).c_str(), name.c_str(), m.version, name.c_str(), name.c_str());
  probe_held_st();
}

void NetCore::probe_held_st() {
  for (uint64_t due = held_ & ~probed_; due != 0; due &= due - 1) {
    const auto s = static_cast<uint16_t>(std::countr_zero(due));
    // Not queued (the endpoint full): the slow work tries again.
    if (control_->probe_st(s)) probed_ |= uint64_t{1} << s;
  }
}

void NetCore::on_control_delivered_st(uint32_t peer, agg::ControlKind kind) {
  if (peer >= config_.servers.size() || kind != agg::ControlKind::kHeartbeat) return;
  const auto s = static_cast<uint16_t>(peer);
  if ((held_ >> s & 1) == 0) return;
  // The server answered after its standby named it lost: the pair was cut
  // apart, and the server (which names its standby lost too) serves
  // versions the standby does not have.
  refuse_standby_st(s, true);
}

void NetCore::on_standby_lost_st(uint16_t server, const agg::ControlMessage& m) {
  if (server >= config_.servers.size() || standby_peer_[server] == kNoStandby) {
    ++control_malformed_;
    return;
  }
  const uint64_t bit = uint64_t{1} << server;
  if (((refused_ | standby_lost_ | failed_over_) & bit) != 0) return;
  refused_ |= bit;
  if ((failing_over_ & bit) != 0) {
    // Lost here, and its standby lacks what it served since.
    break_st(server_name(server) + " was lost, and had gone on without its standby: " + m.text);
    return;
  }
  std::fprintf(stderr, "mercury: %s: %s; it goes on without a standby\n",
               server_name(server).c_str(), m.text.c_str());
  // A promotion held meanwhile is refused now.
  if ((held_ & bit) != 0) refuse_standby_st(server, false);
}

void NetCore::refuse_standby_st(uint16_t s, bool answered) {
  const uint64_t bit = uint64_t{1} << s;
  held_ &= ~bit;
  probed_ &= ~bit;
  refused_ |= bit;
  refusal_sent_ |= bit;
  const std::string& name = config_.servers[s].peer.name;
  agg::ControlMessage refusal;
  refusal.kind = agg::ControlKind::kPromotionRefused;
  refusal.rank = config_.rank;
  refusal.text = name + (answered ? " still answers it" : " named its standby lost before") +
                 " (a partition between " + name + " and its standby?)";
  if (!control_->send_st(standby_peer_[s], refusal)) {
    // The standby goes on believing it serves; no worker follows it.
    std::fprintf(stderr, "mercury: the refusal to %s could not be queued (endpoint full)\n",
                 server_name(standby_peer_[s]).c_str());
  }
  std::fprintf(stderr,
               "mercury: %s announced its promotion (%s lost) at version %u, but %s %s: promotion "
               "refused (a partition between %s and its standby?); %s goes on without a "
               "standby\n",
               server_name(standby_peer_[s]).c_str(), name.c_str(), held_promotion_[s].version,
               name.c_str(),
               answered ? "still answers this worker" : "named its standby lost before",
               name.c_str(), name.c_str());
}

void NetCore::take_promotion_st(uint16_t s, const agg::ControlMessage& m) {
  const uint64_t bit = uint64_t{1} << s;
  const uint16_t peer = standby_peer_[s];
  held_ &= ~bit;
  probed_ &= ~bit;
  failing_over_ &= ~bit;
  failed_over_ |= bit;
  server_peer_[s] = peer;
  ++takeovers_;
  // What the lost server had not answered: each tensor whose last push's
  // version is not in, its blocks on that server's shards (those sent so
  // far; the rest of a push still queued goes to the standby anyway).
  uint32_t tensors = 0;
  if (pushes_ && pulls_) {
    for (TensorId t = 0; t < table_.tensors(); ++t) {
      const LastPush& last = last_push_[t];
      if (!last.valid || version_in_st(t, last.iteration + 1)) continue;
      auto end = static_cast<uint32_t>(table_.blocks(t).size());
      for (const PendingPush& p : push_queue_) {
        if (p.tensor == t && p.started) end = p.next;
      }
      resends_.push_back(Resend{t, last.iteration, last.grad, 0, end, s});
      ++tensors;
    }
  }
  tensors_resent_ += tensors;
  pulls_dirty_ = true;
  if (s == 0) {
    // The barrier runs on server 0: the standby's needs every rank's
    // arrival at the generations in progress, including the last one the
    // lost server may have completed for some ranks but not for others.
    std::vector<uint64_t> generations;
    if (barrier_sent_) generations.push_back(last_barrier_);
    for (const PendingBarrier& b : barriers_) {
      if (b.generation != last_barrier_ || !barrier_sent_) generations.push_back(b.generation);
    }
    for (const uint64_t g : generations) {
      agg::ControlMessage b;
      b.kind = agg::ControlKind::kBarrier;
      b.rank = config_.rank;
      b.generation = g;
      if (!send_control_st(0, b)) {
        break_st(server_name(peer) + " took over, and the barrier could not be queued to it");
        return;
      }
    }
  }
  std::fprintf(stderr,
               "mercury: %s took over from %s at version %u (%s): %u tensors pushed again\n",
               server_name(peer).c_str(), config_.servers[s].peer.name.c_str(), m.version,
               m.text.c_str(), tensors);
}

uint32_t NetCore::send_resends_st() {
  uint32_t work = 0;
  while (!resends_.empty()) {
    Resend& r = resends_.front();
    const uint8_t level = table_.tensor(r.tensor).level;
    const std::span<const BlockGeometry> blocks = table_.blocks(r.tensor);
    transport::MessageMeta meta;
    meta.type = wire::PacketType::kData;
    meta.dtype = table_.tensor(r.tensor).dtype;
    meta.iteration = r.iteration;
    for (; r.next < r.end; ++r.next) {
      const BlockGeometry& g = blocks[r.next];
      if (shard_server_[g.shard] != r.server) continue;
      meta.block_key = g.key;
      if (endpoint_->send(server_peer_[r.server], r.grad + g.first_byte(),
                          static_cast<uint32_t>(g.bytes()), level, meta,
                          transport::Completion{&NetCore::on_resend_sent, this, g.key}) !=
          transport::SubmitStatus::kQueued) {
        return work;  // the endpoint is full: the rest on a later pass
      }
      bytes_pushed_ += g.bytes();
      ++work;
    }
    resends_.erase(resends_.begin());
  }
  return work;
}

void NetCore::on_resend_sent(void* self, const transport::SendResult& r) {
  auto& core = *static_cast<NetCore*>(self);
  if (core.stopped_ || r.ok()) return;
  core.lose_peer_st(r.peer, std::string(r.error));
}

}  // namespace mercury::worker
