// Endpoint, receive side: a burst from the port; per packet its peer (by
// source address), its route (once: route_of), admission (PacketReceiver::
// admit), the Peer's verdict, then placement into the message's buffer or
// delivery to the PacketReceiver; the buffers nobody kept go back to the
// port in one call. See endpoint.h.
#include <algorithm>
#include <cstring>

#include "net/stream_copy.h"
#include "transport/endpoint.h"
#include "transport/peer_state.h"

namespace mercury::transport {

// The helpers of the per-packet path are `inline` (used in this file only):
// the library is built position-independent, where GCC does not inline a
// function that could be interposed.

uint16_t Endpoint::receive_st(Tick now) {
  net::RxPacket* rx = rx_.data();
  net::PacketBuf* release[net::PacketPort::kBurst];
  const uint16_t n = port_.poll_rx_st(rx, net::PacketPort::kBurst, now);
  counters_.rx_packets += n;
  uint16_t kept = 0;
  for (uint16_t i = 0; i < n; ++i) {
    release[i] = rx[i].buf;
    const net::ParsedFrame& f = rx[i].parsed;
    if (f.header.job_id != config_.job_id) {
      // Another job's packet (jobs may share hosts and ports): it must not
      // reach a stream of ours, whatever address it comes from.
      drop(EndpointDrop::kWrongJob);
      continue;
    }
    const uint64_t key = addr_key(f.src_ip, f.src_port);
    const auto it = std::lower_bound(by_addr_.begin(), by_addr_.end(), key);
    if (it == by_addr_.end() || (*it & ~uint64_t{0xffff}) != key) {
      drop(EndpointDrop::kUnknownPeer);
      continue;
    }
    const auto p = static_cast<uint16_t>(*it & 0xffff);
    PeerState& ps = *peers_[p];
    // Nothing of a packet is believed before its MAC is (with a job key).
    if (auth_ != nullptr ? !authentic_st(ps, f) : f.auth != nullptr) {
      if (auth_ == nullptr) drop(EndpointDrop::kAuthUnexpected);
      continue;
    }
    const RxRoute route = route_of(f.header);
    if (route == RxRoute::kPacket && !admitted_st(ps, p, f.header)) {
      // Refused before the transport saw it: only its piggybacked ACK counts
      // (it says nothing about the data and is cumulative, so taking it is
      // always right), without kAckRequest (an answer would acknowledge
      // nothing new).
      wire::HeaderFields ack = f.header;
      ack.type = wire::PacketType::kAck;
      ack.flags =
          static_cast<uint16_t>(ack.flags & ~(wire::flags::kAckRequest | wire::flags::kAnswer));
      ps.peer.on_packet(ack, now, ps);
      ++ps.stats.packets_refused;
      drop(EndpointDrop::kBackpressure);
      continue;
    }
    const RxResult r = ps.peer.on_packet(f.header, now, ps);
    ++counters_.verdicts[static_cast<size_t>(r.verdict)];
    if (r.peer_restarted) peer_restarted_st(ps, p);
    if (r.verdict == RxVerdict::kNew && place_st(ps, p, rx[i], r, route)) {
      release[i] = nullptr;  // the PacketReceiver took it
      ++kept;
    }
  }
  if (kept != 0) {
    // Compact the ones left to release (rare path: a receiver kept some).
    uint16_t m = 0;
    for (uint16_t i = 0; i < n; ++i) {
      if (release[i] != nullptr) release[m++] = release[i];
    }
    if (m > 0) port_.release_st(release, m);
  } else if (n > 0) {
    port_.release_st(release, n);
  }
  return n;
}

inline bool Endpoint::authentic_st(PeerState& ps, const net::ParsedFrame& f) {
  if (f.auth == nullptr) {
    drop(EndpointDrop::kAuthMissing);
    return false;
  }
  // The nonce names the peer we expect (spec.node_id) and us: a packet
  // signed for another pair of nodes does not verify here.
  if (!auth_->verify_st(ps.spec.node_id, config_.sender_id, f.wire_header, f.payload, *f.auth)) {
    drop(EndpointDrop::kAuthBadMac);
    return false;
  }
  // Only an authentic counter moves the window.
  if (!ps.replay.take(f.auth->counter.get())) {
    drop(EndpointDrop::kAuthReplay);
    return false;
  }
  return true;
}

inline Endpoint::RxRoute Endpoint::route_of(const wire::HeaderFields& h) const {
  if (h.type == wire::PacketType::kAck) return RxRoute::kNone;  // nothing to deliver
  if (h.type == wire::PacketType::kPartitionStart) return RxRoute::kPartitionStart;
  const bool control = h.type == wire::PacketType::kControl;
  // A slice has no message to assemble: packets only.
  if ((h.flags & wire::flags::kSlice) != 0)
    return packets_ != nullptr ? RxRoute::kPacket : RxRoute::kNone;
  // Data per packet when there is a PacketReceiver; control messages whole
  // when there is a MessageReceiver.
  if (packets_ != nullptr && (!control || messages_ == nullptr)) return RxRoute::kPacket;
  return messages_ != nullptr ? RxRoute::kMessage : RxRoute::kNone;
}

bool Endpoint::admitted_st(const PeerState& ps, uint16_t p, const wire::HeaderFields& h) {
  // Only what Peer::on_packet would take as new is offered; anything else
  // (another epoch, old, beyond the window or outside a new stream's first
  // window, a known duplicate) keeps its usual handling and acknowledgement.
  // Beyond the 64 seqs of the SACK bitmap the receiver's history is not
  // visible from here: such a packet is offered (see PacketReceiver::admit).
  // A packet of a new incarnation is never refused: its ACK part alone
  // would reset the peer's state without the glue hearing of the restart.
  const PeerReceiver& rx = ps.peer.receiver();
  const bool adopting = rx.peer_epoch() == 0;  // the first word from the peer
  if (h.epoch == 0 || (h.epoch != rx.peer_epoch() && !adopting)) return true;
  // Before the stream's first packet, what PeerReceiver::try_sync takes:
  // the first window from the stream's initial seq.
  const bool synced = rx.synced() && !adopting;
  const uint32_t base =
      synced ? rx.cumulative_ack()
             : initial_seq(h.epoch, ps.peer.local_epoch(), config_.transport.seq_salt);
  const int32_t d = seq_diff(h.seq, base);
  if (d < 0 || static_cast<uint32_t>(d) >= rx_window_) return true;
  if (synced && d >= 1 && d <= 64 && ((rx.sack_bits() >> (d - 1)) & 1) != 0) return true;
  return packets_->admit(p, h);
}

void Endpoint::peer_restarted_st(PeerState& ps, uint16_t p) {
  if (packets_ != nullptr) packets_->on_peer_restarted(p);
  // The transport abandoned every message in progress from the peer. The
  // buffers go back to the application: no non-temporal store of ours may
  // land after it has been told (net/stream_copy.h).
  net::stream_fence();
  ps.rx.for_each([&](PeerState::RxTable::Slot& s) {
    if (s.value != nullptr) {
      messages_->on_message_abandoned(p, static_cast<uint32_t>(s.key), s.value);
      ++counters_.messages_abandoned;
    }
  });
  ps.rx.clear();
}

inline bool Endpoint::place_st(PeerState& ps, uint16_t p, const net::RxPacket& pkt,
                               const RxResult& r, RxRoute route) {
  switch (route) {
    case RxRoute::kPacket:
      return deliver_packet_st(ps, p, pkt);
    case RxRoute::kMessage:
      assemble_st(ps, p, pkt, r.message_complete);
      return false;
    case RxRoute::kPartitionStart:
      ++counters_.partition_starts_received;  // its ack is the answer
      return false;
    case RxRoute::kNone:
      drop(EndpointDrop::kNoReceiver);
      return false;
  }
  return false;
}

inline bool Endpoint::deliver_packet_st(PeerState& ps, uint16_t p, const net::RxPacket& pkt) {
  const wire::HeaderFields& h = pkt.parsed.header;
  ++ps.stats.packets_delivered;
  ps.stats.bytes_received += h.payload_len;
  ++counters_.packets_delivered;
  const bool took = packets_->on_packet(p, h, pkt.parsed.payload, pkt.buf);
  if (took) ++counters_.packets_kept;
  return took;
}

inline void Endpoint::assemble_st(PeerState& ps, uint16_t p, const net::RxPacket& pkt,
                                  bool complete) {
  const wire::HeaderFields& h = pkt.parsed.header;
  MessageReceiver& receiver = *messages_;
  const std::byte* payload = pkt.parsed.payload.data();
  if (complete && h.offset == 0 && h.payload_len == h.msg_len) {
    // The whole message in one packet: no table entry.
    std::byte* buffer = receiver.on_message_begin(p, h);
    if (buffer == nullptr) {
      ++ps.stats.messages_refused;
      drop(EndpointDrop::kRefused);
      return;
    }
    if (h.payload_len != 0) std::memcpy(buffer, payload, h.payload_len);
    ps.stats.bytes_received += h.payload_len;
    ++ps.stats.messages_received;
    ++counters_.messages_received;
    receiver.on_message_complete(p, h, buffer);
    return;
  }
  bool inserted;
  PeerState::RxTable::Slot* slot = ps.rx.find_or_insert(h.msg_id, inserted);
  if (slot == nullptr) {
    drop(EndpointDrop::kRxTableFull);
    return;
  }
  if (inserted) {
    slot->value = receiver.on_message_begin(p, h);
    if (slot->value == nullptr) ++ps.stats.messages_refused;
  }
  std::byte* buffer = slot->value;
  if (buffer != nullptr) {
    // wire::decode checked offset + payload_len <= msg_len (kBadRange), and
    // the transport checks msg_len against the message in progress. A
    // message larger than the caches is written with non-temporal stores
    // (net/stream_copy.h), fenced before its completion.
    net::place_copy(buffer + h.offset, payload, h.payload_len, h.msg_len);
    ps.stats.bytes_received += h.payload_len;
  } else {
    drop(EndpointDrop::kRefused);
  }
  if (complete) {
    ps.rx.erase(slot);
    if (buffer != nullptr) {
      ++ps.stats.messages_received;
      ++counters_.messages_received;
      if (net::streams_into(h.msg_len)) net::stream_fence();
      receiver.on_message_complete(p, h, buffer);
    }
  }
}

}  // namespace mercury::transport
