// The reliable transport: Mercury's per-peer protocol state machines over UDP.
//
// What it is for. Mercury carries its own lightweight transport (like eRPC):
// every packet to a peer gets a 32-bit sequence number; the peer answers with a
// cumulative ACK plus a 64-bit SACK bitmap, piggybacked on its own data where it
// can; lost packets are found by SACK gaps (a reordering threshold counted in
// transmissions, not go-back-N) or by an RFC 6298 retransmission timer; a
// bounded window (BDP-sized) plus a loss-driven congestion window keeps the NIC queue
// shallow so the priority scheduler above stays in charge; duplicates are
// suppressed in a bounded window; each message's bytes are counted so its
// completion is reported exactly once; a peer that stops acknowledging is
// declared dead and everything pending for it fails instead of hanging.
// docs/transport.md gives the protocol, formulas and decisions.
//
// What it is not. This is pure protocol logic: no DPDK, no mbufs, no payload
// copies, no scheduler. The glue (the net core loop) parses packets with
// lib/wire, calls in here with plain values, places payloads where a verdict
// says so, requeues lost slices in the scheduler and builds the packets.
//
// Threads. A Peer (and the PeerSender / PeerReceiver inside it) belongs to the
// one lcore that owns that peer's traffic; nothing here is shared or
// synchronised, so no method may be called from another thread. Because every
// method has the same single-owner contract, none carries an `_st` suffix.
// Time is a parameter (`now`, TSC ticks; the tick rate is in Config), so the
// state machines run under a fake clock in tests.
//
// Costs. Construction (control path) allocates every table once and may throw
// std::invalid_argument. After that no call allocates, throws, locks or logs.
// Per packet: send O(1); data receive O(1) amortised (a few bit operations and
// one hash probe); ACK processing O(newly acked + newly lost + 1) plus one
// 64-bit SACK walk; the timer O(packets in flight) only when it fires.
// Memory per peer: ~48 B x pow2(window) on the send side; 2 x pow2(2 x
// rx_window) bits plus 16 B x pow2(2 x rx_messages) on the receive side.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "telemetry/counter_list.h"
#include "transport/flat_map.h"
#include "wire/header.h"

namespace mercury::transport {

/// Time in TSC ticks (Config::tsc_hz per second).
using Tick = uint64_t;

// ---------------------------------------------------------------------------
// Sequence-number and epoch arithmetic (RFC 1982 serial numbers).

/// Signed distance a - b on the 32-bit sequence circle: correct across the
/// wrap as long as the two are less than 2^31 apart.
constexpr int32_t seq_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b); }
constexpr bool seq_before(uint32_t a, uint32_t b) { return seq_diff(a, b) < 0; }
/// True if epoch `a` is a later incarnation than `b` (16-bit serial compare).
constexpr bool epoch_newer(uint16_t a, uint16_t b) {
  return static_cast<int16_t>(static_cast<uint16_t>(a - b)) > 0;
}

/// The first sequence number of the stream that a sender of epoch
/// `sender_epoch` runs towards a receiver of epoch `receiver_epoch`. Both ends
/// compute it once they know each other's epoch, so no sequence number is
/// negotiated; a bijective mix spreads the streams of different incarnation
/// pairs across the sequence space, so the leftovers of a stream meant for an
/// earlier incarnation fall outside the new stream's window. `salt` is
/// job-wide (Config::seq_salt).
uint32_t initial_seq(uint16_t sender_epoch, uint16_t receiver_epoch, uint32_t salt);

// ---------------------------------------------------------------------------
// Configuration.

/// Largest window (send or receive) in packets.
inline constexpr uint32_t kMaxWindow = 1u << 16;
/// Largest reordering threshold (packets), adaptive or configured.
inline constexpr uint32_t kMaxReorderThreshold = 32;
static_assert((kMaxReorderThreshold & (kMaxReorderThreshold - 1)) == 0, "a ring of pow2 size");

/// What the operator sets. Durations are in microseconds; resolve() turns them
/// into ticks. Both ends of a job must use the same seq_salt.
struct Config {
  uint64_t tsc_hz = 0;  ///< required: TSC ticks per second

  // Window: packets in flight per peer. 0 derives it from the link:
  // ceil(link_bits_per_sec * base_rtt / (8 * packet_bytes)), clamped to
  // [window_floor, window_ceiling].
  uint32_t window_packets = 0;
  uint64_t link_bits_per_sec = 10'000'000'000;
  uint32_t base_rtt_us = 50;
  uint32_t packet_bytes = 9000;  ///< bytes on the wire of a full packet
  uint32_t window_floor = 8;
  uint32_t window_ceiling = 512;
  uint32_t cwnd_floor = 2;  ///< the congestion response never cuts the congestion window below this

  // Loss detection.
  uint32_t reorder_threshold = 3;       ///< lost once this many later transmissions are acked
  uint32_t max_reorder_threshold = 16;  ///< adaptive ceiling (<= kMaxReorderThreshold)
  uint32_t initial_rto_us = 5'000;      ///< RTO before the first RTT sample
  uint32_t min_rto_us = 1'000;
  uint32_t max_rto_us = 200'000;
  uint32_t peer_timeout_us = 3'000'000;  ///< no progress this long with data out: peer dead
  /// A Peer that has not learnt its peer's epoch this long after creation is
  /// dead. 0: wait for ever (a server waiting for its workers).
  uint32_t connect_timeout_us = 0;

  // Acknowledgements.
  uint32_t ack_every = 4;      ///< ack at least every k packets received
  uint32_t ack_delay_us = 20;  ///< ... and no later than this after the first unacked one

  // Receive side. 0 = same as the resolved send window.
  uint32_t rx_window_packets = 0;
  /// Messages in progress per peer; 0 = window + 64. Must cover the sender's
  /// window plus the messages it can leave partly sent (one per priority level
  /// for the strict scheduler), or packets are refused (kMessageTableFull).
  uint32_t rx_messages = 0;

  uint32_t seq_salt = 0;  ///< job-wide; see initial_seq()
};

/// Config resolved into ticks and sizes; what the state machines read.
struct Params {
  uint32_t window = 0;
  uint32_t cwnd_floor = 0;
  uint32_t reorder_threshold = 0;
  uint32_t max_reorder_threshold = 0;
  uint32_t ack_every = 0;
  uint32_t rx_window = 0;
  uint32_t rx_messages = 0;
  uint32_t seq_salt = 0;
  Tick initial_rto = 0;
  Tick min_rto = 0;
  Tick max_rto = 0;
  Tick peer_timeout = 0;
  Tick connect_timeout = 0;  ///< 0: none
  Tick ack_delay = 0;
};

/// Window in packets for a link: the bandwidth-delay product in packets,
/// rounded up, clamped to [floor, ceiling].
uint32_t bdp_window(uint64_t link_bits_per_sec, uint32_t base_rtt_us, uint32_t packet_bytes,
                    uint32_t floor, uint32_t ceiling);

/// Control path: validates and converts. Throws std::invalid_argument naming
/// the offending field.
Params resolve(const Config& config);

// ---------------------------------------------------------------------------
// Sender side.

/// One packet's worth of a message, as the glue hands it to the sender. The
/// transport never reads payload; it keeps the reference to hand back on ack,
/// loss or failure.
struct SliceRef {
  uint64_t msg_token = 0;  ///< the glue's handle on the message (e.g. its descriptor)
  uint32_t offset = 0;     ///< byte offset in the message
  uint32_t len = 0;        ///< payload bytes
  uint8_t priority = 0;    ///< the message's priority: a retransmission keeps it

  bool operator==(const SliceRef&) const = default;
};

enum class LossKind : uint8_t {
  kFast,     ///< SACK gap: reorder_threshold later transmissions were delivered
  kTimeout,  ///< the retransmission timer expired
  /// Tail probe: the resent left edge went unanswered for a probe timeout
  /// (max(2 SRTT, SRTT + 4 RTTVAR) + ack delay, doubling per probe, at most
  /// the RTO). Its resend
  /// may itself have been lost, and nothing sent after it would show that;
  /// no congestion signal (cwnd unchanged).
  kProbe,
};

enum class FailReason : uint8_t {
  kPeerTimeout,    ///< nothing acknowledged for peer_timeout while data was out
  kPeerRestarted,  ///< the peer came back with a new epoch: its state is gone
  kReset,          ///< the glue restarted the stream
};
std::string_view fail_reason_name(FailReason r);

/// Where the sender reports what happened to slices. Every slice handed to
/// on_send() ends exactly once in on_acked() or on_failed(); before that it may
/// go through on_lost() any number of times. Implementations run on the
/// owning lcore, inside the sender's call: they must not call back into it.
class SenderSink {
 public:
  /// The slice reached the peer (cumulatively acked or SACKed; the receiver
  /// never reneges). The glue counts it towards its message's completion.
  virtual void on_acked(const SliceRef& slice) = 0;
  /// The packet `seq` carrying `slice` is presumed lost. The glue requeues it
  /// at slice.priority and later calls PeerSender::on_resend(seq, ...), which
  /// may answer "no longer needed" if a late ACK got there first.
  virtual void on_lost(uint32_t seq, const SliceRef& slice, LossKind kind) = 0;
  /// The slice will never be delivered: fail its message with `why`, naming
  /// the peer.
  virtual void on_failed(const SliceRef& slice, FailReason why) = 0;

 protected:
  ~SenderSink() = default;
};

/// What to put in the header of a packet being sent.
struct TxStamp {
  uint32_t seq = 0;
  uint16_t flags = 0;  ///< transport flags to OR into the header (kRetransmit, kAckRequest)
};

/// What on_resend() decided.
enum class Resend : uint8_t {
  kSend,       ///< send it now: `slice` and `stamp` are filled
  kNotNeeded,  ///< drop the request: a late ACK delivered it, or the stream failed or restarted
  kNoRoom,     ///< cwnd is full: keep the request and try again after an ACK
};

/// What one ACK did.
struct AckResult {
  uint32_t newly_acked = 0;  ///< packets delivered for the first time
  uint32_t newly_lost = 0;   ///< packets newly declared lost by the SACK rule
  bool rtt_sampled = false;  ///< an RTT sample was taken (never from a retransmission)
  bool ignored = false;      ///< the ACK was out of range (or the peer is dead): nothing done
};

// Per-peer send-side counters: events, summed by operator+=.
#define MERCURY_SENDER_COUNTERS(X)                                             \
  X(packets_sent, "first transmissions")                                       \
  X(retransmits_fast, "resends of packets lost by the SACK rule")              \
  X(retransmits_timeout, "resends of packets lost by RTO or the tail probe")   \
  X(losses_fast, "packets declared lost by the SACK rule")                     \
  X(losses_timeout, "packets declared lost by RTO")                            \
  X(tail_probes, "left-edge resends declared lost by the probe timeout")       \
  X(false_losses, "declared lost, then acked before being resent")             \
  X(resends_skipped, "on_resend() refused: already acked, failed or unknown")  \
  X(acks_received, "ACKs processed")                                           \
  X(acks_old, "cumulative ack below ours (reordered ACK); SACK still used")    \
  X(acks_invalid, "ack beyond anything sent: ignored")                         \
  X(rto_expirations, "retransmission timer expiries")                          \
  X(loss_episodes, "loss episodes (each reduces cwnd, see docs/transport.md)") \
  X(slices_acked, "slices delivered")                                          \
  X(slices_failed, "slices failed")                                            \
  X(peer_timeouts, "peer declared dead: nothing acked for peer_timeout")       \
  X(restarts, "send streams restarted (the peer came back with a new epoch)")  \
  X(rtt_samples, "RTT samples taken")
// Its estimates: current values (ticks / packets), never summed.
#define MERCURY_SENDER_ESTIMATES(X)                      \
  X(Tick, srtt, "smoothed RTT, ticks")                   \
  X(Tick, rttvar, "RTT variation, ticks")                \
  X(Tick, min_rtt, "smallest RTT sample, ticks")         \
  X(Tick, rto, "retransmission timeout before back-off") \
  X(uint32_t, backoff, "RTO doublings in force")         \
  X(uint32_t, cwnd, "congestion window, packets")        \
  X(uint32_t, reorder_threshold, "adaptive reordering threshold, packets")

/// Per-peer send-side counters and estimates (plain values, read by telemetry
/// on the owning core or copied out).
struct SenderCounters {
  MERCURY_SENDER_COUNTERS(MERCURY_COUNTER_DECLARE)
  MERCURY_SENDER_ESTIMATES(MERCURY_GAUGE_DECLARE)

  /// f(prefix, name, value) for every counter, then every estimate.
  template <class F>
  void for_each(F&& f) const {MERCURY_SENDER_COUNTERS(MERCURY_COUNTER_VISIT)
                                  MERCURY_SENDER_ESTIMATES(MERCURY_GAUGE_VISIT)}
  /// Sums the counters; the estimates keep this side's values.
  SenderCounters&
  operator+=(const SenderCounters& o) {
    MERCURY_SENDER_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

/// The send half of a peer: sequence numbers, the in-flight table, loss
/// detection, RTO, window and congestion window, liveness.
class PeerSender {
 public:
  /// Control path: allocates the in-flight table (pow2 >= params.window).
  PeerSender(const Params& params, uint32_t initial_seq, Tick now);

  /// Room for a new packet: fewer than `window` sequence numbers outstanding
  /// and fewer than `cwnd` packets in flight, and the peer is not dead.
  bool can_send() const;
  /// Room to resend a lost packet: fewer than `cwnd` in flight, peer not dead.
  /// (A resend reuses its sequence number, so the window does not limit it.)
  /// The left edge (see left_edge_lost) may be resent even without room.
  bool can_resend() const;

  /// The oldest unacknowledged packet (the left edge of the window, `seq`)
  /// was declared lost and waits for its resend. It holds the cumulative ACK,
  /// and with it the window, and the receiver can report at most 64 packets
  /// beyond it, so packets further on stay "in flight" until it arrives: if
  /// they fill cwnd, only this resend can make progress. on_resend() therefore
  /// sends it whatever cwnd says (one packet over cwnd at most), and the glue
  /// must resend it at once, ahead of any priority.
  bool left_edge_lost(uint32_t& seq) const;

  /// Records the first transmission of `slice`. Precondition: can_send()
  /// (asserted in debug builds; the glue checks it before carving a slice).
  /// Returns the seq for the header; flags carry kAckRequest when this packet
  /// fills the window, so the receiver answers at once.
  TxStamp on_send(const SliceRef& slice, Tick now);

  /// Records a retransmission of packet `seq` that on_lost() reported. On
  /// kSend, `slice` is what to send (the transport's record is the truth) and
  /// `stamp` carries the same seq plus kRetransmit. kNotNeeded (counted in
  /// resends_skipped): the packet no longer waits to be resent. kNoRoom: the
  /// congestion window is full and `seq` is not the left edge; nothing changed. A packet reported
  /// lost stays waiting until resent, acked or failed: the glue must not drop the request.
  Resend on_resend(uint32_t seq, Tick now, SliceRef& slice, TxStamp& stamp);

  /// For glue that cannot carry the seq through its retransmission queue:
  /// finds the lost packet carrying (msg_token, offset). O(window) scan;
  /// returns false if no such packet waits to be resent.
  bool find_lost(uint64_t msg_token, uint32_t offset, uint32_t& seq) const;

  /// Feeds an acknowledgement (a pure ACK or one piggybacked on data):
  /// `cum_ack` = every seq below it was received; bit i of `sack` = seq
  /// cum_ack+1+i was received. Reports newly delivered slices (on_acked) and
  /// newly lost ones (on_lost), takes an RTT sample, adjusts cwnd.
  AckResult on_ack(uint32_t cum_ack, uint64_t sack, Tick now, SenderSink& sink);

  /// Slow work, every few poll passes: the tail probe (a resent left edge
  /// unanswered for the probe timeout is declared lost again, kProbe), RTO
  /// expiry (mark lost, back off) and liveness (declare the peer dead, fail
  /// every pending slice).
  void on_timer(Tick now, SenderSink& sink);

  /// Moves the origin of a stream that has sent nothing yet (a Peer learns
  /// its peer's epoch, which keys the stream, after construction).
  void rebase(uint32_t initial_seq);

  /// Fails every pending slice with `why` and starts a fresh stream at
  /// `initial_seq` (RTT estimates are kept: the path has not changed).
  void restart(uint32_t initial_seq, Tick now, FailReason why, SenderSink& sink);

  bool dead() const { return dead_; }
  uint32_t next_seq() const { return nxt_; }
  uint32_t oldest_unacked() const { return una_; }
  /// Sequence numbers sent and not yet cumulatively acked.
  uint32_t outstanding() const { return nxt_ - una_; }
  uint32_t in_flight() const { return in_flight_; }
  uint32_t waiting_resend() const { return lost_; }
  uint32_t window() const { return window_; }
  uint32_t cwnd() const { return cwnd_; }
  /// Current retransmission timeout including back-off.
  Tick rto() const;
  /// When on_timer() next has work (tail probe, RTO or liveness); 0 if
  /// nothing is armed.
  Tick next_deadline() const;
  const SenderCounters& counters() const { return counters_; }

 private:
  enum class State : uint8_t { kFree, kInFlight, kLost, kSacked };
  struct Entry {
    SliceRef slice;
    Tick sent_at = 0;       // last transmission
    uint64_t tx_order = 0;  // order of the last transmission among all of this sender's
    State state = State::kFree;
    uint8_t transmissions = 0;
    LossKind loss_kind = LossKind::kFast;
  };
  static_assert(sizeof(Entry) == 48, "docs/transport.md quotes the in-flight entry size");

  Entry& at(uint32_t seq) { return ring_[seq & mask_]; }
  const Entry& at(uint32_t seq) const { return ring_[seq & mask_]; }
  bool in_range(uint32_t seq) const { return seq_diff(seq, una_) >= 0 && seq_diff(seq, nxt_) < 0; }
  struct RttCandidate {
    bool valid = false;
    Tick sent_at = 0;
  };
  void deliver(Entry& e, Tick now, SenderSink& sink, RttCandidate& rtt);
  void note_delivered_order(uint64_t tx_order);
  uint32_t detect_losses(SenderSink& sink);
  void mark_lost(uint32_t seq, Entry& e, LossKind kind, SenderSink& sink);
  void on_losses(uint32_t lost, LossKind kind);
  void rtt_sample(Tick rtt);
  void fail_all(FailReason why, SenderSink& sink);
  void arm_timer(Tick now);
  // The probe timeout of the left edge after `transmissions` sends of it.
  Tick probe_timeout(uint8_t transmissions) const;
  // The resent left edge waits for its probe (0: nothing to probe).
  Tick probe_deadline() const;

  Params p_;
  std::vector<Entry> ring_;  // indexed by seq & mask_; live entries are [una_, nxt_)
  uint32_t mask_;
  uint32_t window_;
  uint32_t una_;
  uint32_t nxt_;
  uint32_t in_flight_ = 0;  // entries in kInFlight (the "pipe")
  uint32_t lost_ = 0;       // entries in kLost (handed to the glue, not yet resent)
  uint32_t cwnd_;
  uint32_t cwnd_acked_ = 0;  // packets acked since the last additive increase
  bool in_recovery_ = false;
  uint32_t recovery_end_ = 0;  // the loss episode ends when una_ reaches it
  uint32_t episode_cwnd_ = 0;  // cwnd when the episode began: it may cut to half of it
  uint32_t reorder_threshold_;
  uint64_t next_tx_order_ = 1;
  // The kMaxReorderThreshold highest tx_orders ever delivered, descending
  // from delivered_top_[top_head_] round the ring: the k-th entry is the k-th
  // most recent transmission known to have arrived.
  std::array<uint64_t, kMaxReorderThreshold> delivered_top_{};
  uint32_t top_head_ = 0;
  Tick srtt_ = 0;
  Tick rttvar_ = 0;
  Tick rto_;
  bool has_rtt_ = false;
  uint32_t backoff_ = 0;
  bool timer_armed_ = false;
  Tick rto_deadline_ = 0;
  Tick progress_at_;  // last delivery, or when data became outstanding
  bool dead_ = false;
  SenderCounters counters_;
};

// ---------------------------------------------------------------------------
// Receiver side.

/// What to do with a received packet.
enum class RxVerdict : uint8_t {
  kNew,               ///< first copy: place payload at (msg_id, offset)
  kDuplicate,         ///< already received (below the cumulative ack or SACKed): drop
  kOutOfWindow,       ///< beyond the receive window: drop (the sender will resend)
  kStaleEpoch,        ///< from an older incarnation of the peer: drop, ack ignored
  kUnsynced,          ///< not in any stream the peer may have started towards us: drop
  kMessageTableFull,  ///< no room to track another message in progress: drop, not acked
  kBadMessage,        ///< contradicts the message in progress (msg_len, byte count): drop
  kAckOnly,           ///< a pure ACK (Peer::on_packet): nothing to place
  kCount,
};
inline constexpr size_t kRxVerdictCount = static_cast<size_t>(RxVerdict::kCount);
std::string_view verdict_name(RxVerdict v);

struct RxResult {
  RxVerdict verdict = RxVerdict::kNew;
  /// With kNew: this packet completed its message (every byte of msg_len has
  /// now been placed). Reported exactly once per message. Never for a packet
  /// carrying wire::flags::kSlice: slices get no message accounting.
  bool message_complete = false;
  /// The peer came back with a newer epoch: every message in progress from
  /// it was abandoned (the glue frees their buffers). Peer also restarts the
  /// send stream towards it.
  bool peer_restarted = false;
  uint8_t reserved = 0;  ///< makes the result one 32-bit word (of())

  /// The result in one register. Built field by field in memory, GCC reads
  /// it back as one wider load, which cannot be forwarded from the narrow
  /// stores: the load then waits for every store before it to drain, the
  /// payload copies of the packets before included (a tenth of a memif
  /// receiver's time went there).
  static RxResult of(RxVerdict verdict, bool message_complete, bool peer_restarted) {
    const uint32_t bits = uint32_t{static_cast<uint8_t>(verdict)} |
                          uint32_t{message_complete} << 8 | uint32_t{peer_restarted} << 16;
    return std::bit_cast<RxResult>(bits);
  }
};
static_assert(sizeof(RxResult) == 4 && std::is_trivially_copyable_v<RxResult>);

/// How a packet's epoch relates to what the receiver knows of its peer.
enum class EpochCheck : uint8_t {
  kCurrent,    ///< the known incarnation
  kAdopted,    ///< first packet ever from this peer: now known
  kRestarted,  ///< a newer incarnation: receive state reset
  kStale,      ///< an older incarnation (or the invalid epoch 0): drop
};

#define MERCURY_RECEIVER_COUNTERS(X)                                                      \
  X(packets_accepted, "kNew verdicts")                                                    \
  X(bytes_accepted, "payload bytes of kNew packets")                                      \
  X(slice_packets, "kNew verdicts for wire::flags::kSlice packets (no message count)")    \
  X(duplicates, "copies already received")                                                \
  X(spurious_retransmits, "duplicates with one copy a retransmission: it was not needed") \
  X(out_of_window, "beyond the receive window")                                           \
  X(stale_epoch, "from an older incarnation of the peer")                                 \
  X(unsynced, "in no stream the peer may have started towards us")                        \
  X(message_table_full, "no room to track another message in progress")                   \
  X(bad_message, "contradicts the message in progress")                                   \
  X(messages_completed, "messages whose every byte arrived")                              \
  X(messages_abandoned, "in progress when the peer restarted")                            \
  X(peer_restarts, "the peer came back with a newer epoch")                               \
  X(acks_sent, "acknowledgements written (piggybacked or pure)")

struct ReceiverCounters {
  MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_DECLARE)

  template <class F>
  void for_each(F&& f) const {MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_VISIT)} ReceiverCounters&
  operator+=(const ReceiverCounters& o) {
    MERCURY_RECEIVER_COUNTERS(MERCURY_COUNTER_ADD)
    return *this;
  }
};

/// The receive half of a peer: epoch tracking, the duplicate window, the
/// SACK bitmap, message completion and the ACK policy.
class PeerReceiver {
 public:
  /// Control path. `local_epoch` (non-zero) is our own incarnation;
  /// `peer_epoch` the peer's if already known (0: adopt the first one seen).
  PeerReceiver(const Params& params, uint16_t local_epoch, uint16_t peer_epoch = 0);

  /// Checks a packet's epoch against the peer's known incarnation, adopting
  /// the first one seen and resetting on a newer one. on_data() calls it; call
  /// it yourself for pure ACKs. Counts stale epochs.
  EpochCheck observe_epoch(uint16_t epoch);

  /// A data, aggregated-data or control packet from the peer, already decoded
  /// and validated by wire::decode.
  RxResult on_data(const wire::HeaderFields& h, Tick now);

  /// An acknowledgement should go out now (as a pure ACK unless data to the
  /// peer is about to carry it): k packets unacked, an ack-request, a gap, a
  /// duplicate, or the ack delay expired.
  bool ack_due(Tick now) const;
  /// When ack_due() turns true if nothing else arrives: 0 if nothing is
  /// waiting to be acknowledged, 1 if it is due already.
  Tick ack_deadline() const;
  /// Writes ack/sack and sets kAckValid in `h`, clearing the due state.
  /// Returns false (h untouched) if there is no stream to acknowledge yet.
  bool fill_ack(wire::HeaderFields& h);

  /// Next cumulative ack value (every seq below was received); meaningful
  /// once synced(), i.e. once a packet of the peer's stream has arrived.
  uint32_t cumulative_ack() const { return rcv_nxt_; }
  uint64_t sack_bits() const;
  bool synced() const { return synced_; }
  /// We became a new incarnation (Peer::reincarnate): forget the peer's
  /// stream (it restarts towards our new epoch), keep its epoch.
  void reincarnate(uint16_t new_local_epoch);
  uint16_t peer_epoch() const { return peer_epoch_; }
  uint32_t messages_in_progress() const { return static_cast<uint32_t>(msgs_.size()); }
  const ReceiverCounters& counters() const { return counters_; }

 private:
  /// on_data() past the epoch check: the verdict, and whether the packet
  /// completed its message.
  RxVerdict accept(const wire::HeaderFields& h, Tick now, bool& message_complete);

  // A message in progress, keyed by msg_id.
  struct MsgProgress {
    uint32_t msg_len = 0;
    uint32_t received = 0;
  };
  using MsgTable = FlatMap<MsgIdKey<0>, MsgProgress>;
  using MsgSlot = MsgTable::Slot;
  static_assert(sizeof(MsgSlot) == 16, "docs/transport.md quotes the message slot size");

  bool try_sync(uint32_t seq);
  void sync(uint32_t base);
  void reset_messages();
  bool bit(const std::vector<uint64_t>& v, uint32_t seq) const {
    uint32_t i = seq & ring_mask_;
    return (v[i >> 6] >> (i & 63)) & 1u;
  }
  void put_bit(std::vector<uint64_t>& v, uint32_t seq, bool on) {
    uint32_t i = seq & ring_mask_;
    uint64_t m = uint64_t{1} << (i & 63);
    v[i >> 6] = on ? (v[i >> 6] | m) : (v[i >> 6] & ~m);
  }
  void duplicate(const wire::HeaderFields& h, bool history_known);

  Params p_;
  uint16_t local_epoch_;
  uint16_t peer_epoch_ = 0;  // 0: never heard from the peer
  bool synced_ = false;
  uint32_t rcv_nxt_ = 0;
  uint32_t history_ = 0;  // seqs below rcv_nxt_ whose ring bits are still meaningful
  // Bit rings of ring_bits_ (pow2 >= 2 x rx_window) bits indexed by seq: got_
  // is valid for [rcv_nxt_, rcv_nxt_ + rx_window); rtx_ (the accepted copy
  // carried kRetransmit) also for history_ seqs below rcv_nxt_.
  uint32_t ring_mask_;
  std::vector<uint64_t> got_;
  std::vector<uint64_t> rtx_;
  // Messages in progress: pow2 >= 2 x rx_messages slots, at most rx_messages used.
  MsgTable msgs_;
  // ACK policy.
  uint32_t unacked_ = 0;
  bool ack_now_ = false;
  Tick ack_deadline_ = 0;
  ReceiverCounters counters_;
};

// ---------------------------------------------------------------------------
// A peer: both halves plus epochs, for the glue.

struct PeerCounters {
  SenderCounters tx;
  ReceiverCounters rx;
  uint64_t probes_sent = 0;  ///< pure ACKs sent without an ACK, to announce our epoch

  /// f(prefix, name, value): the sender's fields as tx_<name>, the
  /// receiver's as rx_<name>, then probes_sent.
  template <class F>
  void for_each(F&& f) const {
    tx.for_each([&](std::string_view, std::string_view name, uint64_t v) { f("tx_", name, v); });
    rx.for_each([&](std::string_view, std::string_view name, uint64_t v) { f("rx_", name, v); });
    f(std::string_view{}, std::string_view{"probes_sent"}, probes_sent);
  }
  PeerCounters& operator+=(const PeerCounters& o) {
    tx += o.tx;
    rx += o.rx;
    probes_sent += o.probes_sent;
    return *this;
  }
};

/// Both halves of one peer, wired together, plus the epoch exchange:
///  * fills the transport fields of outgoing headers (seq, epoch, flags and a
///    piggybacked ACK) and routes incoming packets (epoch check, ACK part to
///    the sender, data part to the receiver);
///  * until it knows the peer's epoch it sends no data (can_send() is false)
///    but asks for probes (ack_due(); a probe is a kAck packet without
///    kAckValid, it carries our epoch), backing off from initial_rto to
///    max_rto; any packet from the peer teaches us its epoch;
///  * when the peer comes back with a newer epoch, everything pending for it
///    fails with kPeerRestarted and a new stream starts keyed to that epoch.
class Peer {
 public:
  /// Control path. `local_epoch` is our incarnation (non-zero; bump it on
  /// every process restart, e.g. from a persisted counter). `peer_epoch` is
  /// the peer's if already known (skips the probe exchange), 0 otherwise.
  /// Throws std::invalid_argument on a bad config or a zero local epoch.
  Peer(const Config& config, uint16_t local_epoch, Tick now, uint16_t peer_epoch = 0);

  /// Room for a new packet (and the peer's epoch is known).
  bool can_send() const { return peer_known() && sender_.can_send(); }
  bool can_resend() const { return sender_.can_resend(); }

  /// First transmission of `slice`. The glue has filled the application
  /// fields of `h` (type, ids, msg_id, msg_len, offset, payload_len...);
  /// this fills seq, epoch, the transport flags and a piggybacked ACK.
  /// Returns false (h untouched) when can_send() is false.
  bool send(const SliceRef& slice, Tick now, wire::HeaderFields& h);

  /// Retransmission of lost packet `seq`. On kSend, `slice` says what to
  /// send and `h`'s transport fields are filled (the glue fills the rest from
  /// slice as for send). See PeerSender::on_resend for the other answers.
  Resend resend(uint32_t seq, Tick now, SliceRef& slice, wire::HeaderFields& h);

  /// A pure ACK (or a probe) should go out now: the receiver's ACK policy
  /// says so, the peer has not seen our epoch yet, or a probe is due.
  bool ack_due(Tick now) const;
  /// Fills `h` as a pure ACK: type kAck, payload_len/offset/msg_len 0, seq,
  /// epoch, flags, and ack/sack with kAckValid when there is a stream to
  /// acknowledge (a probe otherwise). Leaves job_id, sender_id and the other
  /// application fields to the glue.
  void fill_pure_ack(Tick now, wire::HeaderFields& h);

  /// Any packet from the peer, decoded by wire::decode. Processes its ACK
  /// part (if kAckValid and the epoch is not stale) after its data part.
  RxResult on_packet(const wire::HeaderFields& h, Tick now, SenderSink& sink);

  /// Slow work: RTO and liveness (see PeerSender::on_timer), connect timeout.
  void on_timer(Tick now, SenderSink& sink);
  /// When on_timer() or ack_due() next has work (for an idle back-off): 0 if
  /// nothing is armed; a time not after `now` means at once.
  Tick next_deadline() const;

  /// Control path: becomes a new incarnation towards this peer, e.g. to talk
  /// to it again after it was declared dead (a dead peer stays dead: its
  /// stream has holes nobody will fill). Fails what was pending with
  /// FailReason::kReset, abandons messages in progress from the peer and
  /// starts a fresh stream; the peer sees a restart and does the same on its
  /// side. Throws std::invalid_argument unless new_local_epoch is newer.
  void reincarnate(uint16_t new_local_epoch, Tick now, SenderSink& sink);

  /// The peer is dead: nothing was acknowledged for peer_timeout while data
  /// was out (every pending slice has failed), or it never answered within
  /// connect_timeout. The glue fails whatever it still queues for the peer.
  bool dead() const { return sender_.dead() || connect_failed_; }
  bool peer_known() const { return receiver_.peer_epoch() != 0; }
  uint16_t local_epoch() const { return local_epoch_; }
  uint16_t peer_epoch() const { return receiver_.peer_epoch(); }
  const PeerSender& sender() const { return sender_; }
  const PeerReceiver& receiver() const { return receiver_; }
  PeerCounters counters() const { return {sender_.counters(), receiver_.counters(), probes_sent_}; }

 private:
  void stamp(const TxStamp& st, wire::HeaderFields& h);
  uint32_t stream_origin() const;

  Params p_;
  uint16_t local_epoch_;
  PeerSender sender_;
  PeerReceiver receiver_;
  bool owe_epoch_;  // the peer may not know our epoch yet: tell it with the next packet
  Tick next_probe_;
  Tick probe_interval_;
  Tick connect_deadline_;  // 0: none
  bool connect_failed_ = false;
  uint64_t probes_sent_ = 0;
};

}  // namespace mercury::transport
