// PeerSender driven with synthetic ACKs and a fake clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "transport/test_util.h"
#include "transport/transport.h"

namespace mercury::transport {
namespace {

using test::kMs;
using test::kUs;
using test::RecordingSink;
using test::sack_range;
using test::slice_of;
using test::test_params;
namespace wf = wire::flags;

constexpr uint32_t kIsn = 1000;

// Sends n slices (slice_of(first..first+n-1)) at time `now`; returns their seqs.
std::vector<uint32_t> send_n(PeerSender& s, uint32_t n, Tick now, uint32_t first = 0) {
  std::vector<uint32_t> seqs;
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_TRUE(s.can_send());
    seqs.push_back(s.on_send(slice_of(first + i), now).seq);
  }
  return seqs;
}

// Every slice in `acked` is distinct (each reported once).
bool all_distinct(const std::vector<SliceRef>& acked) {
  std::set<uint64_t> tokens;
  for (const auto& s : acked) tokens.insert(s.msg_token);
  return tokens.size() == acked.size();
}

TEST(SeqArithmetic, ComparesAcrossTheWrap) {
  EXPECT_TRUE(seq_before(0xfffffff0u, 0x00000010u));
  EXPECT_FALSE(seq_before(0x00000010u, 0xfffffff0u));
  EXPECT_EQ(seq_diff(0x00000005u, 0xfffffffbu), 10);
  EXPECT_EQ(seq_diff(0xfffffffbu, 0x00000005u), -10);
  EXPECT_TRUE(epoch_newer(1, 0xffff));
  EXPECT_FALSE(epoch_newer(0xffff, 1));
  EXPECT_FALSE(epoch_newer(7, 7));
}

TEST(PeerSender, NumbersPacketsAndStopsAtTheWindow) {
  RecordingSink sink;
  PeerSender s(test_params(16), kIsn, 0);
  for (uint32_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(s.can_send());
    const TxStamp st = s.on_send(slice_of(i), 0);
    EXPECT_EQ(st.seq, kIsn + i);
    // Only the packet that fills the window asks for an immediate ACK.
    EXPECT_EQ((st.flags & wf::kAckRequest) != 0, i == 15) << i;
    EXPECT_EQ(st.flags & wf::kRetransmit, 0);
  }
  EXPECT_FALSE(s.can_send());
  EXPECT_EQ(s.outstanding(), 16u);
  EXPECT_EQ(s.in_flight(), 16u);
  s.on_ack(kIsn + 4, 0, 10 * kUs, sink);
  EXPECT_TRUE(s.can_send());
  EXPECT_EQ(s.counters().packets_sent, 16u);
}

TEST(PeerSender, CumulativeAckReportsEachSliceOnce) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 8, 0);
  AckResult r = s.on_ack(kIsn + 4, 0, 10 * kUs, sink);
  EXPECT_EQ(r.newly_acked, 4u);
  EXPECT_TRUE(r.rtt_sampled);
  ASSERT_EQ(sink.acked.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(sink.acked[i], slice_of(i));
  // The same ACK again, and an older one, deliver nothing new.
  EXPECT_EQ(s.on_ack(kIsn + 4, 0, 11 * kUs, sink).newly_acked, 0u);
  EXPECT_EQ(s.on_ack(kIsn + 2, 0, 12 * kUs, sink).newly_acked, 0u);
  EXPECT_EQ(s.counters().acks_old, 1u);
  EXPECT_EQ(s.on_ack(kIsn + 8, 0, 13 * kUs, sink).newly_acked, 4u);
  EXPECT_EQ(sink.acked.size(), 8u);
  EXPECT_TRUE(all_distinct(sink.acked));
  EXPECT_EQ(s.outstanding(), 0u);
  EXPECT_TRUE(sink.lost.empty());
}

TEST(PeerSender, SackedSlicesAreNotReportedAgainByTheCumulativeAck) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 4, 0);
  // kIsn+1 and kIsn+2 arrived out of order; kIsn is still missing.
  AckResult r = s.on_ack(kIsn, sack_range(kIsn, kIsn + 1, kIsn + 2), 10 * kUs, sink);
  EXPECT_EQ(r.newly_acked, 2u);
  r = s.on_ack(kIsn + 4, 0, 11 * kUs, sink);
  EXPECT_EQ(r.newly_acked, 2u);  // kIsn and kIsn+3 only
  EXPECT_EQ(sink.acked.size(), 4u);
  EXPECT_TRUE(all_distinct(sink.acked));
}

TEST(PeerSender, IgnoresAnAckForSomethingNeverSent) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 3, 0);
  const AckResult r = s.on_ack(kIsn + 10, ~0ull, 10 * kUs, sink);
  EXPECT_TRUE(r.ignored);
  EXPECT_TRUE(sink.acked.empty());
  EXPECT_EQ(s.counters().acks_invalid, 1u);
  // SACK bits beyond what was sent are ignored too.
  EXPECT_EQ(s.on_ack(kIsn, ~0ull, 11 * kUs, sink).newly_acked, 2u);
}

TEST(PeerSender, FastRetransmitResendsExactlyTheLostPacket) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 10, 0);
  // kIsn+3 lost: the receiver acks kIsn+3 and SACKs kIsn+4..kIsn+9.
  const AckResult r = s.on_ack(kIsn + 3, sack_range(kIsn + 3, kIsn + 4, kIsn + 9), 20 * kUs, sink);
  EXPECT_EQ(r.newly_lost, 1u);
  ASSERT_EQ(sink.lost.size(), 1u);  // not go-back-N
  EXPECT_EQ(sink.lost[0].seq, kIsn + 3);
  EXPECT_EQ(sink.lost[0].slice, slice_of(3));
  EXPECT_EQ(sink.lost[0].kind, LossKind::kFast);
  EXPECT_EQ(sink.lost[0].slice.priority, slice_of(3).priority);  // keeps its priority

  SliceRef again;
  TxStamp st;
  ASSERT_EQ(s.on_resend(kIsn + 3, 21 * kUs, again, st), Resend::kSend);
  EXPECT_EQ(st.seq, kIsn + 3);  // same sequence number: it fills the hole
  EXPECT_NE(st.flags & wf::kRetransmit, 0);
  EXPECT_EQ(again, slice_of(3));
  // A second request for the same loss is refused.
  EXPECT_EQ(s.on_resend(kIsn + 3, 22 * kUs, again, st), Resend::kNotNeeded);

  s.on_ack(kIsn + 10, 0, 40 * kUs, sink);
  EXPECT_EQ(sink.acked.size(), 10u);
  EXPECT_TRUE(all_distinct(sink.acked));
  EXPECT_EQ(s.counters().retransmits_fast, 1u);
  EXPECT_EQ(s.counters().losses_fast, 1u);
  EXPECT_EQ(s.counters().retransmits_timeout, 0u);
}

TEST(PeerSender, FindsEachOfSeveralHoles) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 12, 0);
  uint64_t sack = sack_range(kIsn + 2, kIsn + 3, kIsn + 11);
  sack &= ~(uint64_t{1} << (kIsn + 6 - kIsn - 2 - 1));  // kIsn+6 missing too
  s.on_ack(kIsn + 2, sack, 20 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), (std::vector<uint32_t>{kIsn + 2, kIsn + 6}));
  uint32_t seq = 0;
  EXPECT_TRUE(s.find_lost(slice_of(6).msg_token, slice_of(6).offset, seq));
  EXPECT_EQ(seq, kIsn + 6);
  EXPECT_FALSE(s.find_lost(slice_of(5).msg_token, slice_of(5).offset, seq));
}

TEST(PeerSender, ReorderingBelowTheThresholdIsNotALoss) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 10, 0);
  // kIsn+3 overtaken by two later packets (depth 2 < threshold 3).
  s.on_ack(kIsn + 3, sack_range(kIsn + 3, kIsn + 4, kIsn + 5), 20 * kUs, sink);
  EXPECT_TRUE(sink.lost.empty());
  s.on_ack(kIsn + 6, 0, 21 * kUs, sink);
  s.on_ack(kIsn + 10, 0, 22 * kUs, sink);
  EXPECT_TRUE(sink.lost.empty());
  EXPECT_EQ(sink.acked.size(), 10u);
  EXPECT_EQ(s.counters().loss_episodes, 0u);
}

TEST(PeerSender, ReorderingAtTheThresholdIsALoss) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 10, 0);
  s.on_ack(kIsn + 3, sack_range(kIsn + 3, kIsn + 4, kIsn + 6), 20 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), std::vector<uint32_t>{kIsn + 3});
}

TEST(PeerSender, LateOriginalCancelsTheResendAndRaisesTheThreshold) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 10, 0);
  s.on_ack(kIsn + 3, sack_range(kIsn + 3, kIsn + 4, kIsn + 6), 20 * kUs, sink);
  ASSERT_EQ(sink.lost.size(), 1u);
  // The "lost" packet arrives before the glue got round to resending it.
  s.on_ack(kIsn + 7, 0, 21 * kUs, sink);
  SliceRef again;
  TxStamp st;
  EXPECT_EQ(s.on_resend(kIsn + 3, 22 * kUs, again, st), Resend::kNotNeeded);
  EXPECT_EQ(s.counters().false_losses, 1u);
  EXPECT_EQ(s.counters().reorder_threshold, 4u);
  EXPECT_EQ(s.counters().retransmits_fast, 0u);
  EXPECT_EQ(sink.acked.size(), 7u);
  EXPECT_TRUE(all_distinct(sink.acked));
  // Depth 3 is now tolerated.
  send_n(s, 4, 30 * kUs, 10);
  sink.clear();
  s.on_ack(kIsn + 7, sack_range(kIsn + 7, kIsn + 8, kIsn + 10), 50 * kUs, sink);
  EXPECT_EQ(sink.acked.size(), 3u);
  EXPECT_TRUE(sink.lost.empty());
}

TEST(PeerSender, AResentPacketIsJudgedOnlyByLaterTransmissions) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 8, 0);
  const uint64_t sack = sack_range(kIsn, kIsn + 1, kIsn + 7);
  s.on_ack(kIsn, sack, 20 * kUs, sink);
  ASSERT_EQ(sink.lost_seqs(), std::vector<uint32_t>{kIsn});
  SliceRef again;
  TxStamp st;
  ASSERT_EQ(s.on_resend(kIsn, 21 * kUs, again, st), Resend::kSend);
  // The same SACKs repeated say nothing about the resend.
  s.on_ack(kIsn, sack, 22 * kUs, sink);
  EXPECT_EQ(sink.lost.size(), 1u);
  // Three packets sent after the resend arrive while kIsn is still missing:
  // the resend was lost as well.
  send_n(s, 3, 30 * kUs, 8);
  s.on_ack(kIsn, sack | sack_range(kIsn, kIsn + 8, kIsn + 10), 60 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), (std::vector<uint32_t>{kIsn, kIsn}));
}

TEST(PeerSender, RttEstimateFollowsRfc6298) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  EXPECT_EQ(s.rto(), 5 * kMs);  // initial_rto before any sample
  send_n(s, 1, 0);
  s.on_ack(kIsn + 1, 0, 2 * kMs, sink);  // R = 2 ms
  EXPECT_EQ(s.counters().srtt, 2 * kMs);
  EXPECT_EQ(s.counters().rttvar, 1 * kMs);
  EXPECT_EQ(s.rto(), 6 * kMs);  // SRTT + 4 RTTVAR
  send_n(s, 1, 10 * kMs);
  s.on_ack(kIsn + 2, 0, 14 * kMs, sink);        // R = 4 ms
  EXPECT_EQ(s.counters().rttvar, 1'250 * kUs);  // 3/4 * 1 + 1/4 * |2 - 4|
  EXPECT_EQ(s.counters().srtt, 2'250 * kUs);    // 7/8 * 2 + 1/8 * 4
  EXPECT_EQ(s.rto(), 7'250 * kUs);
  // Tiny RTTs are clamped to min_rto.
  for (int i = 0; i < 50; ++i) {
    send_n(s, 1, (20 + i) * kMs);
    s.on_ack(s.next_seq(), 0, (20 + i) * kMs + 10 * kUs, sink);
  }
  EXPECT_EQ(s.rto(), 1 * kMs);
  EXPECT_EQ(s.counters().min_rtt, 10 * kUs);
}

TEST(PeerSender, RtoBacksOffDoublingAndResetsOnAFreshSample) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 1, 0);
  EXPECT_EQ(s.next_deadline(), 5 * kMs);
  s.on_timer(5 * kMs - 1, sink);
  EXPECT_TRUE(sink.lost.empty());
  s.on_timer(5 * kMs, sink);
  ASSERT_EQ(sink.lost.size(), 1u);
  EXPECT_EQ(sink.lost[0].kind, LossKind::kTimeout);
  EXPECT_EQ(s.rto(), 10 * kMs);
  SliceRef again;
  TxStamp st;
  ASSERT_EQ(s.on_resend(kIsn, 5 * kMs, again, st), Resend::kSend);
  s.on_timer(15 * kMs - 1, sink);
  EXPECT_EQ(sink.lost.size(), 1u);
  s.on_timer(15 * kMs, sink);
  EXPECT_EQ(sink.lost.size(), 2u);
  EXPECT_EQ(s.rto(), 20 * kMs);
  ASSERT_EQ(s.on_resend(kIsn, 15 * kMs, again, st), Resend::kSend);
  // Karn: the ACK of a resent packet is ambiguous, no sample, back-off stays.
  const AckResult r = s.on_ack(kIsn + 1, 0, 16 * kMs, sink);
  EXPECT_FALSE(r.rtt_sampled);
  EXPECT_EQ(s.rto(), 20 * kMs);
  // A packet sent once gives a sample and ends the back-off.
  send_n(s, 1, 16 * kMs);
  EXPECT_TRUE(s.on_ack(kIsn + 2, 0, 16 * kMs + 500 * kUs, sink).rtt_sampled);
  EXPECT_EQ(s.counters().backoff, 0u);
  EXPECT_EQ(s.rto(), 1'500 * kUs);  // 0.5 ms + 4 * 0.25 ms
  EXPECT_EQ(s.counters().rto_expirations, 2u);
  EXPECT_EQ(s.counters().retransmits_timeout, 2u);
}

TEST(PeerSender, BackOffSaturatesAtMaxRto) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 1, 0);
  Tick now = 0;
  for (int i = 0; i < 12; ++i) {
    now = s.next_deadline();
    s.on_timer(now, sink);
    SliceRef again;
    TxStamp st;
    ASSERT_EQ(s.on_resend(kIsn, now, again, st), Resend::kSend);
    if (now > 900 * kMs) break;  // stay clear of the peer timeout
  }
  EXPECT_EQ(s.rto(), 200 * kMs);
}

TEST(PeerSender, RtoMarksOnlyPacketsOutstandingForAFullRto) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 1, 0);
  send_n(s, 1, 3 * kMs, 1);
  s.on_timer(5 * kMs, sink);
  EXPECT_EQ(sink.lost_seqs(), std::vector<uint32_t>{kIsn});
  EXPECT_EQ(s.in_flight(), 1u);
}

TEST(PeerSender, LostAcksAreRecoveredByTheTimerWithoutDoubleReports) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 4, 0);
  // The receiver got all four, but every ACK was lost.
  s.on_timer(5 * kMs, sink);
  ASSERT_EQ(sink.lost.size(), 4u);
  for (const auto& l : sink.lost) {
    SliceRef again;
    TxStamp st;
    ASSERT_EQ(s.on_resend(l.seq, 5 * kMs, again, st), Resend::kSend);
  }
  s.on_ack(kIsn + 4, 0, 5 * kMs + 20 * kUs, sink);
  EXPECT_EQ(sink.acked.size(), 4u);
  EXPECT_TRUE(all_distinct(sink.acked));
  EXPECT_EQ(s.outstanding(), 0u);
  EXPECT_EQ(s.next_deadline(), 0u);  // nothing armed any more
}

TEST(PeerSender, CwndShrinksByThePacketsLostAtMostHalfPerEpisodeAndGrowsBack) {
  RecordingSink sink;
  PeerSender s(test_params(16), kIsn, 0);
  EXPECT_EQ(s.cwnd(), 16u);
  send_n(s, 16, 0);
  // Two random losses in one window: one episode, cwnd one packet less per loss.
  s.on_ack(kIsn, sack_range(kIsn, kIsn + 2, kIsn + 15), 20 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), (std::vector<uint32_t>{kIsn, kIsn + 1}));
  EXPECT_EQ(s.cwnd(), 14u);
  EXPECT_EQ(s.counters().loss_episodes, 1u);
  EXPECT_FALSE(s.can_send());  // the window is full behind the hole
  EXPECT_TRUE(s.can_resend());
  for (const auto& l : sink.lost) {
    SliceRef again;
    TxStamp st;
    ASSERT_EQ(s.on_resend(l.seq, 21 * kUs, again, st), Resend::kSend);
  }
  s.on_ack(kIsn + 16, 0, 40 * kUs, sink);
  EXPECT_EQ(s.counters().loss_episodes, 1u);
  // Additive increase: +1 per cwnd packets acked, up to the window.
  Tick now = 100 * kUs;
  uint32_t next = 16;
  for (uint32_t expect : {15u, 16u, 16u}) {
    const uint32_t n = s.cwnd();
    send_n(s, n, now, next);
    next += n;
    s.on_ack(s.next_seq(), 0, now + 20 * kUs, sink);
    now += 100 * kUs;
    EXPECT_EQ(s.cwnd(), expect);
  }
  // A congested queue drops a burst: 12 of 16 lost, and the cut stops at half.
  sink.clear();
  const uint32_t first = s.next_seq();
  send_n(s, 16, now, next);
  s.on_ack(first, sack_range(first, first + 12, first + 15), now + 20 * kUs, sink);
  EXPECT_EQ(sink.lost.size(), 12u);
  EXPECT_EQ(s.cwnd(), 8u);
  EXPECT_EQ(s.counters().loss_episodes, 2u);
  EXPECT_TRUE(sink.failed.empty());
}

TEST(PeerSender, EachTimeoutHalvesDownToTheFloor) {
  RecordingSink sink;
  PeerSender s(test_params(16), kIsn, 0);
  Tick now = 0;
  uint32_t next = 0;
  std::vector<uint32_t> cwnds;
  for (int round = 0; round < 6; ++round) {
    const uint32_t n = s.cwnd();
    const uint32_t first = s.next_seq();
    send_n(s, n, now, next);
    next += n;
    // Every packet and every ACK lost: the timer finds them.
    sink.lost.clear();
    now += s.rto();
    s.on_timer(now, sink);
    ASSERT_EQ(sink.lost.size(), n);
    EXPECT_EQ(s.cwnd(), std::max(2u, n / 2)) << "round " << round;  // cwnd_floor 2
    cwnds.push_back(s.cwnd());
    for (const auto& l : sink.lost) {
      SliceRef again;
      TxStamp st;
      if (s.on_resend(l.seq, now, again, st) != Resend::kSend) break;  // cwnd is full
    }
    s.on_ack(first + n, 0, now + 20 * kUs, sink);  // all arrived: the episode ends
    now += 100 * kUs;
  }
  EXPECT_EQ(cwnds.front(), 8u);
  EXPECT_EQ(cwnds.back(), 2u);
  EXPECT_EQ(s.counters().loss_episodes, 6u);
}

// The stall once seen under 2 % loss (docs/transport.md, "The left edge"):
// a window above 65, a lost low-priority packet at the left edge, and urgent
// data sent past the receiver's 64-packet SACK horizon. Those packets arrive
// but stay "in flight" until the hole fills; once they fill cwnd, a glue that
// resends most urgent first (as the strict scheduler does) resends them on
// every RTO and the hole waits for ever. Fake clock, and a receiver that
// reports what the header can carry. The glue first serves by priority only,
// as the endpoint did, until the trap has held over three RTOs; then it
// follows the contract (left_edge_lost first, room or not), and everything is
// delivered.
TEST(PeerSender, ALostLeftEdgeIsResentWhenPacketsPastTheSackHorizonFillCwnd) {
  RecordingSink sink;
  PeerSender s(test_params(128), kIsn, 0);
  constexpr uint32_t kSlices = 600;
  // Slice i is one packet; every 150th is at priority 7 and its first
  // transmission is lost, with those of the 40 urgent (priority 0) ones after
  // it (a burst: cwnd halves); the rest arrive.
  auto low = [](uint32_t i) { return i % 150 == 0; };
  auto dropped = [](uint32_t i) { return i % 150 <= 40; };
  auto slice = [&](uint32_t i) {
    return SliceRef{.msg_token = 100 + i,
                    .offset = 0,
                    .len = 1000,
                    .priority = static_cast<uint8_t>(low(i) ? 7 : 0)};
  };
  std::set<uint32_t> received;       // offsets from kIsn
  std::map<uint32_t, uint8_t> lost;  // seq -> priority, waiting for a resend
  uint32_t next = 0;
  Tick now = 0;
  auto transmit = [&](uint32_t seq, bool first, const SliceRef& ref) {
    if (!(first && dropped(static_cast<uint32_t>(ref.msg_token - 100)))) {
      received.insert(seq - kIsn);
    }
  };
  auto resend = [&](uint32_t seq) {
    SliceRef ref;
    TxStamp st;
    const Resend r = s.on_resend(seq, now, ref, st);
    if (r == Resend::kSend) transmit(seq, false, ref);
    if (r != Resend::kNoRoom) lost.erase(seq);
    return r;
  };
  bool left_edge_first = false;
  uint64_t rtos_when_trapped = UINT64_MAX;
  for (int round = 0; round < 100'000 && sink.acked.size() < kSlices; ++round) {
    now += 10 * kUs;
    uint32_t edge;
    if (!left_edge_first && s.left_edge_lost(edge) && !s.can_resend()) {
      // Trapped: cwnd is full of packets past the SACK horizon (seqs 65 and
      // more beyond the hole), which cannot be acknowledged while it lasts.
      EXPECT_GE(s.outstanding(), 65 + s.in_flight());
      rtos_when_trapped = std::min(rtos_when_trapped, s.counters().rto_expirations);
      if (s.counters().rto_expirations >= rtos_when_trapped + 3) {
        // It held over three RTOs: the priority order alone never resends
        // the hole. It may go without room (before the fix: kNoRoom).
        left_edge_first = true;
        ASSERT_EQ(resend(edge), Resend::kSend);
      }
    }
    if (left_edge_first && s.left_edge_lost(edge)) {
      EXPECT_EQ(resend(edge), Resend::kSend);
    }
    // By priority, as the strict scheduler serves them: urgent resends,
    // urgent new data, low-priority resends; a resend only while there is
    // room (the endpoint asks the scheduler only for a peer with room).
    for (uint8_t level : {0, 7}) {
      for (auto it = lost.begin(); it != lost.end() && s.can_resend();) {
        const auto [seq, prio] = *it++;
        if (prio == level) resend(seq);
      }
      while (level == 0 && next < kSlices && s.can_send()) {
        const TxStamp st = s.on_send(slice(next), now);
        transmit(st.seq, true, slice(next++));
      }
    }
    // The receiver's ACK: cumulative, plus the 64 packets after it.
    uint32_t cum = 0;
    while (received.count(cum) != 0) ++cum;
    uint64_t sack = 0;
    for (uint32_t k = 0; k < 64; ++k) {
      if (received.count(cum + 1 + k) != 0) sack |= uint64_t{1} << k;
    }
    const size_t before = sink.lost.size();
    s.on_ack(kIsn + cum, sack, now + 5 * kUs, sink);
    s.on_timer(now + 5 * kUs, sink);
    for (size_t k = before; k < sink.lost.size(); ++k) {
      lost[sink.lost[k].seq] = sink.lost[k].slice.priority;
    }
  }
  EXPECT_TRUE(left_edge_first) << "the scenario must reach a full cwnd behind a lost left edge";
  ASSERT_EQ(sink.acked.size(), kSlices);
  std::set<uint64_t> tokens;
  for (const auto& a : sink.acked) tokens.insert(a.msg_token);
  EXPECT_EQ(tokens.size(), kSlices);  // each slice acked once
  EXPECT_TRUE(sink.failed.empty());
  EXPECT_FALSE(s.dead());
  EXPECT_EQ(s.outstanding(), 0u);
}

TEST(PeerSender, OnlyTheLeftEdgeMayBeResentWithoutRoom) {
  RecordingSink sink;
  PeerSender s(test_params(16), kIsn, 0);
  send_n(s, 4, 0);
  uint32_t edge = 0;
  EXPECT_FALSE(s.left_edge_lost(edge));  // nothing lost yet
  s.on_timer(5 * kMs, sink);             // all four lost
  ASSERT_TRUE(s.left_edge_lost(edge));
  EXPECT_EQ(edge, kIsn);
  SliceRef again;
  TxStamp st;
  // The RTO halved cwnd to 8: fill it with the other resends and new data.
  for (uint32_t seq = kIsn + 1; seq < kIsn + 4; ++seq) {
    ASSERT_EQ(s.on_resend(seq, 5 * kMs, again, st), Resend::kSend);
  }
  while (s.can_send()) s.on_send(slice_of(10 + s.next_seq()), 5 * kMs);
  ASSERT_FALSE(s.can_resend());
  // Another lost packet would wait for room; the left edge goes anyway, and
  // asks for an immediate ACK.
  ASSERT_EQ(s.on_resend(kIsn, 5 * kMs, again, st), Resend::kSend);
  EXPECT_EQ(again, slice_of(0));
  EXPECT_NE(st.flags & wf::kAckRequest, 0);
  EXPECT_FALSE(s.left_edge_lost(edge));
}

TEST(PeerSender, AnUnansweredLeftEdgeResendIsProbedBeforeTheRto) {
  RecordingSink sink;
  PeerSender s(test_params(16), kIsn, 0);
  send_n(s, 16, 0);
  // kIsn lost; the rest arrive 20 us later (SRTT 20 us): fast loss, window full.
  s.on_ack(kIsn, sack_range(kIsn, kIsn + 1, kIsn + 15), 20 * kUs, sink);
  ASSERT_EQ(sink.lost_seqs(), std::vector<uint32_t>{kIsn});
  EXPECT_EQ(s.counters().srtt, 20 * kUs);
  EXPECT_EQ(s.counters().rttvar, 10 * kUs);
  const uint32_t cwnd = s.cwnd();
  SliceRef again;
  TxStamp st;
  Tick t = 30 * kUs;
  ASSERT_EQ(s.on_resend(kIsn, t, again, st), Resend::kSend);
  // The resend is lost too. Probe timeout: max(2 SRTT, SRTT + 4 RTTVAR) +
  // ack delay = max(40, 20 + 40) + 20 = 80 us, far below the RTO (1 ms at
  // least).
  sink.clear();
  s.on_timer(t + 80 * kUs - 1, sink);
  EXPECT_TRUE(sink.lost.empty());
  EXPECT_EQ(s.next_deadline(), t + 80 * kUs);
  s.on_timer(t + 80 * kUs, sink);
  ASSERT_EQ(sink.lost.size(), 1u);
  EXPECT_EQ(sink.lost[0].seq, kIsn);
  EXPECT_EQ(sink.lost[0].kind, LossKind::kProbe);
  EXPECT_EQ(s.counters().tail_probes, 1u);
  EXPECT_EQ(s.cwnd(), cwnd);  // not a congestion signal
  uint32_t edge;
  ASSERT_TRUE(s.left_edge_lost(edge));
  // The second probe waits twice as long.
  t += 80 * kUs;
  ASSERT_EQ(s.on_resend(kIsn, t, again, st), Resend::kSend);
  s.on_timer(t + 160 * kUs - 1, sink);
  EXPECT_EQ(sink.lost.size(), 1u);
  s.on_timer(t + 160 * kUs, sink);
  EXPECT_EQ(sink.lost.size(), 2u);
  ASSERT_EQ(s.on_resend(kIsn, t + 160 * kUs, again, st), Resend::kSend);
  // This one arrives: every slice acked once, no timeout needed.
  s.on_ack(kIsn + 16, 0, t + 180 * kUs, sink);
  ASSERT_EQ(sink.acked.size(), 1u);  // the 15 others were SACKed before
  EXPECT_EQ(sink.acked[0], slice_of(0));
  EXPECT_EQ(s.counters().slices_acked, 16u);
  EXPECT_EQ(s.counters().rto_expirations, 0u);
  EXPECT_EQ(s.outstanding(), 0u);
  // A first transmission is never probed (the loss rule and the RTO cover it).
  send_n(s, 1, 1 * kMs, 16);
  sink.clear();
  s.on_timer(1 * kMs + 500 * kUs, sink);
  EXPECT_TRUE(sink.lost.empty());
}

TEST(PeerSender, DeadPeerFailsEveryPendingSliceOnce) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 6, 0);
  // kIsn+5 was SACKed (acked, not failed later); the timer marks the rest lost.
  s.on_ack(kIsn, sack_range(kIsn, kIsn + 5, kIsn + 5), 10 * kUs, sink);
  s.on_timer(5 * kMs, sink);
  EXPECT_EQ(sink.lost.size(), 5u);
  // One resend is in flight, the others wait in the glue's queue.
  SliceRef again;
  TxStamp st;
  ASSERT_EQ(s.on_resend(kIsn + 1, 5 * kMs, again, st), Resend::kSend);
  s.on_timer(10 * kUs + 1'000 * kMs - 1, sink);  // progress was at 10 us
  EXPECT_FALSE(s.dead());
  s.on_timer(10 * kUs + 1'000 * kMs, sink);
  EXPECT_TRUE(s.dead());
  ASSERT_EQ(sink.failed.size(), 5u);
  std::set<uint64_t> failed_tokens;
  for (const auto& f : sink.failed) {
    EXPECT_EQ(f.why, FailReason::kPeerTimeout);
    failed_tokens.insert(f.slice.msg_token);
  }
  EXPECT_EQ(failed_tokens.size(), 5u);
  EXPECT_EQ(failed_tokens.count(slice_of(5).msg_token), 0u);
  EXPECT_FALSE(s.can_send());
  EXPECT_TRUE(s.on_ack(kIsn + 6, 0, 2'000 * kMs, sink).ignored);
  EXPECT_EQ(s.on_resend(kIsn + 2, 2'000 * kMs, again, st), Resend::kNotNeeded);
  EXPECT_EQ(s.counters().peer_timeouts, 1u);
  EXPECT_EQ(sink.acked.size(), 1u);
}

TEST(PeerSender, IdlePeerIsNotDeclaredDeadAndTheClockStartsWithData) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  s.on_timer(10'000 * kMs, sink);
  EXPECT_FALSE(s.dead());
  EXPECT_EQ(s.next_deadline(), 0u);
  send_n(s, 1, 10'000 * kMs);
  s.on_timer(11'000 * kMs - 1, sink);
  EXPECT_FALSE(s.dead());
  s.on_timer(11'000 * kMs, sink);
  EXPECT_TRUE(s.dead());
  EXPECT_EQ(sink.failed.size(), 1u);
}

TEST(PeerSender, SequenceNumbersWrapAround) {
  RecordingSink sink;
  const uint32_t isn = 0xfffffff8u;
  PeerSender s(test_params(16), isn, 0);
  const auto seqs = send_n(s, 16, 0);
  EXPECT_EQ(seqs.front(), 0xfffffff8u);
  EXPECT_EQ(seqs.back(), 0x00000007u);
  // 0x00000001 is lost: cumulative ack stops there, the rest is SACKed.
  const uint32_t hole = 0x00000001u;
  s.on_ack(hole, sack_range(hole, hole + 1, 0x00000007u), 20 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), std::vector<uint32_t>{hole});
  EXPECT_EQ(sink.acked.size(), 15u);
  SliceRef again;
  TxStamp st;
  ASSERT_EQ(s.on_resend(hole, 21 * kUs, again, st), Resend::kSend);
  s.on_ack(0x00000008u, 0, 40 * kUs, sink);
  EXPECT_EQ(sink.acked.size(), 16u);
  EXPECT_TRUE(all_distinct(sink.acked));
  EXPECT_EQ(s.outstanding(), 0u);
  EXPECT_TRUE(s.can_send());
}

TEST(PeerSender, RestartFailsPendingAndStartsAFreshStream) {
  RecordingSink sink;
  PeerSender s(test_params(), kIsn, 0);
  send_n(s, 3, 0);
  s.on_ack(kIsn + 1, 0, 10 * kUs, sink);
  s.restart(5000, 20 * kUs, FailReason::kPeerRestarted, sink);
  EXPECT_EQ(sink.failed.size(), 2u);
  for (const auto& f : sink.failed) EXPECT_EQ(f.why, FailReason::kPeerRestarted);
  EXPECT_EQ(s.next_seq(), 5000u);
  EXPECT_EQ(s.outstanding(), 0u);
  EXPECT_EQ(s.on_send(slice_of(9), 30 * kUs).seq, 5000u);
  // The RTT estimate survives: same path.
  EXPECT_EQ(s.counters().rtt_samples, 1u);
}

// Differential test against a brute-force oracle: random arrivals, ACKs
// built from them (cumulative + 64-bit SACK, some reordered so an older ACK
// comes late), thresholds 1..8 held fixed. After every ACK, the packets the
// sender has declared lost and not seen delivered must be exactly those with
// at least `threshold` later-sent packets reported delivered, and every slice
// is reported acked exactly once.
TEST(PeerSenderOracle, LossRuleMatchesABruteForceCount) {
  std::mt19937 rng(2024);
  for (int round = 0; round < 200; ++round) {
    const uint32_t threshold = 1 + rng() % 8;
    const uint32_t window = 8 + rng() % 120;
    Config c = test::test_config(window);
    c.reorder_threshold = threshold;
    c.max_reorder_threshold = threshold;  // no adaptation: the oracle's rule is fixed
    const uint32_t isn = rng();
    PeerSender s(resolve(c), isn, 0);
    RecordingSink sink;
    std::set<uint32_t> arrived;    // offsets (seq - isn) that reached the receiver
    std::set<uint32_t> delivered;  // offsets reported to the sender
    std::set<uint32_t> lost;       // offsets declared lost, not since delivered
    std::vector<std::pair<uint32_t, uint64_t>> acks;  // ACKs built, not yet fed
    uint32_t sent = 0;
    Tick now = 0;
    for (int step = 0; step < 300; ++step) {
      now += 10 * kUs;
      const unsigned action = rng() % 4;
      if (action == 0 && s.can_send()) {
        s.on_send(slice_of(sent++), now);
      } else if (action == 1 && sent != 0) {
        // Some in-flight packets arrive (never the ones declared lost: no resends).
        for (uint32_t k = 0; k < 4; ++k) arrived.insert(rng() % sent);
      } else if (action == 2) {
        uint32_t cum = 0;
        while (arrived.count(cum)) ++cum;
        uint64_t sack = 0;
        for (uint32_t i = 0; i < 64; ++i) {
          if (arrived.count(cum + 1 + i)) sack |= uint64_t{1} << i;
        }
        acks.emplace_back(cum, sack);
      } else if (action == 3 && !acks.empty()) {
        // Feed a pending ACK, usually the newest, sometimes an older one.
        const size_t i = rng() % 4 == 0 ? rng() % acks.size() : acks.size() - 1;
        const auto [cum, sack] = acks[i];
        acks.erase(acks.begin() + static_cast<ptrdiff_t>(i));
        sink.clear();
        s.on_ack(isn + cum, sack, now, sink);
        for (const auto& a : sink.acked) {
          const uint32_t off = static_cast<uint32_t>(a.msg_token - 100);
          ASSERT_TRUE(delivered.insert(off).second) << "acked twice: " << off;
          lost.erase(off);
        }
        for (const auto& l : sink.lost) {
          ASSERT_EQ(l.kind, LossKind::kFast);
          ASSERT_TRUE(lost.insert(l.seq - isn).second);
        }
        // The oracle.
        for (uint32_t off = 0; off < sent; ++off) {
          if (delivered.count(off)) continue;
          const auto later =
              static_cast<uint32_t>(std::distance(delivered.upper_bound(off), delivered.end()));
          ASSERT_EQ(later >= threshold, lost.count(off) == 1)
              << "round " << round << " offset " << off << " later " << later << " threshold "
              << threshold;
        }
      }
    }
  }
}

TEST(PeerSenderConfig, WindowDerivesFromTheLinkWithFloorAndCeiling) {
  // 10 Gbit/s x 50 us = 62500 B = 6.9 packets of 9000 B -> 7, under the floor 8.
  EXPECT_EQ(bdp_window(10'000'000'000, 50, 9000, 8, 512), 8u);
  // 100 Gbit/s x 50 us / 1500 B = 416.7 -> 417.
  EXPECT_EQ(bdp_window(100'000'000'000, 50, 1500, 8, 512), 417u);
  EXPECT_EQ(bdp_window(400'000'000'000, 100, 1500, 8, 512), 512u);
  Config c = test::test_config(0);
  c.link_bits_per_sec = 100'000'000'000;
  c.base_rtt_us = 50;
  c.packet_bytes = 1500;
  const Params p = resolve(c);
  EXPECT_EQ(p.window, 417u);
  EXPECT_EQ(p.rx_window, 417u);
  EXPECT_EQ(p.rx_messages, 417u + 64);
  EXPECT_EQ(PeerSender(p, 0, 0).window(), 417u);
}

TEST(PeerSenderConfig, RejectsInconsistentSettingsNamingTheField) {
  auto message_of = [](const Config& c) -> std::string {
    try {
      resolve(c);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  Config c = test::test_config();
  c.tsc_hz = 0;
  EXPECT_NE(message_of(c).find("tsc_hz"), std::string::npos);
  c = test::test_config();
  c.min_rto_us = 10'000;  // above initial_rto_us
  EXPECT_NE(message_of(c).find("min_rto_us"), std::string::npos);
  c = test::test_config();
  c.cwnd_floor = 17;
  EXPECT_NE(message_of(c).find("cwnd_floor"), std::string::npos);
  c = test::test_config();
  c.reorder_threshold = 20;
  EXPECT_NE(message_of(c).find("reorder_threshold"), std::string::npos);
  c = test::test_config();
  c.ack_every = 0;
  EXPECT_NE(message_of(c).find("ack_every"), std::string::npos);
  c = test::test_config();
  c.window_packets = 0;
  c.base_rtt_us = 0;
  EXPECT_NE(message_of(c).find("window_packets"), std::string::npos);
  EXPECT_EQ(message_of(test::test_config()), "");
}

}  // namespace
}  // namespace mercury::transport
