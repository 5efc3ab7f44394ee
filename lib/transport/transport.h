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
// rx_window) bits plus 16 B x pow2(2 x rx_messages) on the receive side.//
// Headers: config.h (time, sequence arithmetic, Config), sender.h
// (PeerSender), receiver.h (PeerReceiver); this one adds the Peer that joins
// them and is the one to include.
#pragma once

#include <cstdint>

#include "transport/config.h"
#include "transport/receiver.h"
#include "transport/sender.h"
#include "wire/header.h"

namespace mercury::transport {

// ---------------------------------------------------------------------------
// A peer: both halves plus epochs, for the glue.

struct PeerCounters {
  SenderCounters tx;
  ReceiverCounters rx;
  uint64_t probes_sent = 0;        ///< pure ACKs sent without an ACK, to announce our epoch
  uint64_t persist_probes = 0;     ///< pure ACKs asking for the peer's credit (it had stopped us)
  uint64_t challenges = 0;         ///< newer epochs challenged (the current incarnation asked)
  uint64_t challenge_answers = 0;  ///< ... that it answered: no restart (a forged epoch)
  uint64_t challenged = 0;         ///< packets of a challenged epoch dropped (kChallenged)

  /// f(prefix, name, value): the sender's fields as tx_<name>, the
  /// receiver's as rx_<name>, then the Peer's own.
  template <class F>
  void for_each(F&& f) const {
    tx.for_each([&](std::string_view, std::string_view name, uint64_t v) { f("tx_", name, v); });
    rx.for_each([&](std::string_view, std::string_view name, uint64_t v) { f("rx_", name, v); });
    f(std::string_view{}, std::string_view{"probes_sent"}, probes_sent);
    f(std::string_view{}, std::string_view{"persist_probes"}, persist_probes);
    f(std::string_view{}, std::string_view{"challenges"}, challenges);
    f(std::string_view{}, std::string_view{"challenge_answers"}, challenge_answers);
    f(std::string_view{}, std::string_view{"challenged"}, challenged);
  }
  PeerCounters& operator+=(const PeerCounters& o) {
    tx += o.tx;
    rx += o.rx;
    probes_sent += o.probes_sent;
    persist_probes += o.persist_probes;
    challenges += o.challenges;
    challenge_answers += o.challenge_answers;
    challenged += o.challenged;
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
///  * a newer epoch is a restart only once the current incarnation is shown
///    gone and the new one real (unless epochs_authenticated): the Peer
///    challenges the peer's address (a pure ACK with kAckRequest and a
///    token, as TCP answers a suspicious RST with a challenge ACK, RFC 5961)
///    and drops the new epoch's packets (kChallenged) until the current
///    incarnation answers (no restart), or it is dead or silent for
///    challenge_timeout and the new one has echoed the token;
///  * then everything pending for the peer fails with kPeerRestarted and a
///    new stream starts keyed to the new epoch.
class Peer {
 public:
  /// Control path. `local_epoch` is our incarnation (non-zero; a restarted
  /// process needs a newer one: job::fresh_epoch() counts milliseconds of the
  /// wall clock, compared by epoch_newer). `peer_epoch` is
  /// the peer's if already known (skips the probe exchange), 0 otherwise.
  /// Throws std::invalid_argument on a bad config or a zero local epoch.
  Peer(const Config& config, uint32_t local_epoch, Tick now, uint32_t peer_epoch = 0);

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
  /// says so, the peer has not seen our epoch yet, or a probe is due: of
  /// our epoch, or of the peer's credit when it has stopped us with nothing
  /// in flight (a persist probe, every RTO, asking for an answer).
  bool ack_due(Tick now) const;
  /// The room we have for the peer's packets (PeerReceiver::set_credit).
  void set_credit(uint32_t packets) { receiver_.set_credit(packets); }
  /// Fills `h` as a pure ACK: type kAck, payload_len/offset/msg_len 0, seq,
  /// epoch, flags, and ack/sack with kAckValid when there is a stream to
  /// acknowledge (a probe otherwise). Leaves job_id, sender_id and the other
  /// application fields to the glue.
  void fill_pure_ack(Tick now, wire::HeaderFields& h);

  /// Any packet from the peer, decoded by wire::decode. Processes its ACK
  /// part (if kAckValid and the epoch is not stale) after its data part.
  RxResult on_packet(const wire::HeaderFields& h, Tick now, SenderSink& sink);

  /// Slow work: RTO and liveness (see PeerSender::on_timer), connect
  /// timeout, the epoch challenge. True when the peer restarted in this call
  /// (its challenged incarnation never answered, or died): the glue does
  /// what RxResult::peer_restarted asks.
  bool on_timer(Tick now, SenderSink& sink);
  /// When on_timer() or ack_due() next has work (for an idle back-off): 0 if
  /// nothing is armed; a time not after `now` means at once.
  Tick next_deadline() const;

  /// Control path: becomes a new incarnation towards this peer, e.g. to talk
  /// to it again after it was declared dead (a dead peer stays dead: its
  /// stream has holes nobody will fill). Fails what was pending with
  /// FailReason::kReset, abandons messages in progress from the peer and
  /// starts a fresh stream; the peer sees a restart and does the same on its
  /// side. Throws std::invalid_argument unless new_local_epoch is newer.
  void reincarnate(uint32_t new_local_epoch, Tick now, SenderSink& sink);

  /// The peer is dead: nothing was acknowledged for peer_timeout while data
  /// was out (every pending slice has failed), or it never answered within
  /// connect_timeout. The glue fails whatever it still queues for the peer.
  bool dead() const { return sender_.dead() || connect_failed_; }
  bool peer_known() const { return receiver_.peer_epoch() != 0; }
  uint32_t local_epoch() const { return local_epoch_; }
  uint32_t peer_epoch() const { return receiver_.peer_epoch(); }
  const PeerSender& sender() const { return sender_; }
  const PeerReceiver& receiver() const { return receiver_; }
  /// A newer epoch waits for the current incarnation's answer.
  bool challenging() const { return challenge_epoch_ != 0; }
  PeerCounters counters() const {
    return {sender_.counters(), receiver_.counters(), probes_sent_, persist_probes_,
            challenges_,        challenge_answers_,   challenged_};
  }

 private:
  void stamp(const TxStamp& st, wire::HeaderFields& h);
  uint32_t stream_origin() const;
  // The peer's credit stopped us with nothing in flight: nothing will bring
  // a new one unless we ask (its window update may have been lost).
  bool persisting() const {
    return sender_.credit_exhausted() && sender_.outstanding() == 0 && peer_known();
  }
  // A packet `h` of a newer epoch: true if it is the peer now (proven by the
  // MAC, or the known incarnation gone and h's answered our challenge);
  // otherwise starts or goes on challenging.
  bool incarnation_gone(const wire::HeaderFields& h, Tick now);
  // The known incarnation is gone: dead, or silent to the challenge.
  bool old_gone(Tick now) const { return sender_.dead() || now >= challenge_deadline_; }
  void clear_challenge();
  // The peer is `epoch` from now on: its old stream is dropped, ours restarts.
  void restart_as(uint32_t epoch, Tick now, SenderSink& sink);
  // A new stream to the peer (what was pending fails with `why`), our epoch
  // owed, no answer or challenge pending.
  void restart_stream(Tick now, FailReason why, SenderSink& sink);
  bool challenge_due(Tick now) const { return challenge_epoch_ != 0 && now >= next_challenge_; }
  // Between two challenges while unanswered.
  Tick challenge_interval() const;

  Params p_;
  uint32_t local_epoch_;
  PeerSender sender_;
  PeerReceiver receiver_;
  bool owe_epoch_;             // the peer may not know our epoch yet: tell it with the next packet
  uint32_t answer_token_ = 0;  // the peer's timer probe to answer (its token; 0: none)
  Tick next_probe_;
  Tick probe_interval_;
  Tick connect_deadline_;  // 0: none
  Tick next_persist_ = 0;  // the next persist probe, while persisting()
  bool connect_failed_ = false;
  // The epoch challenge: the newest epoch waiting (0: none), the token the
  // known incarnation must echo (and a newer one, to be believed), when it
  // is due again, and when an unanswered challenge takes the known
  // incarnation as gone.
  uint32_t challenge_epoch_ = 0;
  uint32_t challenge_token_ = 0;
  uint32_t proven_epoch_ = 0;  // the newest epoch that echoed the token (0: none)
  Tick next_challenge_ = 0;
  Tick challenge_deadline_ = 0;
  uint64_t probes_sent_ = 0;
  uint64_t persist_probes_ = 0;
  uint64_t challenges_ = 0;
  uint64_t challenge_answers_ = 0;
  uint64_t challenged_ = 0;
};

}  // namespace mercury::transport
