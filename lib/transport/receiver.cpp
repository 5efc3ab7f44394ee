// PeerReceiver: the receive half of a peer. See transport.h and docs/transport.md.
#include <algorithm>
#include <bit>
#include <stdexcept>

#include "transport/transport.h"

namespace mercury::transport {

namespace wf = wire::flags;

namespace {

// Ring of at least 128 bits so the 64-bit SACK window always fits in it.
uint32_t ring_bits(uint32_t rx_window) { return std::bit_ceil(std::max(2 * rx_window, 128u)); }

uint32_t checked_epoch(uint32_t e) {
  if (e == 0) throw std::invalid_argument("transport: local epoch must be non-zero");
  return e;
}

uint32_t checked_rx_messages(const Params& p) {
  if (p.rx_window == 0) throw std::invalid_argument("transport: rx_window must be >= 1");
  if (p.rx_messages == 0) throw std::invalid_argument("transport: rx_messages must be >= 1");
  return p.rx_messages;
}

}  // namespace

PeerReceiver::PeerReceiver(const Params& params, uint32_t local_epoch, uint32_t peer_epoch)
    : p_(params),
      local_epoch_(checked_epoch(local_epoch)),
      peer_epoch_(peer_epoch),
      ring_mask_(ring_bits(params.rx_window) - 1),
      got_(ring_bits(params.rx_window) / 64),
      rtx_(ring_bits(params.rx_window) / 64),
      msgs_(2 * uint64_t{checked_rx_messages(params)}, params.rx_messages),
      credit_(credit_cap()),
      advertised_(credit_) {}

EpochCheck PeerReceiver::observe_epoch(uint32_t epoch) {
  if (epoch == 0) {  // no sender uses it: a corrupt or foreign packet
    ++counters_.stale_epoch;
    return EpochCheck::kStale;
  }
  if (peer_epoch_ == 0) {
    peer_epoch_ = epoch;
    return EpochCheck::kAdopted;
  }
  if (epoch == peer_epoch_) return EpochCheck::kCurrent;
  if (epoch_newer(epoch, peer_epoch_)) return EpochCheck::kNewer;
  ++counters_.stale_epoch;
  return EpochCheck::kStale;
}

void PeerReceiver::restart(uint32_t epoch) {
  // The peer restarted: its old stream and every message in it are gone.
  counters_.messages_abandoned += msgs_.size();
  reset_messages();
  synced_ = false;
  forget_owed_ack();
  peer_epoch_ = epoch;
  ++counters_.peer_restarts;
}

void PeerReceiver::reset_messages() { msgs_.clear(); }

void PeerReceiver::sync(uint32_t base) {
  rcv_nxt_ = base;
  history_ = 0;
  std::fill(got_.begin(), got_.end(), 0);
  std::fill(rtx_.begin(), rtx_.end(), 0);
  counters_.messages_abandoned += msgs_.size();
  reset_messages();
  synced_ = true;
  forget_owed_ack();
}

void PeerReceiver::reincarnate(uint32_t new_local_epoch) {
  local_epoch_ = checked_epoch(new_local_epoch);
  counters_.messages_abandoned += msgs_.size();
  reset_messages();
  synced_ = false;
  forget_owed_ack();
}

bool PeerReceiver::try_sync(uint32_t seq) {
  // A sender starts its stream towards us at initial_seq(its epoch, our
  // epoch). Accept a packet of that stream's first window (the very first
  // packets may be lost or reordered); anything else is the leftover of a
  // stream meant for an earlier incarnation of us, or of the peer.
  const uint32_t base = initial_seq(peer_epoch_, local_epoch_, p_.seq_salt);
  const int32_t d = seq_diff(seq, base);
  if (d < 0 || static_cast<uint32_t>(d) >= p_.rx_window) return false;
  sync(base);
  return true;
}

uint64_t PeerReceiver::sack_bits() const {
  if (!synced_ || p_.rx_window <= 1) return 0;
  // Bits for seqs rcv_nxt_+1 .. rcv_nxt_+64: a 64-bit window of the ring,
  // possibly straddling two words.
  const uint32_t i = (rcv_nxt_ + 1) & ring_mask_;
  const uint32_t w = i >> 6;
  const uint32_t sh = i & 63;
  uint64_t bits = got_[w] >> sh;
  if (sh != 0) bits |= got_[(w + 1) & (got_.size() - 1)] << (64 - sh);
  // Only seqs inside the receive window are live; beyond it the ring holds
  // history.
  if (p_.rx_window - 1 < 64) bits &= (uint64_t{1} << (p_.rx_window - 1)) - 1;
  return bits;
}

void PeerReceiver::duplicate(const wire::HeaderFields& h, bool history_known) {
  ++counters_.duplicates;
  // The sender may have missed our ACK: repeat it at once.
  ack_now_ = true;
  // One copy original, the other a retransmission: both arrived, so the
  // retransmission was not needed. (Two retransmissions of a lost original
  // are not told apart from a link duplicate, so this undercounts then.)
  const bool rtx = (h.flags & wf::kRetransmit) != 0;
  if (history_known && bit(rtx_, h.seq) != rtx) {
    ++counters_.spurious_retransmits;
    // A resend behind its original (not an original that reordering held
    // back behind its resend): the sender resent too early. The next ACK
    // says so (kDuplicate).
    if (rtx) report_duplicate_ = true;
  }
}

RxResult PeerReceiver::on_data(const wire::HeaderFields& h, Tick now) {
  const EpochCheck ec = observe_epoch(h.epoch);
  // Alone (without a Peer's challenge), a newer epoch is a restart.
  if (ec == EpochCheck::kNewer) restart(h.epoch);
  bool complete = false;
  const RxVerdict v = ec == EpochCheck::kStale ? RxVerdict::kStaleEpoch : accept(h, now, complete);
  return RxResult::of(v, complete, ec == EpochCheck::kNewer);
}

RxVerdict PeerReceiver::accept(const wire::HeaderFields& h, Tick now, bool& message_complete) {
  if (!synced_ && !try_sync(h.seq)) {
    ++counters_.unsynced;
    return RxVerdict::kUnsynced;
  }
  const int32_t d = seq_diff(h.seq, rcv_nxt_);
  if (d >= 0 && static_cast<uint32_t>(d) >= p_.rx_window) {
    ++counters_.out_of_window;
    ack_now_ = true;  // tell the sender where we are
    return RxVerdict::kOutOfWindow;
  }
  if (d < 0) {
    duplicate(h, rcv_nxt_ - h.seq <= history_);
    return RxVerdict::kDuplicate;
  }
  if (bit(got_, h.seq)) {
    duplicate(h, true);
    return RxVerdict::kDuplicate;
  }
  // Count the bytes before marking the packet received: a refusal leaves it
  // unacknowledged, so the sender will offer it again.
  // A slice (wire::flags::kSlice) is one packet of a logical message that
  // the sender submitted in parts which complete in any order: no byte
  // counting (its msg_id would wait for ever and fill the table), so it never
  // completes a message here; the glue delivers it packet by packet.
  const bool slice = (h.flags & wf::kSlice) != 0;
  bool complete = !slice && h.payload_len == h.msg_len;  // the whole message in one packet
  if (!slice && !complete) {
    bool inserted;
    MsgSlot* m = msgs_.find_or_insert(h.msg_id, inserted);
    if (m == nullptr) {
      ++counters_.message_table_full;
      return RxVerdict::kMessageTableFull;
    }
    MsgProgress& p = m->value;
    if (inserted) p.msg_len = h.msg_len;
    if (p.msg_len != h.msg_len || p.received + h.payload_len > h.msg_len) {
      ++counters_.bad_message;
      return RxVerdict::kBadMessage;
    }
    p.received += h.payload_len;
    if (p.received == p.msg_len) {
      complete = true;
      msgs_.erase(m);
    }
  }
  put_bit(got_, h.seq, true);
  put_bit(rtx_, h.seq, (h.flags & wf::kRetransmit) != 0);
  if (d == 0) {
    uint32_t n = 1;
    while (n < p_.rx_window && bit(got_, rcv_nxt_ + n)) ++n;
    // Seqs [rcv_nxt_ + W, rcv_nxt_ + n + W) enter the window; their slots
    // held the oldest history.
    for (uint32_t k = 0; k < n; ++k) {
      put_bit(got_, rcv_nxt_ + p_.rx_window + k, false);
      put_bit(rtx_, rcv_nxt_ + p_.rx_window + k, false);
    }
    rcv_nxt_ += n;
    history_ = std::min(history_ + n, ring_mask_ + 1 - p_.rx_window);
    if (n > 1) ack_now_ = true;  // a hole was filled: the sender is waiting on it
  } else {
    ack_now_ = true;  // a gap: report it at once so the sender can repair it quickly
  }
  if ((h.flags & wf::kAckRequest) != 0) ack_now_ = true;
  if (unacked_++ == 0) ack_deadline_ = now + p_.ack_delay;
  ++counters_.packets_accepted;
  counters_.bytes_accepted += h.payload_len;
  if (slice) ++counters_.slice_packets;
  if (complete) ++counters_.messages_completed;
  message_complete = complete;
  return RxVerdict::kNew;
}

bool PeerReceiver::ack_due(Tick now) const {
  if (!synced_) return false;
  return ack_now_ || unacked_ >= p_.ack_every || (unacked_ != 0 && now >= ack_deadline_);
}

Tick PeerReceiver::ack_deadline() const {
  if (!synced_) return 0;
  if (ack_now_ || unacked_ >= p_.ack_every) return 1;  // due already
  return unacked_ != 0 ? ack_deadline_ : 0;
}

void PeerReceiver::set_credit(uint32_t packets) {
  const uint32_t w = credit_cap();
  credit_ = std::min(packets, w);
  if (synced_ && advertised_ < w / 2 && credit_ >= advertised_ + std::max(w / 4, 1u) && !ack_now_) {
    ack_now_ = true;
    ++counters_.window_updates;
  }
}

bool PeerReceiver::fill_ack(wire::HeaderFields& h) {
  if (!synced_) return false;
  h.flags |= wf::kAckValid;
  if (report_duplicate_) h.flags |= wf::kDuplicate;
  h.ack = rcv_nxt_;
  h.sack = sack_bits();
  h.credit = static_cast<uint16_t>(credit_);
  advertised_ = credit_;
  forget_owed_ack();
  ++counters_.acks_sent;
  return true;
}

}  // namespace mercury::transport
