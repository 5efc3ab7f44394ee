// PeerSender: the send half of a peer. See transport.h and docs/transport.md.
#include <algorithm>
#include <bit>
#include <cassert>

#include "transport/transport.h"

namespace mercury::transport {

namespace wf = wire::flags;

PeerSender::PeerSender(const Params& params, uint32_t initial_seq, Tick now)
    : p_(params),
      ring_(std::bit_ceil(std::max(params.window, 1u))),
      mask_(static_cast<uint32_t>(ring_.size()) - 1),
      window_(params.window),
      una_(initial_seq),
      nxt_(initial_seq),
      credit_edge_(initial_seq + params.window),
      cwnd_(params.window),
      reorder_threshold_(params.reorder_threshold),
      rto_(params.initial_rto),
      progress_at_(now) {
  counters_.rto = rto_;
  counters_.cwnd = cwnd_;
  counters_.reorder_threshold = reorder_threshold_;
  counters_.credit = window_;
}

bool PeerSender::can_send() const {
  return !dead_ && outstanding() < window_ && in_flight_ < cwnd_ &&
         seq_diff(nxt_, credit_edge_) < 0;
}

bool PeerSender::can_resend() const { return !dead_ && in_flight_ < cwnd_; }

Tick PeerSender::rto() const {
  // Exponential back-off, saturating at max_rto.
  if (backoff_ >= 63 || (rto_ << backoff_) >> backoff_ != rto_) return p_.max_rto;
  return std::min(rto_ << backoff_, p_.max_rto);
}

Tick PeerSender::probe_timeout(uint8_t transmissions) const {
  // max(2 SRTT, SRTT + 4 RTTVAR) plus the receiver's ACK delay (the hole's
  // resend is acknowledged at once, but a delayed ACK may carry it): the RTO
  // formula without its 1 ms floor, so a jittery RTT does not probe
  // spuriously. Doubling with every probe of the same packet, never beyond
  // the RTO: a dead peer is probed on the RTO's schedule.
  const Tick base = std::max(2 * srtt_, srtt_ + 4 * rttvar_) + p_.ack_delay;
  const unsigned shift = std::min<unsigned>(transmissions > 2 ? transmissions - 2 : 0, 20);
  return std::min(base << shift, rto());
}

Tick PeerSender::probe_deadline() const {
  if (dead_ || !has_rtt_ || una_ == nxt_) return 0;
  const Entry& e = at(una_);
  // A left edge the timer resent is left to the timer: the silence that
  // fired it (a peer off its CPU) may not be over, and a probe after a few
  // RTTs would resend it again for nothing.
  if (e.state != State::kInFlight || e.transmissions < 2 || e.loss_kind == LossKind::kTimeout)
    return 0;
  return e.sent_at + probe_timeout(e.transmissions);
}

Tick PeerSender::next_deadline() const {
  if (dead_) return 0;
  Tick d = probe_deadline();
  if (timer_armed_) d = d == 0 ? rto_deadline_ : std::min(d, rto_deadline_);
  if (outstanding() != 0) {
    const Tick live = progress_at_ + p_.peer_timeout;
    d = d == 0 ? live : std::min(d, live);
  }
  return d;
}

void PeerSender::arm_timer(Tick now) {
  if (!timer_armed_) {
    timer_armed_ = true;
    rto_deadline_ = now + rto();
  }
}

TxStamp PeerSender::on_send(const SliceRef& slice, Tick now) {
  assert(can_send());
  if (outstanding() == 0) progress_at_ = now;  // the liveness clock starts with data out
  const uint32_t seq = nxt_++;
  Entry& e = at(seq);
  e.slice = slice;
  e.sent_at = now;
  e.tx_order = next_tx_order_++;
  e.state = State::kInFlight;
  e.transmissions = 1;
  ++in_flight_;
  ++counters_.packets_sent;
  arm_timer(now);
  // The sender will stall until an ACK opens the window: ask for it now
  // rather than after the receiver's ack delay.
  const uint16_t flags = can_send() ? 0 : wf::kAckRequest;
  return {seq, flags};
}

Resend PeerSender::on_resend(uint32_t seq, Tick now, SliceRef& slice, TxStamp& stamp) {
  if (!in_range(seq) || at(seq).state != State::kLost) {
    ++counters_.resends_skipped;
    return Resend::kNotNeeded;
  }
  // The left edge is exempt from cwnd (see left_edge_lost): packets beyond
  // the SACK horizon can hold cwnd full for ever while it waits. So are the
  // few the timer declares lost (at most reorder_threshold per expiry): the
  // packets it left in flight hold the pipe until these resends show them
  // lost.
  Entry& e = at(seq);
  if (!can_resend() && (dead_ || (seq != una_ && e.loss_kind != LossKind::kTimeout))) {
    return Resend::kNoRoom;
  }
  e.state = State::kInFlight;
  e.sent_at = now;
  e.tx_order = next_tx_order_++;
  if (e.transmissions < UINT8_MAX) ++e.transmissions;
  --lost_;
  ++in_flight_;
  if (e.loss_kind == LossKind::kFast) {
    ++counters_.retransmits_fast;
    // A duplicate report could now be this resend's (reordering, not loss):
    // it no longer tells anything of the expiry.
    timeout_unverified_ = false;
  } else {
    ++counters_.retransmits_timeout;  // the timer's: RTO or tail probe
  }
  arm_timer(now);
  slice = e.slice;
  stamp = {seq, static_cast<uint16_t>(wf::kRetransmit | (can_resend() ? 0 : wf::kAckRequest))};
  return Resend::kSend;
}

bool PeerSender::left_edge_lost(uint32_t& seq) const {
  if (dead_ || lost_ == 0 || una_ == nxt_ || at(una_).state != State::kLost) return false;
  seq = una_;
  return true;
}

bool PeerSender::find_lost(uint64_t msg_token, uint32_t offset, uint32_t& seq) const {
  uint32_t seen = 0;
  for (uint32_t s = una_; s != nxt_ && seen < lost_; ++s) {
    const Entry& e = at(s);
    if (e.state != State::kLost) continue;
    ++seen;
    if (e.slice.msg_token == msg_token && e.slice.offset == offset) {
      seq = s;
      return true;
    }
  }
  return false;
}

void PeerSender::note_delivered_order(uint64_t tx_order) {
  // The highest delivered transmission orders, descending, in a ring whose
  // head is the highest. Deliveries come mostly in increasing order: a new
  // highest takes the slot before the head (dropping the lowest) in O(1);
  // only a late one is shifted into place.
  constexpr uint32_t kMask = kMaxReorderThreshold - 1;
  auto& t = delivered_top_;
  const auto at = [&](uint32_t k) -> uint64_t& { return t[(top_head_ + k) & kMask]; };
  if (tx_order <= at(kMask)) return;
  if (tx_order > at(0)) {
    top_head_ = (top_head_ - 1) & kMask;
    at(0) = tx_order;
    return;
  }
  uint32_t k = kMask;
  while (k > 0 && at(k - 1) < tx_order) {
    at(k) = at(k - 1);
    --k;
  }
  at(k) = tx_order;
}

void PeerSender::deliver(Entry& e, Tick now, SenderSink& sink, RttCandidate& rtt) {
  if (e.state == State::kInFlight) {
    --in_flight_;
  } else if (e.state == State::kLost) {
    // Declared lost but delivered before the glue resent it: the resend is
    // skipped (on_resend says no), and the reordering was deeper than the
    // threshold, so raise it (RFC 8985 adapts its reordering window alike).
    --lost_;
    ++counters_.false_losses;
    if (e.loss_kind == LossKind::kFast && reorder_threshold_ < p_.max_reorder_threshold) {
      ++reorder_threshold_;
      counters_.reorder_threshold = reorder_threshold_;
    }
  }
  if (e.transmissions == 1) {
    // Karn: only a packet sent once gives an unambiguous RTT sample. Take the
    // most recently sent one: it had the least queueing behind the ack delay.
    if (!rtt.valid || e.sent_at > rtt.sent_at) rtt = {true, e.sent_at};
    note_delivered_order(e.tx_order);
  } else if (has_rtt_ && now - e.sent_at >= counters_.min_rtt) {
    // A retransmitted packet acked at least one minimum RTT after its resend
    // was plausibly delivered by that resend: it may then witness losses of
    // packets sent before it (a RACK-style rule). Acked sooner, the original
    // must have arrived, and its order says nothing about later sends.
    note_delivered_order(e.tx_order);
  }
  e.state = State::kSacked;
  ++counters_.slices_acked;
  sink.on_acked(e.slice);
}

void PeerSender::on_spurious_timeout() {
  // The expiry was a slow peer (off its CPU, say), not a loss: undo its
  // response, as RFC 4015's Eifel response does, the congestion window it
  // halved and the back-off it doubled.
  timeout_unverified_ = false;
  ++counters_.spurious_timeouts;
  cwnd_ = std::max(cwnd_, timeout_cwnd_);
  counters_.cwnd = cwnd_;
  backoff_ = 0;
  counters_.backoff = 0;
}

void PeerSender::rtt_sample(Tick r) {
  // RFC 6298 section 2, in ticks: alpha = 1/8, beta = 1/4, K = 4, and the
  // clock granularity G is one tick.
  if (!has_rtt_) {
    srtt_ = r;
    rttvar_ = r / 2;
    has_rtt_ = true;
    counters_.min_rtt = r;
  } else {
    const Tick delta = srtt_ > r ? srtt_ - r : r - srtt_;
    rttvar_ = (3 * rttvar_ + delta) / 4;
    srtt_ = (7 * srtt_ + r) / 8;
    counters_.min_rtt = std::min(counters_.min_rtt, r);
  }
  rto_ = std::clamp(srtt_ + std::max<Tick>(1, 4 * rttvar_), p_.min_rto, p_.max_rto);
  backoff_ = 0;  // Karn: a fresh sample from a packet sent once ends the back-off
  ++counters_.rtt_samples;
  counters_.srtt = srtt_;
  counters_.rttvar = rttvar_;
  counters_.rto = rto_;
  counters_.backoff = 0;
}

void PeerSender::on_losses(uint32_t lost, LossKind kind) {
  // A loss episode lasts until the cumulative ACK passes what had been sent
  // when it began (about one RTT). Within it, cwnd shrinks by one packet per
  // packet lost, down to half its value at the start of the episode: a
  // congested queue drops in proportion to the overload, so the decrease
  // does too (as DCTCP scales its cut by the fraction marked), while a
  // random loss costs one packet, which additive increase gives back within
  // the RTT (at loss rate p, cwnd settles near 1/p instead of AIMD's
  // 1.22/sqrt(p)). A timeout is the strong signal: half at once.
  if (!in_recovery_) {
    in_recovery_ = true;
    recovery_end_ = nxt_;
    episode_cwnd_ = cwnd_;
    cwnd_acked_ = 0;
    ++counters_.loss_episodes;
  }
  const uint32_t half = std::max(p_.cwnd_floor, episode_cwnd_ / 2);
  if (kind == LossKind::kTimeout) {
    cwnd_ = std::min(cwnd_, half);
  } else {
    cwnd_ = std::max(half, cwnd_ > lost ? cwnd_ - lost : 0u);
  }
  cwnd_ = std::max(cwnd_, p_.cwnd_floor);
  counters_.cwnd = cwnd_;
}

void PeerSender::mark_lost(uint32_t seq, Entry& e, LossKind kind, SenderSink& sink) {
  e.state = State::kLost;
  e.loss_kind = kind;
  --in_flight_;
  ++lost_;
  if (kind == LossKind::kFast) {
    ++counters_.losses_fast;
  } else if (kind == LossKind::kTimeout || kind == LossKind::kAnswered) {
    ++counters_.losses_timeout;
  } else {
    ++counters_.tail_probes;
  }
  sink.on_lost(seq, e.slice, kind);
}

uint32_t PeerSender::detect_losses(SenderSink& sink) {
  // A packet in flight is lost once reorder_threshold transmissions made
  // after its own were delivered, i.e. its tx_order is below the k-th
  // highest delivered order. Counting transmissions (not sequence numbers)
  // means a resent packet is judged only by packets sent after the resend.
  const uint64_t threshold =
      delivered_top_[(top_head_ + reorder_threshold_ - 1) & (kMaxReorderThreshold - 1)];
  if (threshold == 0) return 0;
  uint32_t n = 0;
  for (uint32_t s = una_; s != nxt_; ++s) {
    Entry& e = at(s);
    if (e.tx_order >= threshold) {
      // A packet sent once bounds the scan: every higher seq was first sent
      // after it, so its last transmission is later still.
      if (e.transmissions == 1) break;
      continue;
    }
    if (e.state == State::kInFlight) {
      mark_lost(s, e, LossKind::kFast, sink);
      ++n;
    }
  }
  return n;
}

AckResult PeerSender::on_ack(uint32_t cum_ack, uint64_t sack, Tick now, SenderSink& sink,
                             uint32_t credit, bool duplicate) {
  AckResult r;
  if (dead_) {
    r.ignored = true;
    return r;
  }
  ++counters_.acks_received;
  if (seq_diff(cum_ack, nxt_) > 0) {
    // Acknowledges something never sent: a corrupt or foreign ACK.
    ++counters_.acks_invalid;
    r.ignored = true;
    return r;
  }
  RttCandidate rtt;
  const uint64_t acked_before = counters_.slices_acked;
  if (seq_diff(cum_ack, una_) > 0) {
    for (; una_ != cum_ack; ++una_) {
      Entry& e = at(una_);
      if (e.state != State::kSacked) deliver(e, now, sink, rtt);
      e.state = State::kFree;
    }
  } else if (seq_diff(cum_ack, una_) < 0) {
    ++counters_.acks_old;  // reordered ACK: its SACK bits are still true
  }
  if (seq_diff(cum_ack, una_) >= 0) {
    // The newest ACK's credit rules (a reordered older one's is out of date).
    // It may shrink the room: what was sent beyond stays sent.
    const uint32_t room = credit == kNoCredit ? window_ : std::min(credit, window_);
    credit_edge_ = cum_ack + room;
    counters_.credit = room;
  }
  for (uint64_t bits = sack; bits != 0; bits &= bits - 1) {
    const uint32_t s = cum_ack + 1 + static_cast<uint32_t>(std::countr_zero(bits));
    if (seq_diff(s, nxt_) >= 0) break;
    if (seq_diff(s, una_) < 0) continue;
    Entry& e = at(s);
    if (e.state == State::kInFlight || e.state == State::kLost) {
      deliver(e, now, sink, rtt);
    }
  }
  if (timeout_unverified_) {
    // The receiver got a resend of a packet it had. After an expiry, that
    // resend was the timer's: the report comes with the ACK of the
    // originals or soon after it (the resends arrive behind them). Once
    // every packet the expiry declared lost is acked, a report has one RTO
    // to come; after that the expiry counts as a real loss.
    if (duplicate) {
      on_spurious_timeout();
    } else if (verify_by_ == 0) {
      if (seq_diff(una_, timeout_until_) >= 0) verify_by_ = now + timeout_rto_;
    } else if (now > verify_by_) {
      timeout_unverified_ = false;
    }
  }
  r.newly_acked = static_cast<uint32_t>(counters_.slices_acked - acked_before);
  if (rtt.valid && now >= rtt.sent_at) {
    rtt_sample(now - rtt.sent_at);
    r.rtt_sampled = true;
  }
  if (in_recovery_ && seq_diff(una_, recovery_end_) >= 0) in_recovery_ = false;
  if (r.newly_acked != 0) {
    progress_at_ = now;
    if (cwnd_ < window_) {
      // Additive increase: one packet per window's worth of deliveries, in
      // an episode too (its decrease is per packet lost, see on_losses).
      cwnd_acked_ += r.newly_acked;
      while (cwnd_acked_ >= cwnd_ && cwnd_ < window_) {
        cwnd_acked_ -= cwnd_;
        ++cwnd_;
      }
      counters_.cwnd = cwnd_;
    }
    // RFC 6298 (5.3): restart the timer when new data is acknowledged.
    timer_armed_ = false;
    if (in_flight_ != 0) arm_timer(now);
    // Only a delivery can make an older transmission lost.
    r.newly_lost = detect_losses(sink);
    if (r.newly_lost != 0) on_losses(r.newly_lost, LossKind::kFast);
  }
  return r;
}

uint32_t PeerSender::on_probe_sent(Tick /*now*/) {
  probe_due_ = false;
  // 0 means "no token" on the wire; tokens with kChallengeToken are the Peer's.
  if (++last_token_ >= kChallengeToken) last_token_ = 1;
  probe_token_ = last_token_;
  probe_order_ = next_tx_order_;  // every later transmission orders after the probe
  return probe_token_;
}

void PeerSender::on_answer(uint32_t token, Tick now, SenderSink& sink) {
  if (dead_ || token == 0 || token != probe_token_) return;
  probe_token_ = 0;
  ++counters_.probe_answers;
  // The peer is alive and reachable: the back-off the expiry began ends.
  backoff_ = 0;
  counters_.backoff = 0;
  // The peer read the probe after every packet sent before it (the path
  // keeps order, short of the link's reordering), so its answer's ACK
  // (on_ack has taken it) covers each of them it received, as far as an ACK
  // reaches: the cumulative ack and the 64 sequence numbers its SACK
  // reports. Packets further on stay in flight; the left edge's resend
  // moves the horizon, and the timer covers the rest.
  uint32_t n = 0;
  const uint32_t horizon = seq_diff(nxt_, una_) > 65 ? una_ + 65 : nxt_;
  for (uint32_t s = una_; s != horizon; ++s) {
    Entry& e = at(s);
    if (e.state == State::kInFlight && e.tx_order < probe_order_) {
      mark_lost(s, e, LossKind::kAnswered, sink);
      ++n;
    }
  }
  if (n != 0) on_losses(n, LossKind::kAnswered);
  // The timer ran from the expiry; the resends re-arm it from now.
  timer_armed_ = false;
  if (in_flight_ != 0) arm_timer(now);
}

void PeerSender::fail_all(FailReason why, SenderSink& sink) {
  for (uint32_t s = una_; s != nxt_; ++s) {
    Entry& e = at(s);
    if (e.state == State::kInFlight || e.state == State::kLost) {
      ++counters_.slices_failed;
      sink.on_failed(e.slice, why);
    }
    e.state = State::kFree;
  }
  una_ = nxt_;
  in_flight_ = 0;
  lost_ = 0;
  timer_armed_ = false;
  probe_due_ = false;
  probe_token_ = 0;
}

void PeerSender::on_timer(Tick now, SenderSink& sink) {
  if (dead_) return;
  if (outstanding() != 0 && now >= progress_at_ && now - progress_at_ >= p_.peer_timeout) {
    // Nothing delivered for peer_timeout while data was out: stop retrying
    // and fail everything, so no message waits forever on a dead peer.
    dead_ = true;
    ++counters_.peer_timeouts;
    fail_all(FailReason::kPeerTimeout, sink);
    return;
  }
  // Tail probe. The left edge was resent (left_edge_lost) and nothing shows
  // whether that resend arrived: the loss rule needs later transmissions to
  // be delivered, and a window-blocked peer sends none. Declare it lost
  // again after the probe timeout, so the glue resends it well before the
  // RTO (1 ms and more against RTTs of tens of microseconds). Not a
  // congestion signal: one packet per probe timeout, backing off.
  if (const Tick probe = probe_deadline(); probe != 0 && now >= probe) {
    mark_lost(una_, at(una_), LossKind::kProbe, sink);
  }
  if (!timer_armed_ || now < rto_deadline_) return;
  const Tick rto_now = rto();
  // The first expiry of a silence asks before it resends: a peer off its CPU
  // for longer than the RTO (10-25 ms seen on a shared VM) has every packet
  // and will acknowledge them all when it reads the probe behind them, while
  // a packet really lost shows in the answer one RTT later. An expiry with
  // the probe unanswered for the backed-off RTO (or none) resends instead,
  // and a late answer to that probe is ignored.
  const bool ask = p_.rto_probe && !probe_due_ && probe_token_ == 0;
  if (!ask) {
    probe_due_ = false;
    probe_token_ = 0;
  }
  timer_armed_ = false;
  Tick oldest = 0;
  bool any = false;
  for (uint32_t s = una_; s != nxt_; ++s) {
    const Entry& e = at(s);
    if (e.state == State::kInFlight && (!any || e.sent_at < oldest)) {
      oldest = e.sent_at;
      any = true;
    }
  }
  if (!any) return;
  if (now - oldest < rto_now) {
    // Nothing has been in flight for a whole RTO: wait for the oldest.
    timer_armed_ = true;
    rto_deadline_ = oldest + rto_now;
    return;
  }
  if (ask) {
    // Nothing is declared lost yet; the RTO backs off, so an unanswered
    // probe leaves the peer twice as long before the resends below.
    probe_due_ = true;
    ++counters_.rto_probes;
    if (rto() < p_.max_rto) ++backoff_;
    counters_.backoff = backoff_;
    arm_timer(now);
    return;
  }
  // The oldest packets in flight for a full RTO are presumed lost, at most
  // reorder_threshold of them (RFC 6298 resends only the first; the oldest
  // qualifies, so at least one): once their resends are delivered, the loss
  // rule declares every older transmission still unacknowledged lost, so a
  // burst loss is recovered one RTT after the timer, while an expiry that
  // was only a slow peer costs a few duplicate packets, not a window of them.
  uint32_t n = 0;
  for (uint32_t s = una_; s != nxt_ && n < reorder_threshold_; ++s) {
    Entry& e = at(s);
    if (e.state != State::kInFlight || now - e.sent_at < rto_now) continue;
    mark_lost(s, e, LossKind::kTimeout, sink);
    timeout_until_ = s + 1;
    ++n;
  }
  ++counters_.rto_expirations;
  timeout_cwnd_ = cwnd_;
  timeout_rto_ = rto_now;
  verify_by_ = 0;
  timeout_unverified_ = true;
  if (rto() < p_.max_rto) ++backoff_;
  counters_.backoff = backoff_;
  on_losses(n, LossKind::kTimeout);
  if (in_flight_ != 0) arm_timer(now);
}

void PeerSender::rebase(uint32_t initial_seq) {
  assert(outstanding() == 0 && counters_.packets_sent == 0);
  una_ = nxt_ = initial_seq;
  credit_edge_ = initial_seq + window_;
}

void PeerSender::restart(uint32_t initial_seq, Tick now, FailReason why, SenderSink& sink) {
  fail_all(why, sink);
  una_ = nxt_ = initial_seq;
  credit_edge_ = initial_seq + window_;  // the new incarnation has told us nothing yet
  dead_ = false;
  backoff_ = 0;
  timeout_unverified_ = false;
  cwnd_ = window_;
  cwnd_acked_ = 0;
  in_recovery_ = false;
  delivered_top_.fill(0);
  top_head_ = 0;
  progress_at_ = now;
  ++counters_.restarts;
  counters_.backoff = 0;
  counters_.cwnd = cwnd_;
}

}  // namespace mercury::transport
