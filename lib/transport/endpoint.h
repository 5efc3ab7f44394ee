// The transport endpoint: the net core glue that joins lib/net (one
// net::PacketPort: an Interface on a real DPDK port, or a MemoryPort in unit
// tests), lib/sched (a PortScheduler fed by any thread) and lib/transport
// (one Peer state machine per remote).
//
// What it is for. One Endpoint per (net core, port). Producers on any
// thread call send(): the message is queued whole in the scheduler, never
// copied. The net core calls poll_st(now) in its loop, which has the shape of
// docs/architecture.md ("Threads and ownership"): receive a burst, route each
// packet once (to the MessageReceiver, the PacketReceiver, the transport
// alone, or nowhere), hand it to its Peer, place accepted payloads straight
// into the destination buffer the application gave for the message (the only
// copy, from the port's buffer; with non-temporal stores for messages of
// net::kStreamDestinationBytes or more), report completed messages, or hand
// each accepted packet with its buffer to a PacketReceiver (no copy; it may
// keep the buffer), release the other buffers to the port; every
// `timer_every` passes run the timers (RTO, liveness, route resolution of
// peers without one); then TX: drain the scheduler's ingress, fail whatever
// is queued for dead peers, resend the lost packets of peers whose window is
// full, carve packets (lost packets come back through the scheduler's
// retransmission queue at their message's priority, ahead of new data of
// that level), stamp them through the Peer, stage them on the port a burst
// at a time, send the pure ACKs that nothing piggybacked, and flush.
//
// One class, several files, one concern each: endpoint.cpp (set-up, submit,
// completions, telemetry), endpoint_rx.cpp (route, admit, place, reassemble),
// endpoint_tx.cpp (transmit, resend, requeue, what happens to sent slices),
// endpoint_timers.cpp (the slow work of a pass); peer_state.h holds the
// per-peer state and the lost map they share.
//
// Slices. send_slice() queues part of a larger logical message (a server's
// aggregated chunk out of a shard's parameter memory): its packets carry
// offset = base + offset in the part and msg_len = the logical length, with
// wire::flags::kSlice, so the receiving transport does no message accounting
// for them (parts complete in any order) and the receiving endpoint hands
// them to its PacketReceiver one by one. Its completion means "every byte of
// the part was acknowledged".
//
// Threads.
//  * send() and send_slice() may be called from any thread, preemptible ones
//    included: they are lock-free (a pool pop, a counter fetch_add and the
//    scheduler's submit), never block, never allocate, and return a
//    SubmitStatus.
//  * Everything ending in _st belongs to the one net core that owns the
//    port (the scheduler's single consumer). Completions and the
//    MessageReceiver and PacketReceiver callbacks run on that core, inside
//    poll_st().
//  * The constructor is control path: it allocates every table once and
//    throws std::invalid_argument (bad configuration) naming the field.
//
// Costs. Per received packet: one peer lookup (binary search over the
// peers), the Peer's O(1) work, for a data packet one probe of the
// per-peer table of messages in progress and one memcpy of the payload, or
// (packet delivery) one virtual call and no copy.
// Per sent packet: O(1) in the scheduler and the Peer, one hash probe for a
// retransmission, the port's frame build. Per pass: O(peers) checks and five
// calls into the port (receive, release, stage data, stage ACKs, flush).
// Memory: a 128-byte descriptor and a 24-byte record per message slot
// (max_messages), the Peers (see transport.h), per peer a table of
// pow2(2 x rx_messages) 16-byte slots and a ring of pow2(2 x window) 16-byte
// lost-packet hints, a retransmission map of pow2(2 x peers x (4 x window
// + 64)) 24-byte slots, and a TX batch of 64 80-byte frames. Nothing grows
// with traffic. docs/endpoint.md,
// section "Design decisions", gives the decisions.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/counter_list.h"
#include "base/owner.h"
#include "net/packet_port.h"
#include "sched/message.h"
#include "sched/port_scheduler.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "wire/header.h"

namespace mercury::transport {

/// One remote endpoint this endpoint talks to.
struct PeerSpec {
  std::string name;  ///< used in error messages ("w2")
  uint32_t ip = 0;   ///< IPv4, host order
  uint16_t udp_port = wire::kDefaultUdpPort;
  uint32_t peer_epoch = 0;  ///< the peer's epoch if known; 0: learn it by the probe exchange
  /// The peer's id in the job (its sender_id): with authentication, part of
  /// each packet's MAC nonce, so a packet is good only between these two.
  uint16_t node_id = 0;
};

struct EndpointConfig {
  Config transport;  ///< per-peer protocol settings (tsc_hz required)
  sched::Mode mode = sched::Mode::kStrict;
  uint32_t partition_bytes = 4 << 20;  ///< partition mode only; rounded down to whole packets
  uint32_t credit_bytes = 8 << 20;     ///< partition mode only
  uint32_t max_messages = 4096;        ///< message descriptors (queued + in flight)
  uint32_t ingress_capacity = 4096;    ///< submitted and not yet drained
  uint32_t local_epoch = 1;            ///< our incarnation (non-zero; job::fresh_epoch())
  uint32_t job_id = 0;                 ///< written in every header; others' are dropped on receipt
  uint16_t sender_id = 0;              ///< our id in the job, written in every header
  uint32_t timer_every = 16;           ///< poll passes between timer runs (>= 1)
  uint32_t tx_burst = 32;              ///< data packets carved per pass (<= PacketPort::kBurst)
  std::vector<PeerSpec> peers;         ///< 1..sched::kMaxPeers
  /// The job key: every packet is signed and verified with it (auth.h;
  /// payloads shrink by wire::kAuthSize). Null: no authentication. Every
  /// node of a job has it or none does; transport.seq_salt must then be
  /// derive_seq_salt(key) on every node (job::endpoint_config does it).
  std::shared_ptr<const std::array<uint8_t, 32>> auth_key;
};

/// How a message ended, as its completion reports it.
enum class SendStatus : uint8_t {
  kDelivered,        ///< every byte was acknowledged by the peer
  kPeerTimeout,      ///< the peer acknowledged nothing for peer_timeout_us
  kPeerRestarted,    ///< the peer came back with a new epoch; its state was lost
  kReset,            ///< our stream to the peer was reset (reincarnation)
  kPeerUnreachable,  ///< the peer never answered within connect_timeout_us
};
std::string_view send_status_name(SendStatus s);

/// What a completion receives. `error` names the peer and is empty on
/// success; it stays valid for the endpoint's lifetime.
struct SendResult {
  uint64_t cookie = 0;
  uint16_t peer = 0;
  uint32_t len = 0;
  SendStatus status = SendStatus::kDelivered;
  std::string_view error;
  bool ok() const { return status == SendStatus::kDelivered; }
};

/// Runs on the net core when a message has ended, exactly once per message
/// that send() accepted. Must not block; may call send().
using SendCallback = void (*)(void* context, const SendResult& result);
struct Completion {
  SendCallback fn = nullptr;  ///< may be null: nobody is told
  void* context = nullptr;
  uint64_t cookie = 0;
};

/// Header fields the application chooses (the transport fills the rest).
struct MessageMeta {
  wire::PacketType type = wire::PacketType::kData;
  wire::Dtype dtype = wire::Dtype::kBytes;
  uint32_t block_key = 0;
  uint32_t iteration = 0;
  uint32_t param_version = 0;
};

enum class SubmitStatus : uint8_t {
  kQueued,        ///< the completion will run exactly once
  kNoDescriptor,  ///< max_messages messages are queued or in flight: retry later
  kIngressFull,   ///< ingress_capacity reached: retry later
  kInvalid,       ///< peer out of range, priority >= 64, a kAck or kPartitionStart type (the
                  ///< endpoint's own), or null data with len > 0; for send_slice also: see there
};

/// Where received messages go; implemented by the application, called on the
/// net core inside poll_st(). PacketReceiver below is the packet-level
/// alternative; an endpoint may have either or both (see Receivers).
class MessageReceiver {
 public:
  /// The first accepted packet of a new message from `peer` (h carries the
  /// message fields: type, dtype, block_key, iteration, param_version,
  /// msg_id, msg_len). Return a buffer of at least h.msg_len bytes that stays
  /// valid until on_message_complete or on_message_abandoned, or null to
  /// refuse the message (counted; its bytes are acknowledged and discarded,
  /// and neither call below is made for it).
  virtual std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) = 0;
  /// Every byte of the message is in `buffer`: called exactly once. `h` is
  /// the header of the packet that completed it.
  virtual void on_message_complete(uint16_t peer, const wire::HeaderFields& h,
                                   std::byte* buffer) = 0;
  /// The peer restarted with the message incomplete: the buffer is released.
  virtual void on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte* buffer) {
    (void)peer, (void)msg_id, (void)buffer;
  }

 protected:
  ~MessageReceiver() = default;
};

/// Where received packets go one by one, with their buffers: the parameter
/// server's shard cores aggregate each chunk as it arrives and hold its
/// payload (the buffer) until every worker's copy is there. Called on the
/// net core inside poll_st().
class PacketReceiver {
 public:
  /// Called exactly once per data packet that the transport accepted (new,
  /// in its window, not a duplicate) and that is routed here (Receivers), after
  /// the transport has taken it into its acknowledgement state: the packet
  /// will not be offered again, whatever happens to it here. `payload`
  /// (h.payload_len bytes, at byte h.offset of a message of h.msg_len bytes)
  /// lies inside `buf`, the port's buffer. Return true to take it: the
  /// receiver then gives it back to the port (PacketPort::release_st on the
  /// net core; for an Interface `buf` is the rte_mbuf, net::mbuf_of(), which
  /// rte_pktmbuf_free may free on any thread) and the payload stays valid
  /// until then. Return false and the endpoint releases it after the call.
  /// Must not block; may call send().
  virtual bool on_packet(uint16_t peer, const wire::HeaderFields& h,
                         std::span<const std::byte> payload, net::PacketBuf* buf) = 0;
  /// Flow control, asked before the transport records a data packet that it
  /// would accept as new (current epoch, in the receive window, not known to
  /// be a duplicate) and that is routed here. Return false to refuse it: the
  /// packet is dropped without entering the acknowledgement state (counted,
  /// EndpointDrop::kBackpressure; only its piggybacked ACK is processed), so
  /// its sender sees it as lost and resends it later, when it is offered
  /// again. True lets it through to on_packet() as usual. Must not block.
  /// The endpoint knows a packet beyond the 64 sequence numbers of its SACK
  /// bitmap to be new only after the transport has recorded it, so such a
  /// duplicate may be offered here too (refusing it is harmless: its first
  /// copy is recorded and will be acknowledged).
  virtual bool admit(uint16_t peer, const wire::HeaderFields& h) {
    (void)peer, (void)h;
    return true;
  }
  /// The peer came back with a new epoch: whatever partial state the
  /// receiver keeps for its old incarnation will not be completed by it.
  virtual void on_peer_restarted(uint16_t peer) { (void)peer; }

 protected:
  ~PacketReceiver() = default;
};

/// The receivers of an endpoint; at least one. A packet the transport
/// accepted goes:
///  * if it is a kPartitionStart, nowhere (its acknowledgement is the answer;
///    EndpointCounters::partition_starts_received);
///  * if it carries wire::flags::kSlice, to `packets` (there is no message
///    to assemble);
///  * otherwise, to `packets` if set, except control packets while `messages`
///    is also set (a server aggregates data per packet but takes its
///    declare/barrier control messages whole);
///  * otherwise to `messages`.
/// A packet with no receiver for it is dropped (EndpointDrop::kNoReceiver),
/// acknowledged all the same.
struct Receivers {
  MessageReceiver* messages = nullptr;
  PacketReceiver* packets = nullptr;
};

/// Why the endpoint itself dropped or refused something (the Peer's verdicts
/// and the port's drops are counted where they happen).
enum class EndpointDrop : uint8_t {
  kUnknownPeer,      ///< a valid Mercury packet from an address that is no peer of ours
  kRefused,          ///< payload of a message the receiver refused (on_message_begin null)
  kRxTableFull,      ///< no slot for another message in progress (cannot happen when sized)
  kStageFailed,      ///< the port could not stage it (no buffer): the packet is lost, RTO resends
  kRetransmitStale,  ///< a queued retransmission no longer needed (acked or failed meanwhile)
  kNoReceiver,       ///< accepted, but no receiver for it (a slice without a PacketReceiver)
  kBackpressure,     ///< PacketReceiver::admit refused a new packet: not acknowledged, resent later
  kWrongJob,         ///< a Mercury packet whose job_id is not this endpoint's (another job's)
  kAuthMissing,      ///< with a job key: a packet without a MAC
  kAuthBadMac,       ///< with a job key: a MAC that does not verify (forged, corrupted, other key)
  kAuthReplay,       ///< with a job key: a counter taken already, or too old (a replay)
  kAuthUnexpected,   ///< without a job key: a packet with a MAC (a peer configured differently)
  kCount,
};
inline constexpr size_t kEndpointDropCount = static_cast<size_t>(EndpointDrop::kCount);
std::string_view endpoint_drop_name(EndpointDrop d);

// Every endpoint counter, once: the struct, its sum and every reader walk it.
#define MERCURY_ENDPOINT_COUNTERS(X)                                                   \
  X(passes, "poll passes")                                                             \
  X(rx_packets, "Mercury packets taken from the port")                                 \
  X(tx_data, "first transmissions (data, control, partition start-ups)")               \
  X(tx_retransmits, "resends")                                                         \
  X(tx_pure_acks, "pure ACKs and probes")                                              \
  X(resends_not_needed, "Peer::resend answered kNotNeeded")                            \
  X(resends_no_room, "Peer::resend answered kNoRoom (requeued, tried after an ACK)")   \
  X(resends_window_blocked, "resends sent directly while the window was full")         \
  X(resends_left_edge, "lost left edges resent directly (PeerSender::left_edge_lost)") \
  X(deferred, "carved while the peer's window was full: requeued")                     \
  X(requeue_stashed, "the scheduler's retransmission queue was full")                  \
  X(messages_completed, "sends delivered")                                             \
  X(messages_failed, "sends failed")                                                   \
  X(messages_received, "on_message_complete calls")                                    \
  X(messages_abandoned, "on_message_abandoned calls")                                  \
  X(partition_starts_received, "partition start-ups acknowledged (never delivered)")   \
  X(packets_delivered, "PacketReceiver::on_packet calls")                              \
  X(packets_kept, "PacketReceiver::on_packet calls that took the buffer")              \
  X(rx_paused, "passes whose receive burst the caller skipped (poll_st(now, false))")  \
  X(timers_deferred, "passes that put the timers off: the RX queue not drained")       \
  X(slices_submitted, "send_slice() calls that queued")                                \
  X(submit_no_descriptor, "send() refused: max_messages queued or in flight")          \
  X(submit_ingress_full, "send() refused: ingress_capacity reached")                   \
  X(submit_invalid, "send() refused: invalid arguments")

struct EndpointCounters {
  MERCURY_ENDPOINT_COUNTERS(MERCURY_COUNTER_DECLARE)
  std::array<uint64_t, kRxVerdictCount> verdicts{};  ///< Peer::on_packet, every packet
  std::array<uint64_t, kEndpointDropCount> drops{};

  /// f(prefix, name, value) for every counter; the arrays as verdict_<name>
  /// and drop_<name> (see base/counter_list.h).
  template <class F>
  void for_each(F&& f) const {
    MERCURY_ENDPOINT_COUNTERS(MERCURY_COUNTER_VISIT)
    base::visit_array(f, "verdict_", verdicts,
                      [](size_t i) { return verdict_name(static_cast<RxVerdict>(i)); });
    base::visit_array(f, "drop_", drops,
                      [](size_t i) { return endpoint_drop_name(static_cast<EndpointDrop>(i)); });
  }
  EndpointCounters& operator+=(const EndpointCounters& o) {
    MERCURY_ENDPOINT_COUNTERS(MERCURY_COUNTER_ADD)
    base::add_array(verdicts, o.verdicts);
    base::add_array(drops, o.drops);
    return *this;
  }
  [[nodiscard]] uint64_t drop(EndpointDrop d) const { return drops[static_cast<size_t>(d)]; }
};

// What the endpoint counts per peer, beside the Peer's own counters.
#define MERCURY_ENDPOINT_PEER_COUNTERS(X)                                            \
  X(messages_sent, "sends delivered")                                                \
  X(messages_failed, "sends failed")                                                 \
  X(messages_received, "messages placed whole (on_message_complete)")                \
  X(messages_refused, "messages the MessageReceiver refused")                        \
  X(packets_delivered, "PacketReceiver::on_packet calls")                            \
  X(packets_refused, "PacketReceiver::admit refusals (EndpointDrop::kBackpressure)") \
  X(bytes_received, "payload bytes placed or delivered")
// Its state, as current values.
#define MERCURY_ENDPOINT_PEER_GAUGES(X)                                        \
  X(uint32_t, outstanding, "sequence numbers sent and not cumulatively acked") \
  X(uint32_t, waiting_resend, "packets declared lost and not yet resent")      \
  X(bool, resolved, "a route (ARP) is known")                                  \
  X(bool, dead, "the peer stopped answering, or never did")

struct EndpointPeerStats {
  PeerCounters transport;  ///< the Peer's own counters
  MERCURY_ENDPOINT_PEER_COUNTERS(MERCURY_COUNTER_DECLARE)
  MERCURY_ENDPOINT_PEER_GAUGES(MERCURY_GAUGE_DECLARE)

  /// f(prefix, name, value): the Peer's counters (see PeerCounters), then
  /// the endpoint's, then the gauges.
  template <class F>
  void for_each(F&& f) const {
    transport.for_each(f);
    MERCURY_ENDPOINT_PEER_COUNTERS(MERCURY_COUNTER_VISIT)
    MERCURY_ENDPOINT_PEER_GAUGES(MERCURY_GAUGE_VISIT)
  }
  /// Sums the counters (over peers, say); the gauges keep this side's values.
  EndpointPeerStats& operator+=(const EndpointPeerStats& o) {
    transport += o.transport;
    MERCURY_ENDPOINT_PEER_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

class Endpoint {
 public:
  /// Control path. `port` and `receiver` must outlive the endpoint, and the
  /// calling thread then owns the port through poll_st(). `now` is the
  /// current TSC. Throws std::invalid_argument on a bad configuration.
  Endpoint(net::PacketPort& port, const EndpointConfig& config, MessageReceiver& receiver,
           Tick now);
  /// The same with packet-level delivery, or both (see Receivers). Throws
  /// std::invalid_argument if neither is given.
  Endpoint(net::PacketPort& port, const EndpointConfig& config, PacketReceiver& receiver, Tick now);
  Endpoint(net::PacketPort& port, const EndpointConfig& config, const Receivers& receivers,
           Tick now);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// Any thread, lock-free. Queues `len` bytes at `data` (kept alive and
  /// unchanged by the caller until the completion) for peer `peer` at
  /// `priority` (0 = most urgent, < sched::kPriorityLevels). On kQueued the
  /// completion runs exactly once, on the net core; otherwise never. A
  /// zero-length message (data may then be null) is an ordinary message of
  /// its type: it travels as one empty packet and is delivered as such.
  SubmitStatus send(uint16_t peer, const std::byte* data, uint32_t len, uint8_t priority,
                    const MessageMeta& meta, const Completion& done);

  /// Any thread, lock-free: like send(), for `len` bytes at `data` that are
  /// bytes [base_offset, base_offset + len) of a logical message of
  /// `logical_len` bytes (a block). Each packet's header carries offset =
  /// base_offset + its offset in the part, msg_len = logical_len and
  /// wire::flags::kSlice; the receiving endpoint delivers it to its
  /// PacketReceiver. The completion means every byte of the part was
  /// acknowledged. kInvalid also when len is 0, base_offset + len exceeds
  /// logical_len, meta.type is not kData or kAggData, meta.dtype is not a
  /// wire::Dtype, or base_offset, len or logical_len is not a multiple of
  /// the dtype's element size (4 for float32, 2 for bfloat16 and float16).
  SubmitStatus send_slice(uint16_t peer, const std::byte* data, uint32_t len, uint32_t base_offset,
                          uint32_t logical_len, uint8_t priority, const MessageMeta& meta,
                          const Completion& done);

  /// Control path: the net core that polled the endpoint has stopped (its
  /// thread joined); its _st functions, and the scheduler's consumer side,
  /// belong to the next thread that calls one (base/owner.h).
  void hand_over() {
    owner_.hand_over();
    sched_->hand_over_consumer();
    if (auth_) auth_->hand_over();
  }

  /// Net core: one pass of the poll loop at TSC `now`. Returns the packets
  /// received plus sent, so an idle loop can back off when it returns 0.
  /// `receive` false skips the receive burst (the packets wait in the
  /// port's RX queue): a receiver that cannot take more for a moment says so
  /// this way rather than refuse packets that then must be resent.
  uint32_t poll_st(Tick now, bool receive = true);

  /// Net core, before it stops polling: acknowledges at once everything
  /// received and not yet acknowledged (the delayed ACK would never go out),
  /// so no peer resends what arrived. Returns the pure ACKs sent.
  uint32_t flush_acks_st(Tick now);

  /// Net core: nothing is queued, in flight or waiting to be acknowledged.
  bool idle_st() const;
  /// Net core: a peer waits for an ACK from us (due now or delayed).
  bool owes_acks_st() const;
  /// Net core: the earliest TSC at which a Peer's timer or delayed ACK has
  /// work (for an idle back-off: sleep until then unless packets arrive);
  /// 0 if nothing is armed.
  Tick next_deadline_st() const;
  EndpointCounters counters_st() const;
  EndpointPeerStats peer_stats_st(uint16_t peer) const;
  uint16_t num_peers() const { return static_cast<uint16_t>(peers_.size()); }
  const PeerSpec& peer_spec(uint16_t peer) const;
  /// Payload bytes per data packet (from the port's MTU).
  uint32_t max_payload() const { return max_payload_; }
  const sched::PortScheduler& scheduler() const { return *sched_; }

 private:
  struct PeerState;  // peer_state.h
  // The lost map (endpoint_tx.cpp): (slice token, offset) -> the seq of the
  // lost packet carrying the slice, or "deferred" for a slice carved while
  // its peer's window was full.
  struct LostKey {
    uint64_t token;  // 0: an empty slot (a token is never 0)
    uint32_t offset;
    bool operator==(const LostKey&) const = default;
  };
  struct LostKeyTraits {
    using Key = LostKey;
    static constexpr Key kEmpty{};
    static bool is_empty(const Key& k) { return k.token == 0; }
    static size_t hash(const Key& k) {
      // Tokens are 64-byte aligned descriptor addresses: drop the zero bits.
      return static_cast<size_t>(
          ((k.token >> 6) * 0x9E3779B97F4A7C15ull ^ uint64_t{k.offset} * 0xC2B2AE3D27D4EB4Full) >>
          32);
    }
  };
  struct LostEntry {
    uint32_t seq = 0;
    bool deferred = false;
  };
  using LostMap = FlatMap<LostKeyTraits, LostEntry>;
  static_assert(sizeof(LostMap::Slot) == 24, "docs/transport.md quotes the lost map's slot size");
  struct Record {
    SendCallback fn = nullptr;
    void* context = nullptr;
    uint32_t stream = 0;                         // the sender stream its first slice went on
    bool started = false;                        // a slice has been sent
    SendStatus status = SendStatus::kDelivered;  // first failure wins
  };
  // Where a received packet goes (Receivers), decided once per packet by
  // route_of(): admission and placement both act on it.
  enum class RxRoute : uint8_t {
    kMessage,         // assembled for the MessageReceiver
    kPacket,          // to the PacketReceiver, admit() asked first
    kPartitionStart,  // its ACK is the answer, nothing is delivered
    kNone,            // no receiver for it (dropped once accepted, kNoReceiver); pure ACKs
  };

  // endpoint.cpp: submission and completions.
  static void on_complete(void* self, const sched::Message& msg);
  Record& record(const sched::Message* msg) { return records_[msg - base_]; }
  SubmitStatus submit(uint16_t peer, const std::byte* data, uint32_t len, uint32_t base_offset,
                      uint32_t logical_len, uint8_t priority, const MessageMeta& meta,
                      const Completion& done);
  void drop(EndpointDrop d) { ++counters_.drops[static_cast<size_t>(d)]; }

  // endpoint_rx.cpp: route once, admit, place, reassemble.
  // Returns the packets taken from the port (a full burst: more may wait).
  uint16_t receive_st(Tick now);
  RxRoute route_of(const wire::HeaderFields& h) const;
  // False when PacketReceiver::admit refused a packet the transport would
  // take as new (see there).
  bool admitted_st(const PeerState& ps, uint16_t peer, const wire::HeaderFields& h);
  void peer_restarted_st(PeerState& ps, uint16_t peer);
  // A kNew packet to where `route` says; true when the receiver took its buffer.
  bool place_st(PeerState& ps, uint16_t peer, const net::RxPacket& pkt, const RxResult& r,
                RxRoute route);
  bool deliver_packet_st(PeerState& ps, uint16_t peer, const net::RxPacket& pkt);
  void assemble_st(PeerState& ps, uint16_t peer, const net::RxPacket& pkt, bool complete);

  // endpoint_timers.cpp.
  void run_timers_st(Tick now);

  // endpoint_tx.cpp: transmit.
  void transmit_st(Tick now);
  void drain_dead_st(const sched::PeerMask& dead);
  // Serves one slice of a carved burst; false when its peer must sit out the
  // rest of the pass (it could not take the slice).
  bool serve_st(const sched::Slice& s, Tick now, uint32_t& sent);
  // The one resend path: Peer::resend of lost packet `seq`; on kSend it is
  // queued for TX and counted, and on kSend or kNotNeeded its lost-map entry
  // goes (`entry`, or when null the entry of the slice resent if it still
  // names `seq`). kNoRoom changes nothing: the caller keeps the request.
  Resend resend_st(PeerState& ps, uint32_t seq, LostMap::Slot* entry, Tick now);
  // Resends the peer's lost left edge, if any (PeerSender::left_edge_lost).
  uint32_t resend_left_edge_st(PeerState& ps, Tick now);
  // Resends lost packets of a peer whose window is full, oldest report first.
  uint32_t resend_blocked_st(PeerState& ps, Tick now, uint32_t budget);
  // The one fallback when the scheduler's retransmission queue is full.
  void requeue_or_stash_st(const sched::Slice& s);
  void retry_stash_st();
  bool eligible(const PeerState& ps) const;
  // Packets the peer may take now (>= 1 when eligible): window and cwnd
  // room, or cwnd room alone for resends when the window is full.
  uint32_t send_room(const PeerState& ps) const;
  void fill_header(const sched::Message& msg, bool start, uint32_t offset, uint32_t len,
                   wire::HeaderFields& h) const;
  // The TX batch: frames are built into tx_ and handed to the port a burst
  // at a time (one virtual call), never one by one.
  wire::HeaderFields& next_frame_header_st();
  void queue_frame_st(PeerState& ps, const std::byte* payload);
  // With a job key: the packet's MAC, counter and replay window checks;
  // false (counted) if it is to be dropped.
  bool authentic_st(PeerState& ps, const net::ParsedFrame& f);
  uint16_t stage_frames_st();
  // Pure ACKs (and probes) to the peers whose ACK is due, or with
  // `every_owed` to every peer owed one; staged and flushed. Returns them.
  uint32_t send_pure_acks_st(Tick now, bool every_owed);
  void account_failed(sched::Message* msg, bool start, uint32_t len, SendStatus why);

  // SenderSink reports, through each peer's PeerState (endpoint_tx.cpp).
  void acked(const SliceRef& slice);
  void lost(PeerState& ps, uint32_t seq, const SliceRef& slice);
  void failed(const SliceRef& slice, FailReason why);

  net::PacketPort& port_;
  EndpointConfig config_;
  MessageReceiver* messages_;
  PacketReceiver* packets_;
  uint32_t max_payload_;
  std::unique_ptr<Authenticator> auth_;  // null without a job key
  uint32_t rx_window_;                   // the Peers' receive window (Params::rx_window)
  std::unique_ptr<sched::MessagePool> pool_;
  std::unique_ptr<sched::PortScheduler> sched_;
  base::Owner owner_;                     // the net core (asserted by every public _st function)
  const sched::Message* base_ = nullptr;  // the pool's first descriptor
  sched::HugeArray<Record> records_;      // [descriptor index]
  std::vector<std::unique_ptr<PeerState>> peers_;
  std::vector<uint64_t> by_addr_;  // sorted (ip << 32 | port << 16 | peer index)
  std::unique_ptr<LostMap> lost_;
  std::vector<sched::Slice> stash_;  // requeues the scheduler refused (never when sized)
  std::vector<uint32_t> room_;       // [peer]: send_room() for next_slices_st
  uint64_t passes_ = 0;
  // Passes since the timers last ran; due from the first pass.
  uint32_t passes_since_timers_ = UINT32_MAX / 2;
  // The most passes the timers wait for the RX queue to drain.
  static constexpr uint32_t kMaxTimerDeferral = 1024;
  // The RX burst and the TX batch live here, not on the stack:
  // value-initialising 32 parsed frames on every pass cost more than the
  // rest of an idle pass.
  std::array<net::RxPacket, net::PacketPort::kBurst> rx_{};
  std::array<net::TxFrame, net::PacketPort::kStage> tx_{};
  uint16_t tx_count_ = 0;  // frames in tx_ not yet staged
  alignas(64) std::atomic<uint32_t> next_msg_id_{1};
  std::atomic<uint64_t> submit_no_descriptor_{0};
  std::atomic<uint64_t> submit_ingress_full_{0};
  std::atomic<uint64_t> submit_invalid_{0};
  std::atomic<uint64_t> slices_submitted_{0};
  alignas(64) EndpointCounters counters_;
};

}  // namespace mercury::transport
