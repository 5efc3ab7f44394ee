// Peer: both halves of a peer wired together, plus the epoch exchange. See
// transport.h and docs/transport.md.
#include <algorithm>
#include <stdexcept>

#include "transport/transport.h"

namespace mercury::transport {

namespace wf = wire::flags;

namespace {

uint32_t checked_epoch(uint32_t e) {
  if (e == 0) throw std::invalid_argument("transport: local epoch must be non-zero");
  return e;
}

}  // namespace

Peer::Peer(const Config& config, uint32_t local_epoch, Tick now, uint32_t peer_epoch)
    : p_(resolve(config)),
      local_epoch_(checked_epoch(local_epoch)),
      sender_(p_, initial_seq(local_epoch, peer_epoch, p_.seq_salt), now),
      receiver_(p_, local_epoch, peer_epoch),
      owe_epoch_(true),
      next_probe_(now),
      probe_interval_(p_.initial_rto),
      connect_deadline_(p_.connect_timeout != 0 ? now + p_.connect_timeout : 0) {}

uint32_t Peer::stream_origin() const {
  return initial_seq(local_epoch_, receiver_.peer_epoch(), p_.seq_salt);
}

void Peer::stamp(const TxStamp& st, wire::HeaderFields& h) {
  h.seq = st.seq;
  h.epoch = local_epoch_;
  h.flags = static_cast<uint16_t>((h.flags & ~(wf::kAckValid | wf::kRetransmit | wf::kDuplicate)) |
                                  st.flags);
  receiver_.fill_ack(h);  // piggyback: every data packet carries our latest ACK
  owe_epoch_ = false;
}

bool Peer::send(const SliceRef& slice, Tick now, wire::HeaderFields& h) {
  if (!can_send()) return false;
  stamp(sender_.on_send(slice, now), h);
  return true;
}

Resend Peer::resend(uint32_t seq, Tick now, SliceRef& slice, wire::HeaderFields& h) {
  TxStamp st;
  const Resend r = sender_.on_resend(seq, now, slice, st);
  if (r == Resend::kSend) stamp(st, h);
  return r;
}

bool Peer::ack_due(Tick now) const {
  if (connect_failed_) return false;
  if (!peer_known()) return now >= next_probe_;
  return owe_epoch_ || answer_token_ != 0 || sender_.probe_due() || receiver_.ack_due(now) ||
         (persisting() && now >= next_persist_) || challenge_due(now);
}

Tick Peer::challenge_interval() const {
  // As a probe for a lost packet would be resent, but at least four times
  // before the incarnation is taken as gone.
  return std::clamp(sender_.rto(), p_.min_rto, std::max(p_.min_rto, p_.challenge_timeout / 4));
}

void Peer::fill_pure_ack(Tick now, wire::HeaderFields& h) {
  h.type = wire::PacketType::kAck;
  h.payload_len = 0;
  h.offset = 0;
  h.msg_len = 0;
  h.seq = sender_.next_seq();  // informational: a pure ACK occupies no sequence number
  h.epoch = local_epoch_;
  // While we do not know the peer, ask it to answer (kAckRequest); an answer
  // never asks back, so probes do not ping-pong.
  h.flags = peer_known() ? 0 : wf::kAckRequest;
  if (persisting() && now >= next_persist_) {
    h.flags = wf::kAckRequest;  // the answer brings the peer's credit
    next_persist_ = now + sender_.rto();
    ++persist_probes_;
  }
  if (answer_token_ != 0) {
    // The answer to the peer's probe or challenge: `offset` echoes its
    // token, and the ACK below covers everything we had when we read it.
    h.flags |= wf::kAnswer;
    h.offset = answer_token_;
    answer_token_ = 0;
  } else if (challenge_due(now)) {
    // The epoch challenge, to the incarnation we know: only it can echo
    // the token (a newer one's answer carries its own epoch and is dropped).
    h.flags |= wf::kAckRequest;
    h.offset = challenge_token_;
    next_challenge_ = now + challenge_interval();
  } else if (peer_known() && sender_.probe_due()) {
    // Our timer's probe: where does the peer stand? (An answer cannot carry
    // one, `offset` holds the echo; it goes with the next pure ACK.)
    h.flags |= wf::kAckRequest;
    h.offset = sender_.on_probe_sent(now);
  }
  owe_epoch_ = false;
  if (!receiver_.fill_ack(h)) {
    // A probe: nothing to acknowledge yet, but the peer learns our epoch.
    ++probes_sent_;
    if (!peer_known()) {
      next_probe_ = now + probe_interval_;
      probe_interval_ = std::min(2 * probe_interval_, p_.max_rto);
    }
  }
}

bool Peer::incarnation_gone(const wire::HeaderFields& h, Tick now) {
  if (p_.epochs_authenticated) return true;  // proven by the MAC
  if (challenge_epoch_ == 0) {
    // Ask the incarnation we know; until it is shown gone and the new one
    // shown real, the new epoch's packets go nowhere (one forged packet
    // must not end a live peer's streams, nor replace a dead one).
    challenge_epoch_ = h.epoch;
    challenge_token_ = challenge_token(local_epoch_, challenges_, now);
    next_challenge_ = now;
    challenge_deadline_ = now + p_.challenge_timeout;
    proven_epoch_ = 0;
    ++challenges_;
    return false;
  }
  if (epoch_newer(h.epoch, challenge_epoch_)) challenge_epoch_ = h.epoch;
  // The newer incarnation answered our challenge: it receives what we send
  // to the peer's address, which a forger off the path does not.
  const bool echo = h.type == wire::PacketType::kAck && (h.flags & wf::kAnswer) != 0 &&
                    h.offset == challenge_token_;
  if (echo && (proven_epoch_ == 0 || epoch_newer(h.epoch, proven_epoch_))) proven_epoch_ = h.epoch;
  return h.epoch == proven_epoch_ && old_gone(now);
}

void Peer::restart_as(uint32_t epoch, Tick now, SenderSink& sink) {
  receiver_.restart(epoch);
  // The peer's receiver for us is fresh: what we had in flight is lost with
  // its old incarnation, and our stream must start where it now looks.
  restart_stream(now, FailReason::kPeerRestarted, sink);
}

void Peer::restart_stream(Tick now, FailReason why, SenderSink& sink) {
  sender_.restart(stream_origin(), now, why, sink);
  owe_epoch_ = true;
  answer_token_ = 0;
  clear_challenge();
}

void Peer::clear_challenge() {
  challenge_epoch_ = 0;
  challenge_token_ = 0;
  proven_epoch_ = 0;
}

RxResult Peer::on_packet(const wire::HeaderFields& h, Tick now, SenderSink& sink) {
  EpochCheck ec = receiver_.observe_epoch(h.epoch);
  if (ec == EpochCheck::kStale) return RxResult::of(RxVerdict::kStaleEpoch, false, false);
  if (ec == EpochCheck::kNewer) {
    if (!incarnation_gone(h, now)) {
      ++challenged_;  // nothing of it is believed, its ACK part neither
      return RxResult::of(RxVerdict::kChallenged, false, false);
    }
    restart_as(h.epoch, now, sink);
  }
  RxVerdict verdict = RxVerdict::kAckOnly;
  bool complete = false;
  if (h.type == wire::PacketType::kAck) {
    // A probe asks for an answer: from a peer that does not know us yet, a
    // persist probe, or a timer's probe carrying a token to echo (never one
    // in an answer, whose offset is an echo itself).
    if ((h.flags & wf::kAckRequest) != 0) {
      owe_epoch_ = true;
      if ((h.flags & wf::kAnswer) == 0 && h.offset != 0) answer_token_ = h.offset;
    }
  } else {
    // Its own epoch check now says kCurrent. Fields read one by one, as
    // RxResult::of() explains.
    const RxResult d = receiver_.on_data(h, now);
    verdict = d.verdict;
    complete = d.message_complete;
  }
  if (ec == EpochCheck::kAdopted) {
    // First word from the peer: key our stream to it (nothing was sent yet)
    // and make sure it hears our epoch even if we have no data for it.
    sender_.rebase(stream_origin());
    owe_epoch_ = true;
    connect_deadline_ = 0;
  }
  if ((h.flags & wf::kAckValid) != 0) {
    const bool was_persisting = persisting();
    sender_.on_ack(h.ack, h.sack, now, sink, h.credit, (h.flags & wf::kDuplicate) != 0);
    // Stopped by this ACK's credit: the first probe waits one RTO for the
    // window update the receiver sends by itself.
    if (!was_persisting && persisting()) next_persist_ = now + sender_.rto();
  }
  // After its ACK part: the answer's ACK is what the peer had at the probe.
  if (h.type == wire::PacketType::kAck && (h.flags & wf::kAnswer) != 0) {
    if (challenge_epoch_ != 0 && h.offset == challenge_token_) {
      // The incarnation we know is alive: the newer epoch was no restart.
      ++challenge_answers_;
      clear_challenge();
    } else {
      sender_.on_answer(h.offset, now, sink);
    }
  }
  return RxResult::of(verdict, complete, ec == EpochCheck::kNewer);
}

bool Peer::on_timer(Tick now, SenderSink& sink) {
  sender_.on_timer(now, sink);
  if (connect_deadline_ != 0 && !peer_known() && now >= connect_deadline_) connect_failed_ = true;
  if (challenge_epoch_ == 0 || !old_gone(now)) return false;
  if (proven_epoch_ == 0) {
    // Nothing at the peer's address answered for a newer epoch: forged (or
    // every answer lost). Forget it at the timeout; its next packet asks again.
    if (now >= challenge_deadline_) clear_challenge();
    return false;
  }
  // The known incarnation is gone and the newer one answered: it is the
  // peer from now on (it learns our epoch from the pure ACK this makes due).
  restart_as(proven_epoch_, now, sink);
  return true;
}

Tick Peer::next_deadline() const {
  const Tick challenge =
      challenge_epoch_ != 0 ? std::max<Tick>(std::min(next_challenge_, challenge_deadline_), 1) : 0;
  if (dead()) return challenge;  // a newer incarnation may still be shown real
  // 0 means "nothing armed" in every source.
  const auto earliest = [](Tick a, Tick b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); };
  if (!peer_known()) return earliest(next_probe_ == 0 ? 1 : next_probe_, connect_deadline_);
  const Tick owed = owe_epoch_ || answer_token_ != 0 || sender_.probe_due() ? 1 : 0;
  const Tick persist = persisting() ? std::max<Tick>(next_persist_, 1) : 0;
  return earliest(
      earliest(earliest(earliest(sender_.next_deadline(), receiver_.ack_deadline()), owed),
               persist),
      challenge);
}

void Peer::reincarnate(uint32_t new_local_epoch, Tick now, SenderSink& sink) {
  if (!epoch_newer(checked_epoch(new_local_epoch), local_epoch_)) {
    throw std::invalid_argument("transport: reincarnate needs an epoch newer than the current one");
  }
  local_epoch_ = new_local_epoch;
  receiver_.reincarnate(local_epoch_);
  restart_stream(now, FailReason::kReset, sink);
  connect_failed_ = false;
}

}  // namespace mercury::transport
