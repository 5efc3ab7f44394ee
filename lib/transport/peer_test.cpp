// Peer: the epoch exchange, piggybacked ACKs, restarts, death and rebirth.
// Every header goes through wire::encode/decode, so what the transport fills
// is also what the wire accepts.
#include <gtest/gtest.h>

#include <vector>

#include "transport/test_util.h"
#include "transport/transport.h"

namespace mercury::transport {
namespace {

using test::kMs;
using test::kUs;
using test::over_the_wire;
using test::RecordingSink;
using test::slice_of;
namespace wf = wire::flags;

struct Endpoint {
  Endpoint(uint32_t epoch, Tick now, Config c = test::test_config()) : peer(c, epoch, now) {}
  Peer peer;
  RecordingSink sink;
};

// A data header for single-packet message msg_id (100 bytes).
wire::HeaderFields data_header(uint32_t msg_id) {
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.msg_id = msg_id;
  h.msg_len = 100;
  h.payload_len = 100;
  return h;
}

// `from` sends a data packet for slice_of(i); returns the header on the wire.
wire::HeaderFields send_data(Endpoint& from, uint32_t i, Tick now) {
  wire::HeaderFields h = data_header(i);
  EXPECT_TRUE(from.peer.send(slice_of(i), now, h));
  return over_the_wire(h);
}

wire::HeaderFields pure_ack(Endpoint& from, Tick now) {
  wire::HeaderFields h;
  from.peer.fill_pure_ack(now, h);
  return over_the_wire(h);
}

// A's pending challenge reaches `to` (a newer incarnation of A's peer), and
// its answer reaches A; returns that answer.
wire::HeaderFields answer_challenge(Endpoint& a, Endpoint& to, Tick now) {
  EXPECT_TRUE(a.peer.ack_due(now));
  const wire::HeaderFields challenge = pure_ack(a, now);
  EXPECT_NE(challenge.offset & kChallengeToken, 0u);
  to.peer.on_packet(challenge, now, to.sink);
  EXPECT_TRUE(to.peer.ack_due(now));
  const wire::HeaderFields answer = pure_ack(to, now);
  EXPECT_NE(answer.flags & wire::flags::kAnswer, 0);
  EXPECT_EQ(answer.offset, challenge.offset);
  return answer;
}

// Runs the probe exchange between fresh endpoints a and b.
void handshake(Endpoint& a, Endpoint& b, Tick now) {
  for (int i = 0; i < 4 && (a.peer.ack_due(now) || b.peer.ack_due(now)); ++i) {
    if (a.peer.ack_due(now)) b.peer.on_packet(pure_ack(a, now), now, b.sink);
    if (b.peer.ack_due(now)) a.peer.on_packet(pure_ack(b, now), now, a.sink);
  }
}

TEST(Peer, ExchangesEpochsBeforeTheFirstData) {
  Endpoint a(1, 0), b(5, 0);
  EXPECT_FALSE(a.peer.can_send());  // cannot key a stream without the peer's epoch
  ASSERT_TRUE(a.peer.ack_due(0));
  const wire::HeaderFields probe = pure_ack(a, 0);
  EXPECT_EQ(probe.type, wire::PacketType::kAck);
  EXPECT_EQ(probe.flags, wf::kAckRequest);  // no ACK yet, and "please answer"
  EXPECT_EQ(probe.epoch, 1u);
  EXPECT_EQ(b.peer.on_packet(probe, 0, b.sink).verdict, RxVerdict::kAckOnly);
  EXPECT_EQ(b.peer.peer_epoch(), 1u);
  EXPECT_TRUE(b.peer.can_send());
  ASSERT_TRUE(b.peer.ack_due(0));
  const wire::HeaderFields answer = pure_ack(b, 0);
  EXPECT_EQ(answer.flags, 0);  // an answer never asks back: no ping-pong
  a.peer.on_packet(answer, 0, a.sink);
  EXPECT_TRUE(a.peer.can_send());
  EXPECT_EQ(a.peer.peer_epoch(), 5u);
  // A's stream is keyed to (1, 5); B syncs to it on the first packet.
  const wire::HeaderFields d = send_data(a, 0, 10 * kUs);
  EXPECT_EQ(d.seq, initial_seq(1, 5, 0));
  const RxResult r = b.peer.on_packet(d, 10 * kUs, b.sink);
  EXPECT_EQ(r.verdict, RxVerdict::kNew);
  EXPECT_TRUE(r.message_complete);
}

TEST(Peer, ProbesBackOffAndAConnectTimeoutDeclaresThePeerDead) {
  Config c = test::test_config();
  c.connect_timeout_us = 30'000;
  Endpoint a(1, 0, c);
  std::vector<Tick> probes;
  for (Tick now = 0; now <= 40 * kMs && !a.peer.dead(); now += 100 * kUs) {
    if (a.peer.ack_due(now)) {
      pure_ack(a, now);
      probes.push_back(now);
    }
    a.peer.on_timer(now, a.sink);
  }
  // initial_rto 5 ms, doubling: probes at 0, 5, 15 ms; dead at 30 ms.
  EXPECT_EQ(probes, (std::vector<Tick>{0, 5 * kMs, 15 * kMs}));
  EXPECT_TRUE(a.peer.dead());
  EXPECT_FALSE(a.peer.ack_due(50 * kMs));
  EXPECT_EQ(a.peer.counters().probes_sent, 3u);
}

TEST(Peer, WithoutAConnectTimeoutWaitsForItsPeerForEver) {
  Endpoint a(1, 0);
  a.peer.on_timer(3'600'000 * kMs, a.sink);
  EXPECT_FALSE(a.peer.dead());
  EXPECT_TRUE(a.peer.ack_due(3'600'000 * kMs));
}

TEST(Peer, DataCarriesPiggybackedAcks) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  for (uint32_t i = 0; i < 3; ++i) b.peer.on_packet(send_data(a, i, 10 * kUs), 20 * kUs, b.sink);
  EXPECT_TRUE(a.sink.acked.empty());
  const wire::HeaderFields reply = send_data(b, 7, 30 * kUs);
  EXPECT_NE(reply.flags & wf::kAckValid, 0);
  EXPECT_EQ(reply.ack, initial_seq(1, 5, 0) + 3);
  a.peer.on_packet(reply, 40 * kUs, a.sink);
  EXPECT_EQ(a.sink.acked.size(), 3u);
  EXPECT_FALSE(b.peer.ack_due(30 * kUs));  // the piggyback cleared the debt
}

TEST(Peer, PureAckWhenThereIsNoDataGoingBack) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  for (uint32_t i = 0; i < 4; ++i) b.peer.on_packet(send_data(a, i, 10 * kUs), 20 * kUs, b.sink);
  ASSERT_TRUE(b.peer.ack_due(20 * kUs));  // ack_every = 4
  const wire::HeaderFields ack = pure_ack(b, 20 * kUs);
  EXPECT_EQ(ack.flags, wf::kAckValid);
  EXPECT_EQ(a.peer.on_packet(ack, 30 * kUs, a.sink).verdict, RxVerdict::kAckOnly);
  EXPECT_EQ(a.sink.acked.size(), 4u);
  EXPECT_EQ(a.peer.sender().outstanding(), 0u);
}

TEST(Peer, NextDeadlineCoversTheDelayedAckAndTheTimer) {
  Endpoint a(1, 0), b(5, 0);
  EXPECT_EQ(a.peer.next_deadline(), 1u);  // a probe is due at once
  handshake(a, b, 0);
  EXPECT_EQ(b.peer.next_deadline(), 0u);  // nothing to ack, nothing in flight
  b.peer.on_packet(send_data(a, 0, 100 * kUs), 100 * kUs, b.sink);
  // One packet: B owes an ACK within ack_delay (20 us); A's RTO (5 ms) runs.
  EXPECT_EQ(b.peer.next_deadline(), 120 * kUs);
  EXPECT_EQ(a.peer.next_deadline(), 100 * kUs + 5 * kMs);
  EXPECT_FALSE(b.peer.ack_due(119 * kUs));
  EXPECT_TRUE(b.peer.ack_due(120 * kUs));
  a.peer.on_packet(pure_ack(b, 120 * kUs), 130 * kUs, a.sink);
  EXPECT_EQ(a.peer.next_deadline(), 0u);
  EXPECT_EQ(b.peer.next_deadline(), 0u);
}

TEST(Peer, APeerRestartFailsPendingAndRestartsTheStream) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  // Three packets from A are in flight when B restarts as epoch 6.
  std::vector<wire::HeaderFields> in_flight;
  for (uint32_t i = 0; i < 3; ++i) in_flight.push_back(send_data(a, i, 10 * kUs));
  const wire::HeaderFields old_b = send_data(b, 9, 10 * kUs);
  Endpoint b2(6, 1 * kMs);
  // B2's probe: A challenges old B (which is gone) and drops the probe. The
  // challenge reaches B2, whose answer shows it real, but not yet old B gone.
  EXPECT_EQ(a.peer.on_packet(pure_ack(b2, 1 * kMs), 1 * kMs, a.sink).verdict,
            RxVerdict::kChallenged);
  const wire::HeaderFields answer = answer_challenge(a, b2, 1 * kMs);
  EXPECT_EQ(a.peer.on_packet(answer, 1 * kMs, a.sink).verdict, RxVerdict::kChallenged);
  EXPECT_TRUE(a.sink.failed.empty());
  // Old B silent for the challenge timeout (a quarter of the peer timeout):
  // it is gone, and B2 the peer.
  EXPECT_FALSE(a.peer.on_timer(250 * kMs, a.sink));
  EXPECT_TRUE(a.peer.on_timer(251 * kMs, a.sink));
  EXPECT_FALSE(a.peer.challenging());
  handshake(a, b2, 251 * kMs);
  ASSERT_EQ(a.sink.failed.size(), 3u);
  for (const auto& f : a.sink.failed) EXPECT_EQ(f.why, FailReason::kPeerRestarted);
  EXPECT_EQ(a.peer.peer_epoch(), 6u);
  EXPECT_EQ(a.peer.counters().rx.peer_restarts, 1u);
  // A's old packets reach the new B: a stream meant for its predecessor.
  for (const auto& h : in_flight) {
    EXPECT_EQ(b2.peer.on_packet(h, 2 * kMs, b2.sink).verdict, RxVerdict::kUnsynced);
  }
  // Old B's packet reaches A: stale.
  EXPECT_EQ(a.peer.on_packet(old_b, 2 * kMs, a.sink).verdict, RxVerdict::kStaleEpoch);
  EXPECT_EQ(a.peer.counters().rx.stale_epoch, 1u);
  // Both new streams work.
  const wire::HeaderFields d = send_data(a, 3, 3 * kMs);
  EXPECT_EQ(d.seq, initial_seq(1, 6, 0));
  EXPECT_EQ(b2.peer.on_packet(d, 3 * kMs, b2.sink).verdict, RxVerdict::kNew);
  EXPECT_EQ(a.peer.on_packet(send_data(b2, 4, 3 * kMs), 3 * kMs, a.sink).verdict, RxVerdict::kNew);
  a.peer.on_packet(pure_ack(b2, 4 * kMs), 4 * kMs, a.sink);
  ASSERT_EQ(a.sink.acked.size(), 1u);
  EXPECT_EQ(a.sink.acked[0], slice_of(3));
}

TEST(Peer, ADeadPeerCanBeReachedAgainByReincarnating) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  send_data(a, 0, 10 * kUs);
  send_data(a, 1, 10 * kUs);
  // B never answers: retransmissions time out until peer_timeout (1 s).
  for (Tick now = 0; now <= 1'100 * kMs && !a.peer.dead(); now += 1 * kMs) {
    a.peer.on_timer(now, a.sink);
    for (const auto& l : a.sink.lost) {
      SliceRef s;
      wire::HeaderFields h = data_header(0);
      a.peer.resend(l.seq, now, s, h);
    }
    a.sink.lost.clear();
  }
  ASSERT_TRUE(a.peer.dead());
  EXPECT_EQ(a.sink.failed.size(), 2u);
  EXPECT_FALSE(a.peer.can_send());
  a.sink.failed.clear();
  a.peer.reincarnate(2, 2'000 * kMs, a.sink);
  EXPECT_TRUE(a.sink.failed.empty());  // nothing was left pending
  EXPECT_FALSE(a.peer.dead());
  ASSERT_TRUE(a.peer.can_send());
  // B challenges A's old incarnation: A's answer carries its new epoch, so
  // it is no answer of the old one, which is gone.
  const wire::HeaderFields first = send_data(a, 5, 2'000 * kMs);
  EXPECT_EQ(b.peer.on_packet(first, 2'000 * kMs, b.sink).verdict, RxVerdict::kChallenged);
  ASSERT_TRUE(b.peer.ack_due(2'000 * kMs));
  a.peer.on_packet(pure_ack(b, 2'000 * kMs), 2'000 * kMs, a.sink);
  ASSERT_TRUE(a.peer.ack_due(2'000 * kMs));
  const wire::HeaderFields answer = pure_ack(a, 2'000 * kMs);
  EXPECT_NE(answer.flags & wf::kAnswer, 0);
  EXPECT_EQ(b.peer.on_packet(answer, 2'000 * kMs, b.sink).verdict, RxVerdict::kChallenged);
  EXPECT_TRUE(b.peer.on_timer(2'251 * kMs, b.sink));
  const RxResult r = b.peer.on_packet(first, 2'252 * kMs, b.sink);  // A's resend of it
  EXPECT_EQ(r.verdict, RxVerdict::kNew);
  ASSERT_TRUE(b.peer.ack_due(2'252 * kMs));
  a.peer.on_packet(pure_ack(b, 2'252 * kMs), 2'253 * kMs, a.sink);
  ASSERT_EQ(a.sink.acked.size(), 1u);
  EXPECT_EQ(a.sink.acked[0], slice_of(5));
  EXPECT_THROW(a.peer.reincarnate(2, 0, a.sink), std::invalid_argument);
}

// One packet with the peer's address and a newer epoch (a forged ACK, with
// no key to refuse it) must not end a live peer's streams: the Peer asks
// the incarnation it knows, drops the new epoch's packets until it answers,
// and both streams go on as if nothing had come.
TEST(Peer, ANewerEpochIsChallengedAndALiveIncarnationKeepsItsStreams) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  const wire::HeaderFields in_flight = send_data(a, 0, 10 * kUs);
  wire::HeaderFields forged = pure_ack(b, 10 * kUs);
  forged.epoch = 6;
  for (int i = 0; i < 3; ++i) {
    const RxResult r = a.peer.on_packet(forged, 20 * kUs, a.sink);
    EXPECT_EQ(r.verdict, RxVerdict::kChallenged);
    EXPECT_FALSE(r.peer_restarted);
  }
  EXPECT_TRUE(a.peer.challenging());
  EXPECT_EQ(a.peer.counters().challenges, 1u);
  EXPECT_EQ(a.peer.counters().challenged, 3u);
  EXPECT_EQ(a.peer.peer_epoch(), 5u);
  ASSERT_TRUE(a.peer.ack_due(20 * kUs));
  const wire::HeaderFields challenge = pure_ack(a, 20 * kUs);
  EXPECT_EQ(challenge.epoch, 1u);
  EXPECT_NE(challenge.flags & wf::kAckRequest, 0);
  EXPECT_NE(challenge.offset & kChallengeToken, 0u);
  // B is alive: it answers, echoing the token.
  b.peer.on_packet(in_flight, 30 * kUs, b.sink);
  b.peer.on_packet(challenge, 30 * kUs, b.sink);
  const wire::HeaderFields answer = pure_ack(b, 30 * kUs);
  EXPECT_NE(answer.flags & wf::kAnswer, 0);
  EXPECT_EQ(answer.offset, challenge.offset);
  EXPECT_EQ(a.peer.on_packet(answer, 40 * kUs, a.sink).verdict, RxVerdict::kAckOnly);
  EXPECT_FALSE(a.peer.challenging());
  EXPECT_EQ(a.peer.counters().challenge_answers, 1u);
  // The answer's ACK counted; nothing failed, no restart, past the deadline too.
  ASSERT_EQ(a.sink.acked.size(), 1u);
  EXPECT_FALSE(a.peer.on_timer(500 * kMs, a.sink));
  EXPECT_TRUE(a.sink.failed.empty());
  EXPECT_EQ(a.peer.counters().rx.peer_restarts, 0u);
  EXPECT_EQ(a.peer.peer_epoch(), 5u);
  EXPECT_EQ(a.peer.on_packet(send_data(b, 1, 501 * kMs), 501 * kMs, a.sink).verdict,
            RxVerdict::kNew);
  EXPECT_EQ(b.peer.on_packet(send_data(a, 2, 501 * kMs), 501 * kMs, b.sink).verdict,
            RxVerdict::kNew);
  // The forged epoch again: a new challenge with a token of its own. An echo
  // of the first token (an answer forged from an old one) ends nothing; B's
  // answer to this one does.
  EXPECT_EQ(a.peer.on_packet(forged, 502 * kMs, a.sink).verdict, RxVerdict::kChallenged);
  EXPECT_EQ(a.peer.counters().challenges, 2u);
  ASSERT_TRUE(a.peer.ack_due(502 * kMs));
  const wire::HeaderFields again = pure_ack(a, 502 * kMs);
  EXPECT_NE(again.offset & kChallengeToken, 0u);
  EXPECT_NE(again.offset, challenge.offset);
  a.peer.on_packet(answer, 503 * kMs, a.sink);
  EXPECT_TRUE(a.peer.challenging());
  b.peer.on_packet(again, 503 * kMs, b.sink);
  a.peer.on_packet(pure_ack(b, 503 * kMs), 503 * kMs, a.sink);
  EXPECT_FALSE(a.peer.challenging());
  EXPECT_EQ(a.peer.counters().challenge_answers, 2u);
}

// An unanswered challenge is repeated (the incarnation may only have lost
// it) until the challenge timeout, then the newer epoch is the peer if it
// answered one (here the last before the timeout).
TEST(Peer, AChallengeIsRepeatedUntilTheTimeout) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  Endpoint b2(6, 1 * kMs);
  a.peer.on_packet(pure_ack(b2, 1 * kMs), 1 * kMs, a.sink);
  std::vector<Tick> challenges;
  bool restarted = false;
  Tick at = 0;
  for (Tick now = 1 * kMs; now <= 300 * kMs && !restarted; now += 100 * kUs) {
    restarted = a.peer.on_timer(now, a.sink);
    at = now;
    if (!restarted && a.peer.ack_due(now)) {
      const wire::HeaderFields h = pure_ack(a, now);
      if ((h.offset & kChallengeToken) == 0) continue;
      challenges.push_back(now);
      if (now >= 200 * kMs) {
        b2.peer.on_packet(h, now, b2.sink);
        a.peer.on_packet(pure_ack(b2, now), now, a.sink);
      }
    }
  }
  ASSERT_TRUE(restarted);
  EXPECT_EQ(at, 251 * kMs);  // the timeout, not B2's answer
  EXPECT_EQ(a.peer.peer_epoch(), 6u);
  // Every RTO (5 ms before a sample, backing off), at most a quarter of the timeout apart.
  ASSERT_GE(challenges.size(), 4u);
  EXPECT_EQ(challenges[0], 1 * kMs);
  for (size_t i = 1; i < challenges.size(); ++i) {
    EXPECT_LE(challenges[i] - challenges[i - 1], 250 * kMs / 4 + 100 * kUs);
  }
  EXPECT_EQ(a.peer.counters().challenges, 1u);
  EXPECT_EQ(a.peer.counters().challenge_answers, 0u);
  EXPECT_EQ(a.peer.counters().rx.peer_restarts, 1u);
}

// A newer epoch nothing at the peer's address answers for (a forged packet)
// replaces nothing, even once the known incarnation is gone: at the timeout
// the challenge is forgotten, and a later packet of it asks again.
TEST(Peer, ANewerEpochThatNeverAnswersIsForgotten) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  wire::HeaderFields forged = pure_ack(b, 1 * kMs);
  forged.epoch = 6;
  EXPECT_EQ(a.peer.on_packet(forged, 1 * kMs, a.sink).verdict, RxVerdict::kChallenged);
  for (Tick now = 1 * kMs; now <= 300 * kMs; now += 1 * kMs) {
    EXPECT_FALSE(a.peer.on_timer(now, a.sink)) << now;
    if (a.peer.ack_due(now)) pure_ack(a, now);  // to old B, silent
  }
  EXPECT_FALSE(a.peer.challenging());
  EXPECT_EQ(a.peer.peer_epoch(), 5u);
  EXPECT_EQ(a.peer.counters().rx.peer_restarts, 0u);
  EXPECT_EQ(a.peer.on_packet(forged, 301 * kMs, a.sink).verdict, RxVerdict::kChallenged);
  EXPECT_EQ(a.peer.counters().challenges, 2u);
}

// With a job key every packet was verified before the Peer sees it: a newer
// epoch is a restart at once. A peer declared dead is replaced as soon as
// the newer incarnation answers the challenge, even by an older epoch than
// a forged one seen meanwhile.
TEST(Peer, AnAuthenticatedOrADeadIncarnationIsReplacedAtOnce) {
  Config c = test::test_config();
  c.epochs_authenticated = true;
  Endpoint a(1, 0, c), b(5, 0);
  handshake(a, b, 0);
  send_data(a, 0, 10 * kUs);
  Endpoint b2(6, 1 * kMs);
  const RxResult r = a.peer.on_packet(pure_ack(b2, 1 * kMs), 1 * kMs, a.sink);
  EXPECT_TRUE(r.peer_restarted);
  EXPECT_EQ(a.peer.counters().challenges, 0u);
  ASSERT_EQ(a.sink.failed.size(), 1u);

  Endpoint x(1, 0), y(5, 0);
  handshake(x, y, 0);
  send_data(x, 0, 10 * kUs);
  for (Tick now = 0; now <= 1'100 * kMs && !x.peer.dead(); now += 1 * kMs) {
    x.peer.on_timer(now, x.sink);
    x.sink.lost.clear();
  }
  ASSERT_TRUE(x.peer.dead());
  wire::HeaderFields forged = pure_ack(y, 1'200 * kMs);
  forged.epoch = 0x40000000;  // far newer than any real restart
  EXPECT_EQ(x.peer.on_packet(forged, 1'200 * kMs, x.sink).verdict, RxVerdict::kChallenged);
  Endpoint y2(7, 1'200 * kMs);
  EXPECT_EQ(x.peer.on_packet(pure_ack(y2, 1'200 * kMs), 1'200 * kMs, x.sink).verdict,
            RxVerdict::kChallenged);
  const wire::HeaderFields answer = answer_challenge(x, y2, 1'201 * kMs);
  EXPECT_TRUE(x.peer.on_packet(answer, 1'201 * kMs, x.sink).peer_restarted);
  EXPECT_FALSE(x.peer.dead());
  EXPECT_EQ(x.peer.peer_epoch(), 7u);
  EXPECT_EQ(x.peer.counters().challenges, 1u);
  // The forgery again: y2 answers the challenge it makes.
  EXPECT_EQ(x.peer.on_packet(forged, 1'202 * kMs, x.sink).verdict, RxVerdict::kChallenged);
  x.peer.on_packet(answer_challenge(x, y2, 1'202 * kMs), 1'202 * kMs, x.sink);
  EXPECT_FALSE(x.peer.challenging());
  EXPECT_EQ(x.peer.peer_epoch(), 7u);
}

// A peer declared dead while its incarnation is challenged: gone, at once.
TEST(Peer, AChallengedIncarnationDeclaredDeadIsReplaced) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  send_data(a, 0, 10 * kUs);
  Endpoint b2(6, 900 * kMs);
  bool restarted = false;
  Tick at = 0;
  for (Tick now = 0; now <= 1'100 * kMs && !restarted; now += 1 * kMs) {
    if (now == 900 * kMs) {
      a.peer.on_packet(pure_ack(b2, now), now, a.sink);
      a.peer.on_packet(answer_challenge(a, b2, now), now, a.sink);
    }
    restarted = a.peer.on_timer(now, a.sink);
    at = now;
    a.sink.lost.clear();
  }
  ASSERT_TRUE(restarted);
  EXPECT_LT(at, 900 * kMs + 250 * kMs);  // the death, not the challenge timeout
  EXPECT_EQ(a.peer.peer_epoch(), 6u);
}

TEST(Peer, ATimerExpiryAsksThePeerAndAnAnswerOfEverythingResendsNothing) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  // B is off its CPU: A's four packets wait in its receive queue.
  std::vector<wire::HeaderFields> queued;
  for (uint32_t i = 0; i < 4; ++i) queued.push_back(send_data(a, i, 0));
  const Tick expiry = a.peer.next_deadline();
  ASSERT_EQ(expiry, 5 * kMs);  // initial_rto
  a.peer.on_timer(expiry, a.sink);
  EXPECT_TRUE(a.sink.lost.empty());  // nothing declared lost: first, ask
  ASSERT_TRUE(a.peer.ack_due(expiry));
  const wire::HeaderFields probe = pure_ack(a, expiry);
  EXPECT_EQ(probe.type, wire::PacketType::kAck);
  EXPECT_NE(probe.flags & wf::kAckRequest, 0);
  EXPECT_EQ(probe.flags & wf::kAnswer, 0);
  EXPECT_NE(probe.offset, 0u);  // its token
  EXPECT_FALSE(a.peer.ack_due(expiry));
  EXPECT_EQ(a.peer.counters().tx.rto_probes, 1u);
  // B wakes 15 ms later and reads the data, then the probe behind it.
  const Tick wake = expiry + 15 * kMs;
  for (const auto& h : queued) b.peer.on_packet(h, wake, b.sink);
  b.peer.on_packet(probe, wake, b.sink);
  ASSERT_TRUE(b.peer.ack_due(wake));
  const wire::HeaderFields answer = pure_ack(b, wake);
  EXPECT_EQ(answer.flags & (wf::kAnswer | wf::kAckValid), wf::kAnswer | wf::kAckValid);
  EXPECT_EQ(answer.flags & wf::kAckRequest, 0);  // an answer never asks back
  EXPECT_EQ(answer.offset, probe.offset);
  EXPECT_FALSE(b.peer.ack_due(wake));
  a.peer.on_packet(answer, wake, a.sink);
  EXPECT_EQ(a.sink.acked.size(), 4u);
  EXPECT_TRUE(a.sink.lost.empty());
  const SenderCounters& c = a.peer.counters().tx;
  EXPECT_EQ(c.probe_answers, 1u);
  EXPECT_EQ(c.retransmits_timeout + c.retransmits_fast, 0u);
  EXPECT_EQ(c.rto_expirations, 0u);
  EXPECT_EQ(c.backoff, 0u);
  EXPECT_EQ(a.peer.next_deadline(), 0u);  // nothing outstanding, nothing armed
}

TEST(Peer, AnAnswerDeclaresLostWhatWasSentBeforeTheProbeAndNotAcknowledged) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  std::vector<wire::HeaderFields> sent;
  for (uint32_t i = 0; i < 4; ++i) sent.push_back(send_data(a, i, 0));
  a.peer.on_timer(5 * kMs, a.sink);
  const wire::HeaderFields probe = pure_ack(a, 5 * kMs);
  const wire::HeaderFields after = send_data(a, 4, 5 * kMs);  // sent after the probe
  // The path lost the third packet (and A's fifth is still on its way).
  const Tick t = 5 * kMs + 50 * kUs;
  for (uint32_t i : {0u, 1u, 3u}) b.peer.on_packet(sent[i], t, b.sink);
  b.peer.on_packet(probe, t, b.sink);
  a.peer.on_packet(pure_ack(b, t), t, a.sink);
  ASSERT_EQ(a.sink.lost.size(), 1u);
  EXPECT_EQ(a.sink.lost[0].seq, sent[2].seq);
  EXPECT_EQ(a.sink.lost[0].kind, LossKind::kAnswered);
  EXPECT_EQ(a.peer.sender().in_flight(), 1u);  // the one sent after the probe
  // Its resend completes the stream; the packet after the probe arrives too.
  SliceRef again;
  wire::HeaderFields r = data_header(2);
  ASSERT_EQ(a.peer.resend(sent[2].seq, t, again, r), Resend::kSend);
  b.peer.on_packet(over_the_wire(r), t + 10 * kUs, b.sink);
  b.peer.on_packet(after, t + 10 * kUs, b.sink);
  a.peer.on_packet(pure_ack(b, t + 10 * kUs), t + 10 * kUs, a.sink);
  EXPECT_EQ(a.sink.acked.size(), 5u);
  EXPECT_EQ(a.peer.sender().outstanding(), 0u);
  EXPECT_EQ(a.peer.counters().tx.retransmits_timeout, 1u);
  EXPECT_EQ(a.peer.counters().tx.losses_timeout, 1u);
}

TEST(Peer, AnUnansweredProbeLeavesTheResendToTheNextExpiry) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  send_data(a, 0, 0);
  a.peer.on_timer(5 * kMs, a.sink);
  const wire::HeaderFields probe = pure_ack(a, 5 * kMs);
  // The RTO backed off: the resend waits twice as long for the answer.
  EXPECT_EQ(a.peer.next_deadline(), 15 * kMs);
  a.peer.on_timer(15 * kMs - 1, a.sink);
  EXPECT_TRUE(a.sink.lost.empty());
  a.peer.on_timer(15 * kMs, a.sink);
  ASSERT_EQ(a.sink.lost.size(), 1u);
  EXPECT_EQ(a.sink.lost[0].kind, LossKind::kTimeout);
  EXPECT_FALSE(a.peer.ack_due(15 * kMs));  // the resend asks now, not another probe
  // A late answer to the old probe (B read nothing: the packet was lost)
  // declares nothing twice.
  b.peer.on_packet(probe, 16 * kMs, b.sink);
  a.peer.on_packet(pure_ack(b, 16 * kMs), 16 * kMs, a.sink);
  EXPECT_EQ(a.sink.lost.size(), 1u);
  EXPECT_EQ(a.peer.counters().tx.probe_answers, 0u);
}

TEST(Peer, OnlyAProbeWithATokenGetsAnAnswer) {
  Endpoint a(1, 0), b(5, 0);
  handshake(a, b, 0);
  // An answer carrying kAckRequest (a persist probe at once) is not a probe
  // to echo, and an answer nobody asked for changes nothing.
  wire::HeaderFields h = pure_ack(a, 0);
  h.flags |= wf::kAckRequest | wf::kAnswer;
  h.offset = 77;
  b.peer.on_packet(h, 0, b.sink);
  ASSERT_TRUE(b.peer.ack_due(0));
  const wire::HeaderFields reply = pure_ack(b, 0);
  EXPECT_EQ(reply.flags & wf::kAnswer, 0);
  EXPECT_EQ(reply.offset, 0u);
  send_data(a, 0, 0);
  h = pure_ack(b, 0);
  h.flags |= wf::kAnswer;
  h.offset = 1;
  a.peer.on_packet(h, 0, a.sink);
  EXPECT_TRUE(a.sink.lost.empty());
  EXPECT_EQ(a.peer.counters().tx.probe_answers, 0u);
}

TEST(Peer, RejectsAZeroLocalEpoch) {
  EXPECT_THROW(Peer(test::test_config(), 0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace mercury::transport
