// Endpoint, transmit side: the TX half of a pass, the one resend path, the
// one requeue fallback, and what happens to sent slices (the SenderSink
// reports). See endpoint.h.
//
// The lost map. The scheduler's Slice has no room for a seq, so while a lost
// packet's slice waits in the scheduler's retransmission queue the endpoint
// keeps its seq here, keyed by (slice token, offset); or marks the slice
// "deferred" when it was carved while its peer's window was full (never
// given to the transport). Entries live exactly while the transport holds
// the packet as lost (or the slice is deferred), so the map is bounded by
// the windows; a slice that comes back without an entry was settled meanwhile
// and is dropped as stale.
#include <algorithm>
#include <cassert>

#include "transport/endpoint.h"
#include "transport/peer_state.h"

namespace mercury::transport {

// The helpers of the per-packet path are `inline` (used in this file only):
// the library is built position-independent, where GCC does not inline a
// function that could be interposed, and a call per packet is what this
// file must not add.

namespace {

SendStatus status_of(FailReason why) {
  switch (why) {
    case FailReason::kPeerTimeout:
      return SendStatus::kPeerTimeout;
    case FailReason::kPeerRestarted:
      return SendStatus::kPeerRestarted;
    case FailReason::kReset:
      return SendStatus::kReset;
  }
  return SendStatus::kReset;
}

}  // namespace

void Endpoint::transmit_st(Tick now) {
  if (!stash_.empty()) retry_stash_st();
  sched_->drain_ingress_st();
  {
    sched::PeerMask dead;
    for (uint16_t p = 0; p < peers_.size(); ++p) {
      if (peers_[p]->peer.dead()) dead.set(p);
    }
    if (dead.any()) drain_dead_st(dead);
  }
  // Keep a few stage slots for pure ACKs after the data.
  const uint32_t room = port_.tx_room();
  const uint32_t budget = std::min<uint32_t>(config_.tx_burst, room > 4 ? room - 4 : 0);
  uint32_t sent = 0;
  sched::PeerMask ready;
  for (uint16_t p = 0; p < peers_.size(); ++p) {
    PeerState& ps = *peers_[p];
    // A peer whose window is full can only move by resending what it lost,
    // whatever the priority of those packets: the oldest hole holds the
    // window shut, and strict priority would otherwise keep a low-priority
    // resend behind urgent new data that cannot be sent either.
    if (ps.resolved && sent < budget) sent += resend_left_edge_st(ps, now);
    if (ps.resolved && !ps.peer.dead() && !ps.peer.can_send() &&
        ps.peer.sender().waiting_resend() > 0) {
      sent += resend_blocked_st(ps, now, budget - std::min(budget, sent));
    }
    if (eligible(ps)) ready.set(p);
  }
  // Carve in bursts (the scheduler picks a level and peer once per run of
  // slices of one message), each peer's share bounded by what it can take:
  // its window and cwnd room, or its cwnd room for resends when the window
  // is full (new data carved then is deferred, see serve_st). A peer that
  // cannot take what was carved for it sits out the rest of the pass.
  sched::PeerMask blocked;
  sched::Slice burst[net::PacketPort::kBurst];
  while (sent < budget && ready.any()) {
    for (uint16_t p = 0; p < peers_.size(); ++p) {
      if (ready.test(p)) room_[p] = send_room(*peers_[p]);
    }
    const size_t n =
        sched_->next_slices_st(ready, max_payload_, burst, budget - sent, room_.data());
    if (n == 0) break;
    for (size_t i = 0; i < n; ++i) {
      if (!serve_st(burst[i], now, sent)) blocked.set(burst[i].msg->peer);
    }
    ready = sched::PeerMask{};
    for (uint16_t p = 0; p < peers_.size(); ++p) {
      if (!blocked.test(p) && eligible(*peers_[p])) ready.set(p);
    }
  }
  stage_frames_st();
  // Pure ACKs (and probes) for peers that no data piggybacked them to.
  send_pure_acks_st(now, false);
}

uint32_t Endpoint::flush_acks_st(Tick now) {
  MERCURY_OWNED(owner_);
  return send_pure_acks_st(now, true);
}

uint32_t Endpoint::send_pure_acks_st(Tick now, bool every_owed) {
  for (auto& ptr : peers_) {
    PeerState& ps = *ptr;
    if (!ps.resolved || port_.tx_room() <= tx_count_) continue;
    // ack_deadline() != 0: something waits for an ACK, due or not.
    if (!ps.peer.ack_due(now) && (!every_owed || ps.peer.receiver().ack_deadline() == 0)) continue;
    wire::HeaderFields& h = next_frame_header_st();
    ps.peer.fill_pure_ack(now, h);
    h.job_id = config_.job_id;
    h.sender_id = config_.sender_id;
    queue_frame_st(ps, nullptr);
  }
  const uint16_t sent = stage_frames_st();
  counters_.tx_pure_acks += sent;
  port_.flush_st(now);
  return sent;
}

inline bool Endpoint::serve_st(const sched::Slice& s, Tick now, uint32_t& sent) {
  sched::Message* msg = s.msg;
  PeerState& ps = *peers_[msg->peer];
  const bool start = is_partition_start(s);
  const uint64_t token = token_of(msg, start);
  if (s.retransmit) {
    LostMap::Slot* e = lost_->find({token, s.offset});
    if (e == nullptr) {
      // Acked or failed while it waited: its bytes are settled already.
      drop(EndpointDrop::kRetransmitStale);
      return true;
    }
    if (!e->value.deferred) {
      switch (resend_st(ps, e->value.seq, e, now)) {
        case Resend::kSend:
          ++sent;
          return true;
        case Resend::kNotNeeded:
          return true;
        case Resend::kNoRoom:
          // Keep the request (and its seq in the map) for after an ACK.
          requeue_or_stash_st(s);
          ++counters_.resends_no_room;
          return false;
      }
    }
    lost_->erase(e);  // deferred: never sent, so it goes as new data
  }
  Record& rec = record(msg);
  // The stream towards a peer restarts when the peer comes back with a new
  // epoch; a message begun on an earlier stream cannot be finished on this
  // one (its first part went to the old incarnation), even if none of its
  // packets were pending when the restart happened.
  const uint32_t stream = static_cast<uint32_t>(ps.peer.sender().counters().restarts);
  if (rec.status == SendStatus::kDelivered && rec.started && rec.stream != stream) {
    rec.status = SendStatus::kPeerRestarted;
  }
  if (rec.status != SendStatus::kDelivered) {
    // Never sent: the message already failed, and its remaining bytes would
    // be an orphan at the peer.
    account_failed(msg, start, s.len, rec.status);
    return true;
  }
  if (!ps.peer.can_send()) {
    // Picked for a resend's sake while the window is full: hand the slice
    // back, marked as never sent, and skip the peer for this pass.
    lost_->put({token, s.offset}, {0, true});
    requeue_or_stash_st(s);
    ++counters_.deferred;
    return false;
  }
  rec.started = true;
  rec.stream = stream;
  wire::HeaderFields& h = next_frame_header_st();
  fill_header(*msg, start, s.offset, s.len, h);
  ps.peer.send(SliceRef{token, s.offset, s.len, msg->priority}, now, h);
  queue_frame_st(ps, start ? nullptr : msg->data + s.offset);
  ++counters_.tx_data;
  ++sent;
  return true;
}

Resend Endpoint::resend_st(PeerState& ps, uint32_t seq, LostMap::Slot* entry, Tick now) {
  SliceRef ref;
  wire::HeaderFields& h = next_frame_header_st();
  const Resend r = ps.peer.resend(seq, now, ref, h);
  if (r == Resend::kNoRoom) return r;
  if (entry == nullptr && r == Resend::kSend) {
    entry = lost_->find({ref.msg_token, ref.offset});
    if (entry != nullptr && entry->value.seq != seq) entry = nullptr;
  }
  // Its slice may still wait in the scheduler; with the map entry gone it is
  // dropped as stale when it comes up.
  if (entry != nullptr) lost_->erase(entry);
  if (r == Resend::kNotNeeded) {
    ++counters_.resends_not_needed;
    return r;
  }
  sched::Message* msg = message_of(ref.msg_token);
  fill_header(*msg, is_partition_start(ref.msg_token), ref.offset, ref.len, h);
  queue_frame_st(ps, msg->data + ref.offset);
  ++counters_.tx_retransmits;
  return r;
}

uint32_t Endpoint::resend_left_edge_st(PeerState& ps, Tick now) {
  // The oldest unacknowledged packet, once lost, goes out now, whatever its
  // priority and cwnd (PeerSender::left_edge_lost): packets beyond the SACK
  // horizon can keep cwnd full until it arrives, and higher-priority resends
  // would otherwise always come first.
  uint32_t seq;
  if (!ps.peer.sender().left_edge_lost(seq)) return 0;
  if (resend_st(ps, seq, nullptr, now) != Resend::kSend) return 0;
  ++counters_.resends_left_edge;
  return 1;
}

uint32_t Endpoint::resend_blocked_st(PeerState& ps, Tick now, uint32_t budget) {
  uint32_t sent = 0;
  PeerState::LostHint hint;
  while (sent < budget && !ps.peer.can_send() && ps.peer.can_resend() &&
         ps.peer.sender().waiting_resend() > 0 && ps.pop_hint(hint)) {
    LostMap::Slot* e = lost_->find({hint.token, hint.offset});
    if (e == nullptr || e->value.deferred || e->value.seq != hint.seq) continue;  // stale hint
    switch (resend_st(ps, hint.seq, e, now)) {
      case Resend::kSend:
        ++counters_.resends_window_blocked;
        ++sent;
        break;
      case Resend::kNotNeeded:
        break;
      case Resend::kNoRoom:
        ps.push_hint(hint);
        return sent;
    }
  }
  return sent;
}

void Endpoint::drain_dead_st(const sched::PeerMask& dead) {
  // Whole messages at once (max_payload unbounded): nothing is sent, the
  // bytes only have to be settled, and this needs no TX room, so a peer that
  // died with the port's queue full still fails everything at once.
  sched::Slice s;
  while (sched_->next_slice_st(dead, UINT32_MAX, s)) {
    sched::Message* msg = s.msg;
    PeerState& ps = *peers_[msg->peer];
    const bool start = is_partition_start(s);
    if (s.retransmit) {
      LostMap::Slot* e = lost_->find({token_of(msg, start), s.offset});
      if (e == nullptr || !e->value.deferred) {
        // Settled already: the Peer failed every packet it held when it died
        // (and with it every map entry but the deferred ones).
        if (e != nullptr) lost_->erase(e);
        drop(EndpointDrop::kRetransmitStale);
        continue;
      }
      lost_->erase(e);
    }
    account_failed(msg, start, s.len, ps.death());
  }
}

inline void Endpoint::requeue_or_stash_st(const sched::Slice& s) {
  if (sched_->requeue_st(s)) return;
  stash_.push_back(s);  // reserved at set-up: never reallocates
  ++counters_.requeue_stashed;
}

void Endpoint::retry_stash_st() {
  size_t kept = 0;
  for (size_t i = 0; i < stash_.size(); ++i) {
    const sched::Slice s = stash_[i];
    const bool start = is_partition_start(s);
    LostMap::Slot* e = lost_->find({token_of(s.msg, start), s.offset});
    if (e == nullptr) {
      // Settled while it waited here (acked, or failed with its peer): its
      // message may even be complete and its descriptor reused, so it must
      // not reach the scheduler.
      drop(EndpointDrop::kRetransmitStale);
      continue;
    }
    PeerState& ps = *peers_[s.msg->peer];
    if (e->value.deferred && ps.peer.dead()) {
      lost_->erase(e);
      account_failed(s.msg, start, s.len, ps.death());
      continue;
    }
    if (!sched_->requeue_st(s)) stash_[kept++] = s;
  }
  stash_.resize(kept);
}

inline bool Endpoint::eligible(const PeerState& ps) const {
  // A dead peer's queue is drained by drain_dead_st, never sent.
  if (ps.peer.dead() || !ps.resolved) return false;
  return ps.peer.can_send() || (ps.peer.sender().waiting_resend() > 0 && ps.peer.can_resend());
}

inline uint32_t Endpoint::send_room(const PeerState& ps) const {
  const PeerSender& snd = ps.peer.sender();
  const uint32_t cwnd_room = snd.cwnd() > snd.in_flight() ? snd.cwnd() - snd.in_flight() : 0;
  if (ps.peer.can_send()) return std::min(snd.window() - snd.outstanding(), cwnd_room);
  return snd.waiting_resend() > 0 ? cwnd_room : 0;
}

inline void Endpoint::fill_header(const sched::Message& msg, bool start, uint32_t offset,
                                  uint32_t len, wire::HeaderFields& h) const {
  h.type = start ? wire::PacketType::kPartitionStart : static_cast<wire::PacketType>(msg.type);
  h.job_id = config_.job_id;
  h.sender_id = config_.sender_id;
  h.priority = msg.priority;
  h.dtype = static_cast<wire::Dtype>(msg.dtype);
  h.block_key = msg.block_key;
  h.msg_id = msg.msg_id;
  // A slice's packets are placed in its logical message (send_slice);
  // otherwise base_offset is 0 and logical_len 0.
  const bool slice = !start && msg.logical_len != 0;
  h.msg_len = start ? 0 : (slice ? msg.logical_len : msg.len);
  h.offset = start ? 0 : msg.base_offset + offset;
  // ORed: on a resend the Peer has stamped the transport flags already.
  if (slice) h.flags |= wire::flags::kSlice;
  h.iteration = msg.iteration;
  h.param_version = msg.param_version;
  h.payload_len = static_cast<uint16_t>(start ? 0 : len);
}

inline wire::HeaderFields& Endpoint::next_frame_header_st() {
  // Bounded: data frames stay within the pass's budget (< kStage) and pure
  // ACKs within the port's room.
  assert(tx_count_ < tx_.size());
  wire::HeaderFields& h = tx_[tx_count_].header;
  h = wire::HeaderFields{};
  return h;
}

inline void Endpoint::queue_frame_st(PeerState& ps, const std::byte* payload) {
  net::TxFrame& f = tx_[tx_count_];
  f.route = &ps.route;
  f.payload = payload;
  if (auth_ != nullptr) {
    // The MAC covers the header as it goes on the wire: encode it here once
    // (the port encodes it again into the frame; 64 bytes, a few cycles).
    f.header.flags |= wire::flags::kAuth;
    wire::Header wire_header;
    wire::encode(f.header, wire_header);
    auth_->sign_st(config_.sender_id, ps.spec.node_id, ps.auth_counter++,
                   reinterpret_cast<const std::byte*>(&wire_header),
                   {payload, f.header.payload_len}, f.auth);
  }
  ++tx_count_;
}

inline uint16_t Endpoint::stage_frames_st() {
  if (tx_count_ == 0) return 0;
  const uint16_t staged = port_.stage_burst_st(tx_.data(), tx_count_);
  // The port had no buffer for the others: they count as sent and are
  // recovered like any loss.
  counters_.drops[static_cast<size_t>(EndpointDrop::kStageFailed)] += tx_count_ - staged;
  tx_count_ = 0;
  return staged;
}

void Endpoint::account_failed(sched::Message* msg, bool start, uint32_t len, SendStatus why) {
  Record& rec = record(msg);
  if (rec.status == SendStatus::kDelivered) rec.status = why;
  // The bytes count as settled, so the scheduler completes the message once
  // everything of it is settled; the completion then reports the failure.
  if (start) {
    sched_->partition_ready_st(msg);
  } else {
    sched_->on_acked_st(msg, len);
  }
}

// ---------------------------------------------------------------------------
// SenderSink reports (net core, inside Peer calls), here so that they inline
// into the PeerState overrides below.

inline void Endpoint::acked(const SliceRef& slice) {
  lost_->erase({slice.msg_token, slice.offset});
  sched::Message* msg = message_of(slice.msg_token);
  if (is_partition_start(slice.msg_token)) {
    sched_->partition_ready_st(msg);
  } else {
    sched_->on_acked_st(msg, slice.len);
  }
}

inline void Endpoint::lost(PeerState& ps, uint32_t seq, const SliceRef& slice) {
  lost_->put({slice.msg_token, slice.offset}, {seq, false});
  ps.push_hint({slice.msg_token, slice.offset, seq});
  requeue_or_stash_st(sched::Slice{message_of(slice.msg_token), slice.offset, slice.len, true,
                                   is_partition_start(slice.msg_token)
                                       ? sched::SliceKind::kPartitionStart
                                       : sched::SliceKind::kData});
}

inline void Endpoint::failed(const SliceRef& slice, FailReason why) {
  lost_->erase({slice.msg_token, slice.offset});
  account_failed(message_of(slice.msg_token), is_partition_start(slice.msg_token), slice.len,
                 status_of(why));
}

void Endpoint::PeerState::on_acked(const SliceRef& slice) { endpoint.acked(slice); }
void Endpoint::PeerState::on_lost(uint32_t seq, const SliceRef& slice, LossKind) {
  endpoint.lost(*this, seq, slice);
}
void Endpoint::PeerState::on_failed(const SliceRef& slice, FailReason why) {
  endpoint.failed(slice, why);
}
}  // namespace mercury::transport
