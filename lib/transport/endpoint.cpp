// Endpoint: set-up, submission (any thread), completions, the pass and
// telemetry. The datapath lives in endpoint_rx.cpp and endpoint_tx.cpp; see
// endpoint.h.
#include <algorithm>
#include <bit>
#include <stdexcept>

#include "transport/endpoint.h"
#include "transport/peer_state.h"

namespace mercury::transport {

namespace {

uint32_t pow2_at_least(uint64_t n) {
  return static_cast<uint32_t>(std::bit_ceil(std::max<uint64_t>(n, 2)));
}

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
    case EndpointDrop::kWrongJob:
      return "wrong_job";
    case EndpointDrop::kBackpressure:
      return "backpressure";
    case EndpointDrop::kAuthMissing:
      return "auth_missing";
    case EndpointDrop::kAuthBadMac:
      return "auth_bad_mac";
    case EndpointDrop::kAuthReplay:
      return "auth_replay";
    case EndpointDrop::kAuthUnexpected:
      return "auth_unexpected";
    case EndpointDrop::kCount:
      break;
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Set-up.

Endpoint::PeerState::PeerState(Endpoint& ep, uint16_t index, const PeerSpec& s, const Config& cfg,
                               Tick now, uint32_t rx_messages, uint32_t window)
    : endpoint(ep),
      index(index),
      spec(s),
      peer(cfg, ep.config_.local_epoch, now, s.peer_epoch),
      // One slot stays empty so that probes end.
      rx(2 * uint64_t{rx_messages}, pow2_at_least(2 * uint64_t{rx_messages}) - 1),
      hints(pow2_at_least(2 * uint64_t{window})),
      hint_mask(static_cast<uint32_t>(hints.size() - 1)) {
  const std::string who =
      "peer " + s.name + " (" + net::ipv4_to_string(s.ip) + ":" + std::to_string(s.udp_port) + ")";
  errors[static_cast<size_t>(SendStatus::kPeerTimeout)] =
      who + " did not acknowledge for " + std::to_string(cfg.peer_timeout_us / 1000) + " ms";
  errors[static_cast<size_t>(SendStatus::kPeerRestarted)] =
      who + " restarted (new epoch): the message was lost with its old state";
  errors[static_cast<size_t>(SendStatus::kReset)] =
      "the stream to " + who + " was reset (new local epoch)";
  errors[static_cast<size_t>(SendStatus::kPeerUnreachable)] =
      who + " did not answer within " + std::to_string(cfg.connect_timeout_us / 1000) + " ms";
}

Endpoint::Endpoint(net::PacketPort& port, const EndpointConfig& config, MessageReceiver& receiver,
                   Tick now)
    : Endpoint(port, config, Receivers{&receiver, nullptr}, now) {}

Endpoint::Endpoint(net::PacketPort& port, const EndpointConfig& config, PacketReceiver& receiver,
                   Tick now)
    : Endpoint(port, config, Receivers{nullptr, &receiver}, now) {}

Endpoint::Endpoint(net::PacketPort& port, const EndpointConfig& config, const Receivers& receivers,
                   Tick now)
    : port_(port),
      config_(config),
      messages_(receivers.messages),
      packets_(receivers.packets),
      max_payload_(net::payload_per_packet(port.mtu(), config.auth_key != nullptr)),
      auth_(config.auth_key ? std::make_unique<Authenticator>(*config.auth_key) : nullptr) {
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
  if (config.tx_burst == 0 || config.tx_burst > net::PacketPort::kBurst) {
    throw std::invalid_argument("endpoint: tx_burst must be 1.." +
                                std::to_string(net::PacketPort::kBurst));
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
  records_ = sched::HugeArray<Record>(config.max_messages);
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
  // Partitions are whole packets (P3 slices a tensor at packet boundaries):
  // a partition of S bytes starting mid-packet would shift every later packet
  // of the message off the chunk grid the receivers index by (offset /
  // payload), and the server would refuse them all as misaligned. Rounded
  // down, at least one packet; the credit (>= S) still holds a partition.
  sc.partition_bytes = std::max(max_payload_, config.partition_bytes / max_payload_ * max_payload_);
  sc.credit_bytes = config.credit_bytes;
  sched_ = std::make_unique<sched::PortScheduler>(sc, *pool_, &Endpoint::on_complete, this);
  // At most 3/4 full, so probes stay short.
  const uint32_t lost_slots = pow2_at_least(2 * waiting);
  lost_ = std::make_unique<LostMap>(lost_slots, lost_slots / 2 + lost_slots / 4);
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
    // With a job key every packet a Peer sees was verified: a newer epoch is
    // then proven, and a restart at once (docs/security.md).
    Config peer_config = config.transport;
    peer_config.epochs_authenticated = config.auth_key != nullptr;
    peers_.push_back(std::make_unique<PeerState>(*this, p, s, peer_config, now, params.rx_messages,
                                                 params.window));
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
  // wire::decode's rule: no element straddles two packets.
  const uint32_t size = wire::element_bytes(meta.dtype);
  const bool aligned = size != 0 && ((base_offset | len | logical_len) & (size - 1)) == 0;
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
  // ACKs and partition start-ups are the endpoint's own packets, never a
  // message's.
  if (peer >= peers_.size() || priority >= sched::kPriorityLevels ||
      meta.type == wire::PacketType::kAck || meta.type == wire::PacketType::kPartitionStart ||
      (data == nullptr && len > 0)) {
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
  m->block_key = meta.block_key;
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
// The pass (net core).

uint32_t Endpoint::poll_st(Tick now, bool receive) {
  MERCURY_OWNED(owner_);
  const uint64_t rx_before = counters_.rx_packets;
  const uint64_t tx_before = counters_.tx_data + counters_.tx_retransmits + counters_.tx_pure_acks;
  bool drained = false;
  if (receive) {
    drained = receive_st(now) < net::PacketPort::kBurst;
  } else {
    ++counters_.rx_paused;
  }
  // The timers judge a peer by its silence, so they run once the RX queue is
  // drained: a core that was off its CPU for longer than an RTO finds the
  // ACKs that arrived meanwhile queued, and reads them before any timer
  // declares their packets lost. A burst less than full means drained (a
  // paused receive drains nothing); a flood or a long pause holds the timers
  // off for at most kMaxTimerDeferral passes.
  if (++passes_since_timers_ >= config_.timer_every) {
    if (!drained && passes_since_timers_ < kMaxTimerDeferral) {
      ++counters_.timers_deferred;
    } else {
      passes_since_timers_ = 0;
      run_timers_st(now);
    }
  }
  ++passes_;
  transmit_st(now);
  return static_cast<uint32_t>(counters_.rx_packets - rx_before + counters_.tx_data +
                               counters_.tx_retransmits + counters_.tx_pure_acks - tx_before);
}

// ---------------------------------------------------------------------------
// Completions (net core, when the scheduler has settled every byte).

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
  MERCURY_OWNED(owner_);
  if (sched_->has_work_st() || !stash_.empty() || lost_->size() != 0) return false;
  for (const auto& ptr : peers_) {
    if (ptr->peer.sender().outstanding() != 0 && !ptr->peer.dead()) return false;
  }
  return true;
}

bool Endpoint::owes_acks_st() const {
  MERCURY_OWNED(owner_);
  for (const auto& ptr : peers_) {
    if (ptr->resolved && ptr->peer.receiver().ack_deadline() != 0) return true;
  }
  return false;
}

EndpointCounters Endpoint::counters_st() const {
  MERCURY_OWNED(owner_);
  EndpointCounters c = counters_;
  c.passes = passes_;
  c.submit_no_descriptor = submit_no_descriptor_.load(std::memory_order_relaxed);
  c.submit_ingress_full = submit_ingress_full_.load(std::memory_order_relaxed);
  c.submit_invalid = submit_invalid_.load(std::memory_order_relaxed);
  c.slices_submitted = slices_submitted_.load(std::memory_order_relaxed);
  return c;
}

EndpointPeerStats Endpoint::peer_stats_st(uint16_t peer) const {
  MERCURY_OWNED(owner_);
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
