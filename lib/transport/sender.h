// PeerSender, the send half of a peer: sequence numbers, the in-flight
// table, loss detection (SACK rule, RTO, tail probe), window and congestion
// window, liveness; and what it reports to the glue (SenderSink). Part of
// the transport component: transport.h says what it is for, its threads and
// its costs; docs/transport.md gives the protocol. Implemented in sender.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "base/counter_list.h"
#include "transport/config.h"
#include "wire/header.h"

namespace mercury::transport {

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
  /// The peer answered the timer's probe (see PeerSender::probe_due) without
  /// acknowledging this packet, sent before the probe: the answer's ACK
  /// covers everything the peer had received when it read the probe. A loss
  /// signal like the SACK rule's (cwnd decreases by the packets lost).
  kAnswered,
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
#define MERCURY_SENDER_COUNTERS(X)                                              \
  X(packets_sent, "first transmissions")                                        \
  X(retransmits_fast, "resends of packets lost by the SACK rule")               \
  X(retransmits_timeout, "resends of packets lost by RTO or the tail probe")    \
  X(losses_fast, "packets declared lost by the SACK rule")                      \
  X(losses_timeout, "packets declared lost by RTO or the answer to its probe")  \
  X(tail_probes, "left-edge resends declared lost by the probe timeout")        \
  X(false_losses, "declared lost, then acked before being resent")              \
  X(resends_skipped, "on_resend() refused: already acked, failed or unknown")   \
  X(acks_received, "ACKs processed")                                            \
  X(acks_old, "cumulative ack below ours (reordered ACK); SACK still used")     \
  X(acks_invalid, "ack beyond anything sent: ignored")                          \
  X(rto_expirations, "retransmission timer expiries that declared losses")      \
  X(rto_probes, "timer expiries that asked the peer for an answer instead")     \
  X(probe_answers, "answers to those probes (the rest were overtaken)")         \
  X(spurious_timeouts, "expiries undone: the receiver got their resends twice") \
  X(loss_episodes, "loss episodes (each reduces cwnd, see docs/transport.md)")  \
  X(slices_acked, "slices delivered")                                           \
  X(slices_failed, "slices failed")                                             \
  X(peer_timeouts, "peer declared dead: nothing acked for peer_timeout")        \
  X(restarts, "send streams restarted (the peer came back with a new epoch)")   \
  X(rtt_samples, "RTT samples taken")
// Its estimates: current values (ticks / packets), never summed.
#define MERCURY_SENDER_ESTIMATES(X)                                        \
  X(Tick, srtt, "smoothed RTT, ticks")                                     \
  X(Tick, rttvar, "RTT variation, ticks")                                  \
  X(Tick, min_rtt, "smallest RTT sample, ticks")                           \
  X(Tick, rto, "retransmission timeout before back-off")                   \
  X(uint32_t, backoff, "RTO doublings in force")                           \
  X(uint32_t, cwnd, "congestion window, packets")                          \
  X(uint32_t, reorder_threshold, "adaptive reordering threshold, packets") \
  X(uint32_t, credit, "the peer's last credit, packets from its cumulative ack")

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

  /// Room for a new packet: fewer than `window` sequence numbers outstanding,
  /// fewer than `cwnd` packets in flight, the next sequence number inside the
  /// peer's credit, and the peer is not dead.
  bool can_send() const;
  /// Nothing more may be sent because the peer's credit is used up (and
  /// nothing is in flight to bring a new one when it is zero: the glue then
  /// probes with a pure ACK asking for an answer, Peer::ack_due).
  bool credit_exhausted() const { return !dead_ && seq_diff(nxt_, credit_edge_) >= 0; }
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
  /// cum_ack+1+i was received; `credit` = the receiver's room, seqs from
  /// cum_ack on (kNoCredit: the ACK says nothing of it, the window applies).
  /// Reports newly delivered slices (on_acked) and newly lost ones
  /// (on_lost), takes an RTT sample, adjusts cwnd and the credit edge.
  /// `duplicate`: the ACK carries wire::flags::kDuplicate (a resend of ours
  /// was not needed); after a timeout it proves the timeout spurious.
  static constexpr uint32_t kNoCredit = UINT32_MAX;
  AckResult on_ack(uint32_t cum_ack, uint64_t sack, Tick now, SenderSink& sink,
                   uint32_t credit = kNoCredit, bool duplicate = false);

  /// The timer expired with nothing heard from the peer for an RTO: before
  /// resending anything it asks the peer where it stands. The owner sends a
  /// pure ACK with kAckRequest whose `offset` carries on_probe_sent()'s
  /// token; the peer answers with kAnswer echoing it. A peer that was only
  /// off its CPU answers with an ACK of everything (no resend); what a live
  /// peer's answer does not acknowledge is lost (LossKind::kAnswered). An
  /// expiry while the probe is unanswered resends (kTimeout).
  bool probe_due() const { return probe_due_ && !dead_; }
  /// The probe asked for went out now: its token (non-zero) for the header.
  uint32_t on_probe_sent(Tick now);
  /// The peer answered the probe carrying `token` (an ACK with kAnswer, its
  /// ACK part already fed to on_ack). Declares lost every packet still in
  /// flight that was last sent before the probe. Another token (a late
  /// answer, or one to a probe that was not ours) changes nothing.
  void on_answer(uint32_t token, Tick now, SenderSink& sink);

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
  // The last expiry's resends were not needed: undo its response.
  void on_spurious_timeout();
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
  // First seq the peer's credit does not cover: cum_ack + credit of the
  // newest ACK (una_ + window until the first one).
  uint32_t credit_edge_;
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
  // The last expiry has not been shown genuine or spurious yet; cwnd before it.
  bool timeout_unverified_ = false;
  uint32_t timeout_cwnd_ = 0;
  Tick timeout_rto_ = 0;        // the effective RTO that fired
  uint32_t timeout_until_ = 0;  // seq after the last packet it declared lost
  Tick verify_by_ = 0;          // once all are acked, a duplicate report comes by then
  Tick progress_at_;            // last delivery, or when data became outstanding
  // The timer's probe (probe_due): wanted, then out with probe_token_ (0:
  // none unanswered); packets whose tx_order is below probe_order_ were last
  // sent before it.
  bool probe_due_ = false;
  uint32_t probe_token_ = 0;
  uint32_t last_token_ = 0;
  uint64_t probe_order_ = 0;
  bool dead_ = false;
  SenderCounters counters_;
};

}  // namespace mercury::transport
