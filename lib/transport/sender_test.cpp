// PeerSender driven with synthetic ACKs and a fake clock: numbering, ACKs,
// the SACK loss rule (and a brute-force oracle of it), configuration. The
// timers, congestion, the left edge and liveness: sender_timer_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "transport/sender_test_util.h"
#include "transport/test_util.h"
#include "transport/transport.h"

namespace mercury::transport {
namespace {

using test::kMs;
using test::kUs;
using test::RecordingSink;
using test::resend_params;
using test::sack_range;
using test::slice_of;
namespace wf = wire::flags;
using test::all_distinct;
using test::kIsn;
using test::send_n;

TEST(SeqArithmetic, ComparesAcrossTheWrap) {
  EXPECT_TRUE(seq_before(0xfffffff0u, 0x00000010u));
  EXPECT_FALSE(seq_before(0x00000010u, 0xfffffff0u));
  EXPECT_EQ(seq_diff(0x00000005u, 0xfffffffbu), 10);
  EXPECT_EQ(seq_diff(0xfffffffbu, 0x00000005u), -10);
  EXPECT_TRUE(epoch_newer(1, 0xffffffffu));
  EXPECT_FALSE(epoch_newer(0xffffffffu, 1));
  EXPECT_FALSE(epoch_newer(7, 7));
}

// Epochs are milliseconds of the wall clock mod 2^32 (job::fresh_epoch).
TEST(Epochs, CompareAsThirtyTwoBitSerialNumbers) {
  // A restart 10 ms across the wrap, either way round.
  EXPECT_TRUE(epoch_newer(0x00000005u, 0xfffffffbu));
  EXPECT_FALSE(epoch_newer(0xfffffffbu, 0x00000005u));
  // One millisecond later across a 16-bit boundary: all 32 bits count.
  EXPECT_TRUE(epoch_newer(0x12340000u, 0x1233ffffu));
  EXPECT_FALSE(epoch_newer(0x1233ffffu, 0x12340000u));
  // A later epoch is newer up to 2^31 - 1 ms (24.8 days) on; at 2^31 neither is.
  for (const uint32_t e : {0u, 0x7fffffffu, 0xfff00000u}) {
    EXPECT_TRUE(epoch_newer(e + 1, e)) << e;
    EXPECT_TRUE(epoch_newer(e + 0x7fffffffu, e)) << e;
    EXPECT_FALSE(epoch_newer(e, e + 0x7fffffffu)) << e;
    EXPECT_FALSE(epoch_newer(e + 0x80000000u, e)) << e;
    EXPECT_FALSE(epoch_newer(e, e + 0x80000000u)) << e;
  }
}

// With one end's epoch fixed, the stream origin is a bijection of the other's
// (distinct over 2^16 consecutive milliseconds, across the wrap), and
// neighbouring milliseconds land far apart: an incarnation one millisecond
// later does not start inside its predecessor's window. The salt shifts it.
TEST(Epochs, InitialSeqTellsEveryIncarnationOfOneEndApart) {
  constexpr auto kMidnight = static_cast<uint32_t>(1'796'342'400'000ull);  // 2026-12-04, ms
  for (const uint32_t other : {1u, 5u, 0x5a17u, kMidnight}) {
    std::vector<uint32_t> as_sender, as_receiver;
    for (uint32_t i = 0; i < (1u << 16); ++i) {
      const uint32_t e = 0xffff8000u + i;
      as_sender.push_back(initial_seq(e, other, 0));
      as_receiver.push_back(initial_seq(other, e, 0));
    }
    for (std::vector<uint32_t> v : {as_sender, as_receiver}) {
      uint32_t close = 0;  // neighbours within the largest window of each other
      for (size_t i = 1; i < v.size(); ++i) {
        const int64_t d = seq_diff(v[i], v[i - 1]);
        close += (d < 0 ? -d : d) < kMaxWindow;
      }
      // About 2 expected of 2^16 uniformly spread pairs (2^17 / 2^32 each).
      EXPECT_LE(close, 16u) << other;
      std::sort(v.begin(), v.end());
      EXPECT_EQ(std::adjacent_find(v.begin(), v.end()), v.end()) << other;
    }
  }
  EXPECT_EQ(initial_seq(kMidnight, 5, 0x1000), initial_seq(kMidnight, 5, 0) + 0x1000);
}

TEST(Keepalive, AnEighthOfThePeerTimeout) {
  Config c = test::test_config();
  c.peer_timeout_us = 1'500'000;
  EXPECT_EQ(keepalive_interval(c), Tick{187'500} * (c.tsc_hz / 1'000'000));
}

TEST(ChallengeTimeout, AQuarterOfThePeerTimeoutOrBelowIt) {
  Config c = test::test_config();
  c.peer_timeout_us = 1'500'000;
  const Tick us = c.tsc_hz / 1'000'000;
  EXPECT_EQ(resolve(c).challenge_timeout, Tick{375'000} * us);
  c.challenge_timeout_us = 100'000;
  EXPECT_EQ(resolve(c).challenge_timeout, Tick{100'000} * us);
  c.challenge_timeout_us = 1'500'000;
  try {
    resolve(c);
    ADD_FAILURE() << "a challenge timeout of the peer timeout was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("challenge_timeout_us"), std::string::npos) << e.what();
  }
}

TEST(PeerSender, NumbersPacketsAndStopsAtTheWindow) {
  RecordingSink sink;
  PeerSender s(resend_params(16), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
  send_n(s, 10, 0);
  s.on_ack(kIsn + 3, sack_range(kIsn + 3, kIsn + 4, kIsn + 6), 20 * kUs, sink);
  EXPECT_EQ(sink.lost_seqs(), std::vector<uint32_t>{kIsn + 3});
}

TEST(PeerSender, LateOriginalCancelsTheResendAndRaisesTheThreshold) {
  RecordingSink sink;
  PeerSender s(resend_params(), kIsn, 0);
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
  PeerSender s(resend_params(), kIsn, 0);
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
