#include "transport/endpoint.h"

#include <rte_mbuf.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include "net/frame.h"
#include "net/stream_copy.h"

namespace mercury::transport {

namespace {

// A slice's token is its Message's address (64-byte aligned, so the low bits
// are free) with bit 0 set for a partition start-up control: the ack of a
// control calls partition_ready_st, the ack of data on_acked_st.
constexpr uint64_t kControlTag = 1;
uint64_t token_of(const sched::Message* msg, bool control) {
  return reinterpret_cast<uintptr_t>(msg) | (control ? kControlTag : 0);
}
sched::Message* message_of(uint64_t token) {
  return reinterpret_cast<sched::Message*>(static_cast<uintptr_t>(token & ~kControlTag));
}
bool is_control(uint64_t token) { return (token & kControlTag) != 0; }

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

uint32_t pow2_at_least(uint64_t n) {
  return static_cast<uint32_t>(std::bit_ceil(std::max<uint64_t>(n, 2)));
}

uint64_t addr_key(uint32_t ip, uint16_t port) { return uint64_t{ip} << 32 | uint64_t{port} << 16; }

}  // namespace

std::string_view send_status_name(SendStatus s) {
  switch (s) {
    case SendStatus::kDelivered:
      return "delivered";
    case SendStatus::kPeerTimeout:
      return "peer_timeout";
    case SendStatus::kPeerRestarted:
      return "peer_restarted";
    case SendStatus::kReset:
      return "reset";
    case SendStatus::kPeerUnreachable:
      return "peer_unreachable";
  }
  return "?";
}

std::string_view endpoint_drop_name(EndpointDrop d) {
  switch (d) {
    case EndpointDrop::kUnknownPeer:
      return "unknown_peer";
    case EndpointDrop::kRefused:
      return "refused";
    case EndpointDrop::kRxTableFull:
      return "rx_table_full";
    case EndpointDrop::kStageFailed:
      return "stage_failed";
    case EndpointDrop::kRetransmitStale:
      return "retransmit_stale";
    case EndpointDrop::kNoReceiver:
      return "no_receiver";
    case EndpointDrop::kBackpressure:
      return "backpressure";
    case EndpointDrop::kCount:
      break;
  }
  return "?";
}

// ---------------------------------------------------------------------------
// The retransmission map: (slice token, offset) -> the seq of the lost packet
// carrying it, or "deferred" for a slice carved while its peer's window was
// full (never given to the transport). The scheduler's Slice has no room for
// a seq, so the endpoint keeps it here while the slice waits in the
// scheduler's retransmission queue. Entries live exactly while the transport
// holds the packet as lost (or the slice is deferred), so the map is bounded
// by the windows. Open addressing, linear probing, backward-shift deletion.
class Endpoint::LostMap {
 public:
  struct Slot {
    uint64_t token = 0;  // 0: empty (a token is never 0)
    uint32_t offset = 0;
    uint32_t seq = 0;
    bool deferred = false;
  };

  explicit LostMap(uint32_t capacity)
      : slots_(pow2_at_least(2 * uint64_t{capacity})), mask_(slots_.size() - 1) {}

  Slot* find(uint64_t token, uint32_t offset) {
    for (size_t i = home(token, offset);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.token == 0) return nullptr;
      if (s.token == token && s.offset == offset) return &s;
    }
  }
  // False when full (sized so that it never is).
  bool put(uint64_t token, uint32_t offset, uint32_t seq, bool deferred) {
    if (size_ + 1 > (mask_ + 1) / 2 + (mask_ + 1) / 4) return false;
    for (size_t i = home(token, offset);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.token == 0) ++size_;
      if (s.token == 0 || (s.token == token && s.offset == offset)) {
        s = Slot{token, offset, seq, deferred};
        return true;
      }
    }
  }
  void erase(Slot* slot) {
    size_t i = static_cast<size_t>(slot - slots_.data());
    slots_[i].token = 0;
    --size_;
    for (size_t j = (i + 1) & mask_; slots_[j].token != 0; j = (j + 1) & mask_) {
      const size_t k = home(slots_[j].token, slots_[j].offset);
      // Move j back into the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      slots_[j].token = 0;
      i = j;
    }
  }
  void erase(uint64_t token, uint32_t offset) {
    if (Slot* s = find(token, offset)) erase(s);
  }
  size_t size() const { return size_; }

 private:
  size_t home(uint64_t token, uint32_t offset) const {
    const uint64_t h =
        (token >> 6) * 0x9E3779B97F4A7C15ull ^ uint64_t { offset } * 0xC2B2AE3D27D4EB4Full;
    return static_cast<size_t>(h >> 32) & mask_;
  }
  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// Per-peer state: the Peer, its route, its messages in progress (msg_id ->
// destination buffer), its error texts (formatted once, at set-up, so a
// failure on the datapath only hands out a string_view), and its counters.
// It is also the SenderSink of its Peer, so every report knows whose it is.
struct Endpoint::PeerState final : SenderSink {
  struct RxSlot {
    uint32_t msg_id = 0;
    bool used = false;
    std::byte* buffer = nullptr;  // null: refused by the receiver
  };

  PeerState(Endpoint& ep, uint16_t index, const PeerSpec& s, const Config& cfg, Tick now,
            uint32_t rx_messages, uint32_t window)
      : endpoint(ep),
        index(index),
        spec(s),
        peer(cfg, ep.config_.local_epoch, now, s.peer_epoch),
        rx(pow2_at_least(2 * uint64_t{rx_messages})),
        rx_mask(static_cast<uint32_t>(rx.size() - 1)),
        hints(pow2_at_least(2 * uint64_t{window})),
        hint_mask(static_cast<uint32_t>(hints.size() - 1)) {
    const std::string who = "peer " + s.name + " (" + net::ipv4_to_string(s.ip) + ":" +
                            std::to_string(s.udp_port) + ")";
    errors[static_cast<size_t>(SendStatus::kPeerTimeout)] =
        who + " did not acknowledge for " + std::to_string(cfg.peer_timeout_us / 1000) + " ms";
    errors[static_cast<size_t>(SendStatus::kPeerRestarted)] =
        who + " restarted (new epoch): the message was lost with its old state";
    errors[static_cast<size_t>(SendStatus::kReset)] =
        "the stream to " + who + " was reset (new local epoch)";
    errors[static_cast<size_t>(SendStatus::kPeerUnreachable)] =
        who + " did not answer within " + std::to_string(cfg.connect_timeout_us / 1000) + " ms";
  }

  void on_acked(const SliceRef& slice) override { endpoint.acked(*this, slice); }
  void on_lost(uint32_t seq, const SliceRef& slice, LossKind) override {
    endpoint.lost(*this, seq, slice);
  }
  void on_failed(const SliceRef& slice, FailReason why) override {
    endpoint.failed(*this, slice, why);
  }

  // Lost packets in the order they were reported, as hints for the
  // window-blocked path (Endpoint::resend_blocked_st); the LostMap stays the
  // truth, so a stale or overwritten hint costs nothing but a probe.
  struct LostHint {
    uint64_t token;
    uint32_t offset;
    uint32_t seq;
  };
  void push_hint(const LostHint& h) {
    if (hint_count == hints.size()) {  // overwrite the oldest
      hint_head = (hint_head + 1) & hint_mask;
      --hint_count;
    }
    hints[(hint_head + hint_count) & hint_mask] = h;
    ++hint_count;
  }
  bool pop_hint(LostHint& out) {
    if (hint_count == 0) return false;
    out = hints[hint_head];
    hint_head = (hint_head + 1) & hint_mask;
    --hint_count;
    return true;
  }

  SendStatus death() const {
    return peer.sender().dead() ? SendStatus::kPeerTimeout : SendStatus::kPeerUnreachable;
  }

  RxSlot* rx_find(uint32_t msg_id) {
    for (uint32_t i = rx_home(msg_id);; i = (i + 1) & rx_mask) {
      if (!rx[i].used) return nullptr;
      if (rx[i].msg_id == msg_id) return &rx[i];
    }
  }
  RxSlot* rx_add(uint32_t msg_id) {
    if (rx_count + 1 > rx_mask) return nullptr;  // keep one hole: probes end
    for (uint32_t i = rx_home(msg_id);; i = (i + 1) & rx_mask) {
      if (!rx[i].used) {
        rx[i] = RxSlot{msg_id, true, nullptr};
        ++rx_count;
        return &rx[i];
      }
    }
  }
  void rx_erase(RxSlot* slot) {
    uint32_t i = static_cast<uint32_t>(slot - rx.data());
    rx[i].used = false;
    --rx_count;
    for (uint32_t j = (i + 1) & rx_mask; rx[j].used; j = (j + 1) & rx_mask) {
      const uint32_t k = rx_home(rx[j].msg_id);
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      rx[i] = rx[j];
      rx[j].used = false;
      i = j;
    }
  }
  uint32_t rx_home(uint32_t msg_id) const { return (msg_id * 0x9E3779B1u >> 7) & rx_mask; }

  Endpoint& endpoint;
  uint16_t index;
  PeerSpec spec;
  Peer peer;
  net::Route route;
  bool resolved = false;
  std::vector<RxSlot> rx;
  uint32_t rx_mask;
  uint32_t rx_count = 0;
  std::vector<LostHint> hints;
  uint32_t hint_mask;
  uint32_t hint_head = 0;
  uint32_t hint_count = 0;
  std::array<std::string, 5> errors;
  EndpointPeerStats stats;
};

// ---------------------------------------------------------------------------
// Set-up.

Endpoint::Endpoint(net::Interface& iface, const EndpointConfig& config, MessageReceiver& receiver,
                   Tick now)
    : Endpoint(iface, config, Receivers{&receiver, nullptr}, now) {}

Endpoint::Endpoint(net::Interface& iface, const EndpointConfig& config, PacketReceiver& receiver,
                   Tick now)
    : Endpoint(iface, config, Receivers{nullptr, &receiver}, now) {}

Endpoint::Endpoint(net::Interface& iface, const EndpointConfig& config, const Receivers& receivers,
                   Tick now)
    : iface_(iface),
      config_(config),
      messages_(receivers.messages),
      packets_(receivers.packets),
      max_payload_(net::payload_per_packet(iface.port().mtu())) {
  if (messages_ == nullptr && packets_ == nullptr) {
    throw std::invalid_argument("endpoint: needs a MessageReceiver or a PacketReceiver");
  }
  if (config.peers.empty() || config.peers.size() > sched::kMaxPeers) {
    throw std::invalid_argument("endpoint: peers must number 1.." +
                                std::to_string(sched::kMaxPeers));
  }
  if (config.local_epoch == 0)
    throw std::invalid_argument("endpoint: local_epoch must be non-zero");
  if (config.timer_every == 0) throw std::invalid_argument("endpoint: timer_every must be >= 1");
  if (config.tx_burst == 0 || config.tx_burst > net::Interface::kBurst) {
    throw std::invalid_argument("endpoint: tx_burst must be 1.." +
                                std::to_string(net::Interface::kBurst));
  }
  const Params params = resolve(config.transport);  // throws naming the field
  rx_window_ = params.rx_window;
  const auto num_peers = static_cast<uint16_t>(config.peers.size());

  pool_ = std::make_unique<sched::MessagePool>(config.max_messages);
  // Completion records are indexed like the pool's descriptors. The pool
  // keeps them in one array; find its base by taking every descriptor once
  // (control path) and check that they are contiguous.
  {
    std::vector<sched::Message*> all;
    all.reserve(config.max_messages);
    for (uint32_t i = 0; i < config.max_messages; ++i) all.push_back(pool_->alloc());
    if (std::find(all.begin(), all.end(), nullptr) != all.end()) {
      throw std::logic_error("endpoint: the message pool did not yield its capacity");
    }
    base_ = *std::min_element(all.begin(), all.end());
    for (sched::Message* m : all) {
      if (static_cast<uint64_t>(m - base_) >= config.max_messages) {
        throw std::logic_error("endpoint: the message pool's descriptors are not one array");
      }
    }
    for (sched::Message* m : all) pool_->free(m);
  }
  records_.resize(config.max_messages);
  room_.resize(config.peers.size());

  // Retransmission slots: a window of lost packets per peer, plus one
  // deferred slice per (peer, level), plus room for stale slices (resent by
  // the window-blocked path or acked while queued) that leave the queue only
  // when their peer is served again.
  const uint64_t waiting = uint64_t{num_peers} * (4 * params.window + sched::kPriorityLevels);
  sched::SchedulerConfig sc;
  sc.mode = config.mode;
  sc.num_peers = num_peers;
  sc.ingress_capacity = config.ingress_capacity;
  sc.max_retransmits = static_cast<uint32_t>(waiting);
  sc.partition_bytes = config.partition_bytes;
  sc.credit_bytes = config.credit_bytes;
  sched_ = std::make_unique<sched::PortScheduler>(sc, *pool_, &Endpoint::on_complete, this);
  lost_ = std::make_unique<LostMap>(static_cast<uint32_t>(waiting));
  // Validated on every retry, the stash holds at most the live entries of
  // the lost map (at most 3/4 of its 2 x waiting slots): never reallocated.
  stash_.reserve(2 * waiting);

  peers_.reserve(num_peers);
  for (uint16_t p = 0; p < num_peers; ++p) {
    const PeerSpec& s = config.peers[p];
    for (uint16_t q = 0; q < p; ++q) {
      if (config.peers[q].ip == s.ip && config.peers[q].udp_port == s.udp_port) {
        throw std::invalid_argument("endpoint: peers " + config.peers[q].name + " and " + s.name +
                                    " have the same address");
      }
    }
    peers_.push_back(std::make_unique<PeerState>(*this, p, s, config.transport, now,
                                                 params.rx_messages, params.window));
    by_addr_.push_back(addr_key(s.ip, s.udp_port) | p);
  }
  std::sort(by_addr_.begin(), by_addr_.end());
}

Endpoint::~Endpoint() = default;

const PeerSpec& Endpoint::peer_spec(uint16_t peer) const { return peers_.at(peer)->spec; }

// ---------------------------------------------------------------------------
// Any thread.

SubmitStatus Endpoint::send(uint16_t peer, const std::byte* data, uint32_t len, uint8_t priority,
                            const MessageMeta& meta, const Completion& done) {
  return submit(peer, data, len, 0, 0, priority, meta, done);
}

SubmitStatus Endpoint::send_slice(uint16_t peer, const std::byte* data, uint32_t len,
                                  uint32_t base_offset, uint32_t logical_len, uint8_t priority,
                                  const MessageMeta& meta, const Completion& done) {
  // A slice is data (its receiver aggregates or places it per packet); a
  // control message is assembled whole, so it cannot be one. logical_len 0
  // would read as "not a slice", hence len > 0.
  const bool data_type =
      meta.type == wire::PacketType::kData || meta.type == wire::PacketType::kAggData;
  const bool aligned = meta.dtype != wire::Dtype::kFloat32 ||
                       ((base_offset | len | logical_len) & 3u) == 0;  // wire::decode's rule
  if (!data_type || len == 0 || uint64_t{base_offset} + len > logical_len || !aligned) {
    submit_invalid_.fetch_add(1, std::memory_order_relaxed);
    return SubmitStatus::kInvalid;
  }
  const SubmitStatus st = submit(peer, data, len, base_offset, logical_len, priority, meta, done);
  if (st == SubmitStatus::kQueued) slices_submitted_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

SubmitStatus Endpoint::submit(uint16_t peer, const std::byte* data, uint32_t len,
                              uint32_t base_offset, uint32_t logical_len, uint8_t priority,
                              const MessageMeta& meta, const Completion& done) {
  // A zero-length kControl message is how partition start-ups travel, so the
  // application may not send one.
  if (peer >= peers_.size() || priority >= sched::kPriorityLevels ||
      meta.type == wire::PacketType::kAck || (data == nullptr && len > 0) ||
      (meta.type == wire::PacketType::kControl && len == 0)) {
    submit_invalid_.fetch_add(1, std::memory_order_relaxed);
    return SubmitStatus::kInvalid;
  }
  sched::Message* m = pool_->alloc();
  if (m == nullptr) {
    submit_no_descriptor_.fetch_add(1, std::memory_order_relaxed);
    return SubmitStatus::kNoDescriptor;
  }
  m->data = data;
  m->len = len;
  m->peer = peer;
  m->priority = priority;
  m->type = static_cast<uint8_t>(meta.type);
  m->dtype = static_cast<uint8_t>(meta.dtype);
  m->tensor_key = meta.tensor_key;
  m->iteration = meta.iteration;
  m->param_version = meta.param_version;
  m->base_offset = base_offset;  // the pool does not reset these two
  m->logical_len = logical_len;
  // Unique per endpoint, so unique per peer stream: the receiver keys its
  // messages in progress by it. Relaxed: only uniqueness matters.
  m->msg_id = next_msg_id_.fetch_add(1, std::memory_order_relaxed);
  m->cookie = done.cookie;
  // The record is published with the message by submit()'s release CAS,
  // which the net core's drain_ingress_st() acquires.
  records_[m - base_] = Record{done.fn, done.context, 0, false, SendStatus::kDelivered};
  if (!sched_->submit(m)) {
    pool_->free(m);
    submit_ingress_full_.fetch_add(1, std::memory_order_relaxed);
    return SubmitStatus::kIngressFull;
  }
  return SubmitStatus::kQueued;
}

// ---------------------------------------------------------------------------
// Net core.

uint32_t Endpoint::poll_st(Tick now) {
  const uint64_t rx_before = counters_.rx_packets;
  const uint64_t tx_before = counters_.tx_data + counters_.tx_retransmits + counters_.tx_pure_acks;
  receive_st(now);
  if (passes_ % config_.timer_every == 0) run_timers_st(now);
  ++passes_;
  transmit_st(now);
  return static_cast<uint32_t>(counters_.rx_packets - rx_before + counters_.tx_data +
                               counters_.tx_retransmits + counters_.tx_pure_acks - tx_before);
}

void Endpoint::receive_st(Tick now) {
  net::RxPacket* rx = rx_.data();
  rte_mbuf* mbufs[net::Interface::kBurst];
  const uint16_t n = iface_.poll_rx_st(rx, net::Interface::kBurst, now);
  counters_.rx_packets += n;
  uint16_t kept = 0;
  for (uint16_t i = 0; i < n; ++i) {
    mbufs[i] = rx[i].mbuf;
    const net::ParsedFrame& f = rx[i].parsed;
    const uint64_t key = addr_key(f.src_ip, f.src_port);
    const auto it = std::lower_bound(by_addr_.begin(), by_addr_.end(), key);
    if (it == by_addr_.end() || (*it & ~uint64_t{0xffff}) != key) {
      drop(EndpointDrop::kUnknownPeer);
      continue;
    }
    const auto p = static_cast<uint16_t>(*it & 0xffff);
    PeerState& ps = *peers_[p];
    if (packets_ != nullptr && !admitted_st(ps, p, f.header)) {
      // Refused before the transport saw it: only its piggybacked ACK counts
      // (it says nothing about the data and is cumulative, so taking it is
      // always right), without kAckRequest (an answer would acknowledge
      // nothing new).
      wire::HeaderFields ack = f.header;
      ack.type = wire::PacketType::kAck;
      ack.flags = static_cast<uint16_t>(ack.flags & ~wire::flags::kAckRequest);
      ps.peer.on_packet(ack, now, ps);
      ++ps.stats.packets_refused;
      drop(EndpointDrop::kBackpressure);
      continue;
    }
    const RxResult r = ps.peer.on_packet(f.header, now, ps);
    ++counters_.verdicts[static_cast<size_t>(r.verdict)];
    if (place_st(ps, p, rx[i], r)) {
      mbufs[i] = nullptr;  // the PacketReceiver took it
      ++kept;
    }
  }
  if (kept != 0) {
    // Compact the ones left to free (rare path: a receiver kept some).
    uint16_t m = 0;
    for (uint16_t i = 0; i < n; ++i) {
      if (mbufs[i] != nullptr) mbufs[m++] = mbufs[i];
    }
    if (m > 0) rte_pktmbuf_free_bulk(mbufs, m);
  } else if (n > 0) {
    rte_pktmbuf_free_bulk(mbufs, n);
  }
}

bool Endpoint::routed_to_packets(const wire::HeaderFields& h) const {
  if (h.type == wire::PacketType::kAck) return false;
  if ((h.flags & wire::flags::kSlice) != 0) return true;
  if (h.type != wire::PacketType::kControl) return true;
  // Control: a partition start-up (msg_len 0) goes nowhere; messages go to
  // the MessageReceiver when there is one.
  return h.msg_len != 0 && messages_ == nullptr;
}

bool Endpoint::admitted_st(const PeerState& ps, uint16_t p, const wire::HeaderFields& h) {
  if (!routed_to_packets(h)) return true;
  // Only what Peer::on_packet would take as new is offered; anything else
  // (another epoch, old, beyond the window or outside a new stream's first
  // window, a known duplicate) keeps its usual handling and acknowledgement. Beyond the 64
  // seqs of the SACK bitmap the receiver's history is not visible from
  // here: such a packet is offered (see PacketReceiver::admit).
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

bool Endpoint::deliver_packet_st(PeerState& ps, uint16_t p, const net::RxPacket& pkt) {
  const wire::HeaderFields& h = pkt.parsed.header;
  ++ps.stats.packets_delivered;
  ps.stats.bytes_received += h.payload_len;
  ++counters_.packets_delivered;
  const bool took = packets_->on_packet(p, h, pkt.parsed.payload, pkt.mbuf);
  if (took) ++counters_.packets_kept;
  return took;
}

bool Endpoint::place_st(PeerState& ps, uint16_t p, const net::RxPacket& pkt, const RxResult& r) {
  if (r.peer_restarted && packets_ != nullptr) packets_->on_peer_restarted(p);
  if (r.peer_restarted) {
    // The transport abandoned every message in progress from the peer. The
    // buffers go back to the application: no non-temporal store of ours may
    // land after it has been told (net/stream_copy.h).
    net::stream_fence();
    for (PeerState::RxSlot& s : ps.rx) {
      if (!s.used) continue;
      if (s.buffer != nullptr) {
        messages_->on_message_abandoned(p, s.msg_id, s.buffer);
        ++counters_.messages_abandoned;
      }
      s.used = false;
    }
    ps.rx_count = 0;
  }
  if (r.verdict != RxVerdict::kNew) return false;
  const wire::HeaderFields& h = pkt.parsed.header;
  if (h.type == wire::PacketType::kControl && h.msg_len == 0) {
    ++counters_.control_received;  // a partition start-up: its ack is the answer
    return false;
  }
  // Routing (see Receivers in endpoint.h).
  if ((h.flags & wire::flags::kSlice) != 0) {
    if (packets_ != nullptr) return deliver_packet_st(ps, p, pkt);
    drop(EndpointDrop::kNoReceiver);
    return false;
  }
  if (packets_ != nullptr && (h.type != wire::PacketType::kControl || messages_ == nullptr)) {
    return deliver_packet_st(ps, p, pkt);
  }
  if (messages_ == nullptr) {
    drop(EndpointDrop::kNoReceiver);
    return false;
  }
  MessageReceiver& receiver = *messages_;
  const std::byte* payload = pkt.parsed.payload.data();
  if (r.message_complete && h.offset == 0 && h.payload_len == h.msg_len) {
    // The whole message in one packet: no table entry.
    std::byte* buffer = receiver.on_message_begin(p, h);
    if (buffer == nullptr) {
      ++ps.stats.messages_refused;
      drop(EndpointDrop::kRefused);
      return false;
    }
    if (h.payload_len != 0) std::memcpy(buffer, payload, h.payload_len);
    ps.stats.bytes_received += h.payload_len;
    ++ps.stats.messages_received;
    ++counters_.messages_received;
    receiver.on_message_complete(p, h, buffer);
    return false;
  }
  PeerState::RxSlot* slot = ps.rx_find(h.msg_id);
  if (slot == nullptr) {
    slot = ps.rx_add(h.msg_id);
    if (slot == nullptr) {
      drop(EndpointDrop::kRxTableFull);
      return false;
    }
    slot->buffer = receiver.on_message_begin(p, h);
    if (slot->buffer == nullptr) ++ps.stats.messages_refused;
  }
  if (slot->buffer != nullptr) {
    // wire::decode checked offset + payload_len <= msg_len (kBadRange), and
    // the transport checks msg_len against the message in progress. A
    // message larger than the caches is written with non-temporal stores
    // (net/stream_copy.h), fenced before its completion.
    net::place_copy(slot->buffer + h.offset, payload, h.payload_len, h.msg_len);
    ps.stats.bytes_received += h.payload_len;
  } else {
    drop(EndpointDrop::kRefused);
  }
  if (r.message_complete) {
    if (slot->buffer != nullptr) {
      ++ps.stats.messages_received;
      ++counters_.messages_received;
      if (net::streams_into(h.msg_len)) net::stream_fence();
      receiver.on_message_complete(p, h, slot->buffer);
    }
    ps.rx_erase(slot);
  }
  return false;
}

void Endpoint::run_timers_st(Tick now) {
  for (auto& ptr : peers_) {
    PeerState& ps = *ptr;
    if (!ps.resolved) {
      ps.resolved = iface_.resolve_st(ps.spec.ip, ps.spec.udp_port, ps.route, now);
    }
    ps.peer.on_timer(now, ps);
  }
}

bool Endpoint::eligible(const PeerState& ps) const {
  // A dead peer's queue is drained by drain_dead_st, never sent.
  if (ps.peer.dead() || !ps.resolved) return false;
  return ps.peer.can_send() || (ps.peer.sender().waiting_resend() > 0 && ps.peer.can_resend());
}

uint32_t Endpoint::send_room(const PeerState& ps) const {
  const PeerSender& snd = ps.peer.sender();
  const uint32_t cwnd_room = snd.cwnd() > snd.in_flight() ? snd.cwnd() - snd.in_flight() : 0;
  if (ps.peer.can_send()) return std::min(snd.window() - snd.outstanding(), cwnd_room);
  return snd.waiting_resend() > 0 ? cwnd_room : 0;
}

void Endpoint::fill_header(const sched::Message& msg, bool control, uint32_t offset, uint32_t len,
                           wire::HeaderFields& h) const {
  h.type = control ? wire::PacketType::kControl : static_cast<wire::PacketType>(msg.type);
  h.job_id = config_.job_id;
  h.sender_id = config_.sender_id;
  h.priority = msg.priority;
  h.dtype = static_cast<wire::Dtype>(msg.dtype);
  h.tensor_key = msg.tensor_key;
  h.msg_id = msg.msg_id;
  // A slice's packets are placed in its logical message (send_slice);
  // otherwise base_offset is 0 and logical_len 0.
  const bool slice = !control && msg.logical_len != 0;
  h.msg_len = control ? 0 : (slice ? msg.logical_len : msg.len);
  h.offset = control ? 0 : msg.base_offset + offset;
  // ORed: on a resend the Peer has stamped the transport flags already.
  if (slice) h.flags |= wire::flags::kSlice;
  h.iteration = msg.iteration;
  h.param_version = msg.param_version;
  h.payload_len = static_cast<uint16_t>(control ? 0 : len);
}

bool Endpoint::stage(PeerState& ps, const wire::HeaderFields& h, const std::byte* payload) {
  if (iface_.stage_data_st(ps.route, h, std::span<const std::byte>(payload, h.payload_len))) {
    return true;
  }
  drop(EndpointDrop::kStageFailed);
  return false;
}

void Endpoint::account_failed(PeerState& ps, sched::Message* msg, bool control, uint32_t len,
                              SendStatus why) {
  (void)ps;
  Record& rec = record(msg);
  if (rec.status == SendStatus::kDelivered) rec.status = why;
  // The bytes count as settled, so the scheduler completes the message once
  // everything of it is settled; the completion then reports the failure.
  if (control) {
    sched_->partition_ready_st(msg);
  } else {
    sched_->on_acked_st(msg, len);
  }
}

void Endpoint::retry_stash_st() {
  size_t kept = 0;
  for (size_t i = 0; i < stash_.size(); ++i) {
    const sched::Slice s = stash_[i];
    const bool control = s.kind == sched::SliceKind::kPartitionStart;
    LostMap::Slot* e = lost_->find(token_of(s.msg, control), s.offset);
    if (e == nullptr) {
      // Settled while it waited here (acked, or failed with its peer): its
      // message may even be complete and its descriptor reused, so it must
      // not reach the scheduler.
      drop(EndpointDrop::kRetransmitStale);
      continue;
    }
    PeerState& ps = *peers_[s.msg->peer];
    if (e->deferred && ps.peer.dead()) {
      lost_->erase(e);
      account_failed(ps, s.msg, control, s.len, ps.death());
      continue;
    }
    if (!sched_->requeue_st(s)) stash_[kept++] = s;
  }
  stash_.resize(kept);
}

void Endpoint::stage_resend_st(PeerState& ps, const SliceRef& ref, wire::HeaderFields& h) {
  fill_header(*message_of(ref.msg_token), is_control(ref.msg_token), ref.offset, ref.len, h);
  stage(ps, h, message_of(ref.msg_token)->data + ref.offset);
  ++counters_.tx_retransmits;
}

uint32_t Endpoint::resend_left_edge_st(PeerState& ps, Tick now) {
  // The oldest unacknowledged packet, once lost, goes out now, whatever its
  // priority and cwnd (PeerSender::left_edge_lost): packets beyond the SACK
  // horizon can keep cwnd full until it arrives, and higher-priority resends
  // would otherwise always come first. Its slice still waits in the
  // scheduler; with the map entry gone it is dropped as stale.
  uint32_t seq;
  if (!ps.peer.sender().left_edge_lost(seq)) return 0;
  SliceRef ref;
  wire::HeaderFields h;
  if (ps.peer.resend(seq, now, ref, h) != Resend::kSend) return 0;
  if (LostMap::Slot* e = lost_->find(ref.msg_token, ref.offset); e != nullptr && e->seq == seq) {
    lost_->erase(e);
  }
  stage_resend_st(ps, ref, h);
  ++counters_.resends_left_edge;
  return 1;
}

uint32_t Endpoint::resend_blocked_st(PeerState& ps, Tick now, uint32_t budget) {
  uint32_t sent = 0;
  PeerState::LostHint hint;
  while (sent < budget && !ps.peer.can_send() && ps.peer.can_resend() &&
         ps.peer.sender().waiting_resend() > 0 && ps.pop_hint(hint)) {
    LostMap::Slot* e = lost_->find(hint.token, hint.offset);
    if (e == nullptr || e->deferred || e->seq != hint.seq) continue;  // stale hint
    SliceRef ref;
    wire::HeaderFields h;
    switch (ps.peer.resend(hint.seq, now, ref, h)) {
      case Resend::kSend:
        // Its slice still waits in the scheduler; with the map entry gone it
        // is dropped as stale when it comes up.
        lost_->erase(e);
        stage_resend_st(ps, ref, h);
        ++counters_.resends_window_blocked;
        ++sent;
        break;
      case Resend::kNotNeeded:
        lost_->erase(e);
        ++counters_.resends_not_needed;
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
    const bool control = s.kind == sched::SliceKind::kPartitionStart;
    if (s.retransmit) {
      LostMap::Slot* e = lost_->find(token_of(msg, control), s.offset);
      if (e == nullptr || !e->deferred) {
        // Settled already: the Peer failed every packet it held when it died
        // (and with it every map entry but the deferred ones).
        if (e != nullptr) lost_->erase(e);
        drop(EndpointDrop::kRetransmitStale);
        continue;
      }
      lost_->erase(e);
    }
    account_failed(ps, msg, control, s.len, ps.death());
  }
}

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
  const uint32_t room = iface_.tx_room();
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
  // One slice of a carved burst. A peer that cannot take what was carved for
  // it (a resend without room, new data while its window is full) gets the
  // slice back in the scheduler and is skipped for the rest of the pass.
  sched::PeerMask blocked;
  auto serve = [&](const sched::Slice& s) {
    sched::Message* msg = s.msg;
    const uint16_t p = msg->peer;
    PeerState& ps = *peers_[p];
    const bool control = s.kind == sched::SliceKind::kPartitionStart;
    const uint64_t token = token_of(msg, control);
    bool fresh = !s.retransmit;
    if (s.retransmit) {
      LostMap::Slot* e = lost_->find(token, s.offset);
      if (e == nullptr) {
        // Acked or failed while it waited: its bytes are settled already.
        drop(EndpointDrop::kRetransmitStale);
      } else if (e->deferred) {
        lost_->erase(e);
        fresh = true;
      } else {
        SliceRef ref;
        wire::HeaderFields h;
        switch (ps.peer.resend(e->seq, now, ref, h)) {
          case Resend::kSend:
            lost_->erase(e);
            stage_resend_st(ps, ref, h);
            ++sent;
            break;
          case Resend::kNotNeeded:
            lost_->erase(e);
            ++counters_.resends_not_needed;
            break;
          case Resend::kNoRoom:
            // Keep the request (and its seq in the map) for after an ACK.
            if (!sched_->requeue_st(s)) {
              stash_.push_back(s);
              ++counters_.requeue_stashed;
            }
            ++counters_.resends_no_room;
            blocked.set(p);
            return;
        }
      }
    }
    if (fresh) {
      Record& rec = record(msg);
      // The stream towards a peer restarts when the peer comes back with a
      // new epoch; a message begun on an earlier stream cannot be finished
      // on this one (its first part went to the old incarnation), even if
      // none of its packets were pending when the restart happened.
      const uint32_t stream = static_cast<uint32_t>(ps.peer.sender().counters().restarts);
      if (rec.status == SendStatus::kDelivered && rec.started && rec.stream != stream) {
        rec.status = SendStatus::kPeerRestarted;
      }
      if (rec.status != SendStatus::kDelivered) {
        // Never sent: the message already failed, and its remaining bytes
        // would be an orphan at the peer.
        account_failed(ps, msg, control, s.len, rec.status);
        return;
      }
      if (!ps.peer.can_send()) {
        // Picked for a resend's sake while the window is full: hand the slice
        // back, marked as never sent, and skip the peer for this pass.
        lost_->put(token, s.offset, 0, true);
        if (!sched_->requeue_st(s)) {
          stash_.push_back(s);
          ++counters_.requeue_stashed;
        }
        ++counters_.deferred;
        blocked.set(p);
        return;
      }
      rec.started = true;
      rec.stream = stream;
      wire::HeaderFields h;
      fill_header(*msg, control, s.offset, s.len, h);
      ps.peer.send(SliceRef{token, s.offset, s.len, msg->priority}, now, h);
      stage(ps, h, control ? nullptr : msg->data + s.offset);
      ++counters_.tx_data;
      ++sent;
    }
  };
  // Carve in bursts (the scheduler picks a level and peer once per run of
  // slices of one message), each peer's share bounded by what it can take:
  // its window and cwnd room, or its cwnd room for resends when the window
  // is full (new data carved then is deferred, as above).
  sched::Slice burst[net::Interface::kBurst];
  while (sent < budget && ready.any()) {
    for (uint16_t p = 0; p < peers_.size(); ++p) {
      if (ready.test(p)) room_[p] = send_room(*peers_[p]);
    }
    const size_t n =
        sched_->next_slices_st(ready, max_payload_, burst, budget - sent, room_.data());
    if (n == 0) break;
    for (size_t i = 0; i < n; ++i) serve(burst[i]);
    ready = sched::PeerMask{};
    for (uint16_t p = 0; p < peers_.size(); ++p) {
      if (!blocked.test(p) && eligible(*peers_[p])) ready.set(p);
    }
  }
  // Pure ACKs (and probes) for peers that no data piggybacked them to.
  for (auto& ptr : peers_) {
    PeerState& ps = *ptr;
    if (!ps.resolved || iface_.tx_room() == 0) continue;
    if (!ps.peer.ack_due(now)) continue;
    wire::HeaderFields h;
    ps.peer.fill_pure_ack(now, h);
    h.job_id = config_.job_id;
    h.sender_id = config_.sender_id;
    if (stage(ps, h, nullptr)) ++counters_.tx_pure_acks;
  }
  iface_.flush_st(now);
}

// ---------------------------------------------------------------------------
// SenderSink reports (net core, inside Peer calls).

void Endpoint::acked(PeerState& ps, const SliceRef& slice) {
  (void)ps;
  lost_->erase(slice.msg_token, slice.offset);
  sched::Message* msg = message_of(slice.msg_token);
  if (is_control(slice.msg_token)) {
    sched_->partition_ready_st(msg);
  } else {
    sched_->on_acked_st(msg, slice.len);
  }
}

void Endpoint::lost(PeerState& ps, uint32_t seq, const SliceRef& slice) {
  lost_->put(slice.msg_token, slice.offset, seq, false);
  ps.push_hint({slice.msg_token, slice.offset, seq});
  const sched::Slice s{
      message_of(slice.msg_token), slice.offset, slice.len, true,
      is_control(slice.msg_token) ? sched::SliceKind::kPartitionStart : sched::SliceKind::kData};
  if (!sched_->requeue_st(s)) {
    stash_.push_back(s);
    ++counters_.requeue_stashed;
  }
}

void Endpoint::failed(PeerState& ps, const SliceRef& slice, FailReason why) {
  lost_->erase(slice.msg_token, slice.offset);
  account_failed(ps, message_of(slice.msg_token), is_control(slice.msg_token), slice.len,
                 status_of(why));
}

void Endpoint::on_complete(void* self, const sched::Message& msg) {
  auto& ep = *static_cast<Endpoint*>(self);
  const Record rec = ep.records_[&msg - ep.base_];
  PeerState& ps = *ep.peers_[msg.peer];
  SendResult r;
  r.cookie = msg.cookie;
  r.peer = msg.peer;
  r.len = msg.len;
  r.status = rec.status;
  if (rec.status == SendStatus::kDelivered) {
    ++ps.stats.messages_sent;
    ++ep.counters_.messages_completed;
  } else {
    r.error = ps.errors[static_cast<size_t>(rec.status)];
    ++ps.stats.messages_failed;
    ++ep.counters_.messages_failed;
  }
  if (rec.fn != nullptr) rec.fn(rec.context, r);
}

// ---------------------------------------------------------------------------
// Telemetry.

bool Endpoint::idle_st() const {
  if (sched_->has_work_st() || !stash_.empty() || lost_->size() != 0) return false;
  for (const auto& ptr : peers_) {
    if (ptr->peer.sender().outstanding() != 0 && !ptr->peer.dead()) return false;
  }
  return true;
}

Tick Endpoint::next_deadline_st() const {
  Tick next = 0;
  for (const auto& ptr : peers_) {
    const Tick t = ptr->peer.next_deadline();
    if (t != 0 && (next == 0 || t < next)) next = t;
  }
  return next;
}

EndpointCounters Endpoint::counters_st() const {
  EndpointCounters c = counters_;
  c.passes = passes_;
  c.submit_no_descriptor = submit_no_descriptor_.load(std::memory_order_relaxed);
  c.submit_ingress_full = submit_ingress_full_.load(std::memory_order_relaxed);
  c.submit_invalid = submit_invalid_.load(std::memory_order_relaxed);
  c.slices_submitted = slices_submitted_.load(std::memory_order_relaxed);
  return c;
}

EndpointPeerStats Endpoint::peer_stats_st(uint16_t peer) const {
  const PeerState& ps = *peers_.at(peer);
  EndpointPeerStats s = ps.stats;
  s.transport = ps.peer.counters();
  s.outstanding = ps.peer.sender().outstanding();
  s.waiting_resend = ps.peer.sender().waiting_resend();
  s.resolved = ps.resolved;
  s.dead = ps.peer.dead();
  return s;
}

}  // namespace mercury::transport
