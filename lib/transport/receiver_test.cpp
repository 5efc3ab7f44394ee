// PeerReceiver driven with synthetic headers: old, in-order, future and
// duplicate packets, epochs, message completion, the ACK policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "transport/test_util.h"
#include "transport/transport.h"

namespace mercury::transport {
namespace {

using test::kUs;
using test::test_params;
namespace wf = wire::flags;

constexpr uint16_t kLocal = 7;
constexpr uint32_t kPeerEpoch = 3;

// A one-packet message at `seq` (the common case for protocol tests).
wire::HeaderFields packet(uint32_t seq, uint32_t epoch = kPeerEpoch, uint16_t flags = 0) {
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.seq = seq;
  h.epoch = epoch;
  h.flags = flags;
  h.msg_id = seq;  // distinct per packet
  h.msg_len = 100;
  h.offset = 0;
  h.payload_len = 100;
  return h;
}

// Slice `part` of `parts` of message msg_id (parts of 100 bytes).
wire::HeaderFields part_of(uint32_t seq, uint32_t msg_id, uint32_t part, uint32_t parts,
                           uint16_t flags = 0) {
  wire::HeaderFields h = packet(seq, kPeerEpoch, flags);
  h.msg_id = msg_id;
  h.msg_len = 100 * parts;
  h.offset = 100 * part;
  return h;
}

class ReceiverTest : public ::testing::Test {
 protected:
  explicit ReceiverTest(uint32_t window = 16, uint32_t salt = 0) {
    Config c = test::test_config(window);
    c.seq_salt = salt;
    params_ = resolve(c);
    base_ = initial_seq(kPeerEpoch, kLocal, salt);
  }
  Params params_;
  uint32_t base_;
};

TEST_F(ReceiverTest, InOrderPacketsAdvanceTheCumulativeAck) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  for (uint32_t i = 0; i < 5; ++i) {
    const RxResult res = r.on_data(packet(base_ + i), 0);
    EXPECT_EQ(res.verdict, RxVerdict::kNew);
    EXPECT_TRUE(res.message_complete);
  }
  EXPECT_EQ(r.cumulative_ack(), base_ + 5);
  EXPECT_EQ(r.sack_bits(), 0u);
  wire::HeaderFields ack;
  ASSERT_TRUE(r.fill_ack(ack));
  EXPECT_NE(ack.flags & wf::kAckValid, 0);
  EXPECT_EQ(ack.ack, base_ + 5);
  EXPECT_EQ(r.counters().packets_accepted, 5u);
}

TEST_F(ReceiverTest, OldAndRepeatedPacketsAreDuplicates) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  for (uint32_t i = 0; i < 5; ++i) r.on_data(packet(base_ + i), 0);
  EXPECT_EQ(r.on_data(packet(base_ + 2), 0).verdict, RxVerdict::kDuplicate);  // below cum
  EXPECT_EQ(r.on_data(packet(base_ + 7), 0).verdict, RxVerdict::kNew);        // future
  EXPECT_EQ(r.on_data(packet(base_ + 7), 0).verdict, RxVerdict::kDuplicate);  // SACKed
  EXPECT_EQ(r.counters().duplicates, 2u);
  EXPECT_EQ(r.counters().packets_accepted, 6u);
  // Ancient packets (far below, past the history) are duplicates too.
  EXPECT_EQ(r.on_data(packet(base_ - 1000), 0).verdict, RxVerdict::kDuplicate);
}

TEST_F(ReceiverTest, FuturePacketsAreSackedUntilTheHoleFills) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  // base_ is lost; base_+1..+3 and +5 arrive.
  for (uint32_t i : {1u, 2u, 3u, 5u})
    EXPECT_EQ(r.on_data(packet(base_ + i), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.cumulative_ack(), base_);
  EXPECT_EQ(r.sack_bits(), 0b10111u);  // bit i = base_+1+i
  EXPECT_EQ(r.on_data(packet(base_), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.cumulative_ack(), base_ + 4);
  EXPECT_EQ(r.sack_bits(), 0b1u);  // base_+5
}

TEST_F(ReceiverTest, PacketsBeyondTheWindowAreDroppedAndCounted) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  r.on_data(packet(base_), 0);
  EXPECT_EQ(r.on_data(packet(base_ + 1 + 16), 0).verdict, RxVerdict::kOutOfWindow);
  EXPECT_EQ(r.on_data(packet(base_ + 1 + 15), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.counters().out_of_window, 1u);
  // SACK never reports a seq outside the window.
  EXPECT_EQ(r.sack_bits(), uint64_t{1} << 14);
}

TEST(ReceiverWindow, SackIsMaskedToASmallWindowAcrossRingReuse) {
  Config c = test::test_config(4);
  const Params p = resolve(c);
  const uint32_t base = initial_seq(kPeerEpoch, kLocal, 0);
  PeerReceiver r(p, kLocal, kPeerEpoch);
  // Run far enough that the ring (128 bits) wraps many times; stale history
  // bits must never show up in the SACK.
  for (uint32_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(r.on_data(packet(base + i), 0).verdict, RxVerdict::kNew);
    ASSERT_EQ(r.sack_bits(), 0u) << i;
  }
  EXPECT_EQ(r.on_data(packet(base + 1002), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.sack_bits(), 0b10u);
  EXPECT_EQ(r.on_data(packet(base + 1004), 0).verdict, RxVerdict::kOutOfWindow);
}

TEST_F(ReceiverTest, AcksEveryKPacketsOrAfterTheDelay) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  wire::HeaderFields ack;
  for (uint32_t i = 0; i < 3; ++i) r.on_data(packet(base_ + i), 0);
  EXPECT_FALSE(r.ack_due(0));
  r.on_data(packet(base_ + 3), 0);
  EXPECT_TRUE(r.ack_due(0));  // ack_every = 4
  r.fill_ack(ack);
  EXPECT_FALSE(r.ack_due(0));
  // One packet: due only once the ack delay (20 us) has passed.
  r.on_data(packet(base_ + 4), 100 * kUs);
  EXPECT_FALSE(r.ack_due(119 * kUs));
  EXPECT_TRUE(r.ack_due(120 * kUs));
  r.fill_ack(ack);
}

TEST_F(ReceiverTest, AcksAtOnceOnRequestGapOrDuplicate) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  wire::HeaderFields ack;
  r.on_data(packet(base_, kPeerEpoch, wf::kAckRequest), 0);
  EXPECT_TRUE(r.ack_due(0));
  r.fill_ack(ack);
  r.on_data(packet(base_ + 2), 0);  // gap at base_+1
  EXPECT_TRUE(r.ack_due(0));
  r.fill_ack(ack);
  r.on_data(packet(base_ + 1), 0);  // fills the hole
  EXPECT_TRUE(r.ack_due(0));
  r.fill_ack(ack);
  EXPECT_EQ(ack.ack, base_ + 3);
  r.on_data(packet(base_ + 1), 0);  // duplicate: our ACK may have been lost
  EXPECT_TRUE(r.ack_due(0));
  r.fill_ack(ack);
  EXPECT_EQ(r.counters().acks_sent, 4u);
}

TEST_F(ReceiverTest, MessageCompletesExactlyOnceWhateverTheOrder) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  // Message 42 in 4 packets at base_..base_+3, arriving 3, 1, 0, 1 (dup), 2.
  int completions = 0;
  for (uint32_t part : {3u, 1u, 0u, 1u, 2u}) {
    const RxResult res = r.on_data(part_of(base_ + part, 42, part, 4), 0);
    if (res.message_complete) {
      ++completions;
      EXPECT_EQ(part, 2u);
      EXPECT_EQ(res.verdict, RxVerdict::kNew);
    }
  }
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(r.messages_in_progress(), 0u);
  EXPECT_EQ(r.counters().messages_completed, 1u);
  EXPECT_EQ(r.counters().bytes_accepted, 400u);
  // A late duplicate of a completed message completes nothing.
  EXPECT_FALSE(r.on_data(part_of(base_ + 2, 42, 2, 4), 0).message_complete);
}

TEST_F(ReceiverTest, EmptyAndSinglePacketMessagesCompleteAtOnce) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  wire::HeaderFields h = packet(base_);
  h.msg_len = 0;
  h.payload_len = 0;
  EXPECT_TRUE(r.on_data(h, 0).message_complete);
  EXPECT_TRUE(r.on_data(packet(base_ + 1), 0).message_complete);
  EXPECT_EQ(r.messages_in_progress(), 0u);
}

TEST(ReceiverMessages, AFullTableRefusesWithoutAckingUntilRoomFrees) {
  Config c = test::test_config(16);
  c.rx_messages = 2;
  const Params p = resolve(c);
  const uint32_t b = initial_seq(kPeerEpoch, kLocal, 0);
  PeerReceiver r(p, kLocal, kPeerEpoch);
  // Messages 1 and 2 (2 packets each) are half received; message 3 has no room.
  EXPECT_EQ(r.on_data(part_of(b + 0, 1, 0, 2), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.on_data(part_of(b + 1, 2, 0, 2), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.on_data(part_of(b + 2, 3, 0, 2), 0).verdict, RxVerdict::kMessageTableFull);
  EXPECT_EQ(r.cumulative_ack(), b + 2);  // not acknowledged: the sender will resend it
  EXPECT_EQ(r.sack_bits(), 0u);
  EXPECT_EQ(r.counters().message_table_full, 1u);
  EXPECT_TRUE(r.on_data(part_of(b + 3, 1, 1, 2), 0).message_complete);
  EXPECT_EQ(r.on_data(part_of(b + 2, 3, 0, 2), 0).verdict, RxVerdict::kNew);
  EXPECT_TRUE(r.on_data(part_of(b + 4, 2, 1, 2), 0).message_complete);
  EXPECT_TRUE(r.on_data(part_of(b + 5, 3, 1, 2), 0).message_complete);
  EXPECT_EQ(r.cumulative_ack(), b + 6);
  EXPECT_EQ(r.messages_in_progress(), 0u);
}

// Slices (kSlice) of one logical message, each under its own msg_id as the
// endpoint's send_slice gives them, some covering all of msg_len: no message
// accounting at all, so they never complete a message, never take a table
// slot (even with a table of one), and contradicting msg_len values are not
// "bad": only seq, duplicates and the window apply.
TEST(ReceiverMessages, SlicesGetNoMessageAccountingOnlyReliability) {
  Config c = test::test_config(16);
  c.rx_messages = 1;
  const Params p = resolve(c);
  const uint32_t b = initial_seq(kPeerEpoch, kLocal, 0);
  PeerReceiver r(p, kLocal, kPeerEpoch);
  for (uint32_t i = 0; i < 8; ++i) {
    // Out of order within the window: 1, 0, 3, 2, ...
    const uint32_t seq = b + (i ^ 1);
    wire::HeaderFields h = part_of(seq, 100 + i, i % 4, 4, wf::kSlice);
    if (i == 5) h.msg_len = h.payload_len;  // a slice that is the whole logical message
    const RxResult res = r.on_data(h, 0);
    EXPECT_EQ(res.verdict, RxVerdict::kNew) << i;
    EXPECT_FALSE(res.message_complete) << i;
    EXPECT_EQ(r.messages_in_progress(), 0u);
    // A duplicate of it is suppressed like any packet.
    EXPECT_EQ(r.on_data(h, 0).verdict, RxVerdict::kDuplicate) << i;
  }
  EXPECT_EQ(r.cumulative_ack(), b + 8);
  EXPECT_EQ(r.counters().slice_packets, 8u);
  EXPECT_EQ(r.counters().duplicates, 8u);
  EXPECT_EQ(r.counters().messages_completed, 0u);
  EXPECT_EQ(r.counters().message_table_full + r.counters().bad_message, 0u);
  // A plain message still gets its accounting beside them.
  EXPECT_EQ(r.on_data(part_of(b + 8, 7, 0, 2), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.messages_in_progress(), 1u);
  EXPECT_TRUE(r.on_data(part_of(b + 9, 7, 1, 2), 0).message_complete);
}

TEST_F(ReceiverTest, AContradictoryMessageIsRejected) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  EXPECT_EQ(r.on_data(part_of(base_, 9, 0, 4), 0).verdict, RxVerdict::kNew);
  wire::HeaderFields h = part_of(base_ + 1, 9, 1, 4);
  h.msg_len = 800;  // message 9 was 400 bytes
  EXPECT_EQ(r.on_data(h, 0).verdict, RxVerdict::kBadMessage);
  EXPECT_EQ(r.counters().bad_message, 1u);
  EXPECT_EQ(r.cumulative_ack(), base_ + 1);
}

TEST_F(ReceiverTest, CountsSpuriousRetransmissions) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  r.on_data(packet(base_), 0);
  // The original arrived; a retransmission of it is spurious.
  r.on_data(packet(base_, kPeerEpoch, wf::kRetransmit), 0);
  EXPECT_EQ(r.counters().spurious_retransmits, 1u);
  // A plain link duplicate of the original is not.
  r.on_data(packet(base_), 0);
  EXPECT_EQ(r.counters().spurious_retransmits, 1u);
  // A retransmission accepted first, then the late original: also spurious.
  r.on_data(packet(base_ + 3, kPeerEpoch, wf::kRetransmit), 0);
  r.on_data(packet(base_ + 3), 0);
  EXPECT_EQ(r.counters().spurious_retransmits, 2u);
  EXPECT_EQ(r.counters().duplicates, 3u);
}

TEST_F(ReceiverTest, AResendBehindItsOriginalIsReportedInTheNextAck) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  wire::HeaderFields ack;
  r.on_data(packet(base_), 0);
  ASSERT_TRUE(r.fill_ack(ack));
  EXPECT_EQ(ack.flags & wf::kDuplicate, 0);
  // The resend comes behind the original: the sender resent too early.
  r.on_data(packet(base_, kPeerEpoch, wf::kRetransmit), 0);
  ack = {};
  ASSERT_TRUE(r.fill_ack(ack));
  EXPECT_NE(ack.flags & wf::kDuplicate, 0);
  ack = {};
  ASSERT_TRUE(r.fill_ack(ack));  // once
  EXPECT_EQ(ack.flags & wf::kDuplicate, 0);
  // An original that reordering held behind its resend, and a plain link
  // duplicate, say nothing of the sender's timing.
  r.on_data(packet(base_ + 1, kPeerEpoch, wf::kRetransmit), 0);
  r.on_data(packet(base_ + 1), 0);
  r.on_data(packet(base_ + 1), 0);
  ack = {};
  ASSERT_TRUE(r.fill_ack(ack));
  EXPECT_EQ(ack.flags & wf::kDuplicate, 0);
  // (Counted: each copy unlike the first one accepted.)
  EXPECT_EQ(r.counters().spurious_retransmits, 3u);
}

TEST_F(ReceiverTest, StaleEpochIsRejectedAndANewerOneResets) {
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  EXPECT_EQ(r.on_data(part_of(base_, 5, 0, 3), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.messages_in_progress(), 1u);
  // A leftover of an older incarnation.
  EXPECT_EQ(r.on_data(packet(base_ + 1, kPeerEpoch - 1), 0).verdict, RxVerdict::kStaleEpoch);
  EXPECT_EQ(r.counters().stale_epoch, 1u);
  EXPECT_EQ(r.on_data(packet(base_ + 1, 0), 0).verdict, RxVerdict::kStaleEpoch);  // never valid
  // The peer restarted: a new stream, keyed to (its new epoch, ours).
  const uint32_t next = kPeerEpoch + 1;
  const uint32_t nb = initial_seq(next, kLocal, 0);
  const RxResult res = r.on_data(packet(nb, next), 0);
  EXPECT_TRUE(res.peer_restarted);
  EXPECT_EQ(res.verdict, RxVerdict::kNew);
  EXPECT_EQ(r.counters().messages_abandoned, 1u);
  EXPECT_EQ(r.counters().peer_restarts, 1u);
  EXPECT_EQ(r.messages_in_progress(), 0u);
  EXPECT_EQ(r.cumulative_ack(), nb + 1);
  // Now the old epoch is stale.
  EXPECT_EQ(r.on_data(packet(base_ + 1, kPeerEpoch), 0).verdict, RxVerdict::kStaleEpoch);
}

TEST_F(ReceiverTest, OnlyTheFirstWindowOfAStreamCanSync) {
  PeerReceiver r(params_, kLocal);  // peer unknown yet
  EXPECT_FALSE(r.synced());
  wire::HeaderFields ack;
  EXPECT_FALSE(r.fill_ack(ack));
  // Mid-stream: cannot tell where this stream started.
  EXPECT_EQ(r.on_data(packet(base_ + 40), 0).verdict, RxVerdict::kUnsynced);
  EXPECT_EQ(r.peer_epoch(), kPeerEpoch);  // adopted
  EXPECT_FALSE(r.ack_due(0));
  // A packet of the first window (the first one lost) syncs at the origin.
  EXPECT_EQ(r.on_data(packet(base_ + 2), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.cumulative_ack(), base_);
  EXPECT_EQ(r.counters().unsynced, 1u);
}

class ReceiverWrapTest : public ReceiverTest {
 protected:
  // A salt that puts the stream origin 5 below 2^32.
  ReceiverWrapTest() : ReceiverTest(16, 0xfffffffbu - initial_seq(kPeerEpoch, kLocal, 0)) {}
};

TEST_F(ReceiverWrapTest, SequenceNumbersWrapAround) {
  ASSERT_EQ(base_, 0xfffffffbu);
  PeerReceiver r(params_, kLocal, kPeerEpoch);
  // 0xfffffffb..0xffffffff, then 0, 2, 3 (1 missing).
  for (uint32_t s : {0xfffffffbu, 0xfffffffcu, 0xfffffffdu, 0xfffffffeu, 0xffffffffu, 0u, 2u, 3u}) {
    EXPECT_EQ(r.on_data(packet(s), 0).verdict, RxVerdict::kNew) << s;
  }
  EXPECT_EQ(r.cumulative_ack(), 1u);
  EXPECT_EQ(r.sack_bits(), 0b11u);
  EXPECT_EQ(r.on_data(packet(0xfffffffeu), 0).verdict, RxVerdict::kDuplicate);
  EXPECT_EQ(r.on_data(packet(1u), 0).verdict, RxVerdict::kNew);
  EXPECT_EQ(r.cumulative_ack(), 4u);
}

// Randomised: a stream delivered in a shuffled order within the window, with
// duplicates, against a set oracle. Every seq is accepted exactly once and the
// cumulative ack ends at the end of the stream; the ring is reused many times.
TEST(ReceiverRandom, AcceptsEverySeqOnceUnderReorderingAndDuplication) {
  Config c = test::test_config(64);
  const Params p = resolve(c);
  const uint32_t base = initial_seq(kPeerEpoch, kLocal, 0);
  PeerReceiver r(p, kLocal, kPeerEpoch);
  std::mt19937 rng(7);
  constexpr uint32_t kPackets = 20'000;
  std::set<uint32_t> accepted;
  uint32_t next = 0;
  std::vector<uint32_t> pending;  // sent, not yet delivered (within the window)
  while (accepted.size() < kPackets) {
    const uint32_t acked = r.synced() ? r.cumulative_ack() - base : 0;
    while (next < kPackets && next - acked < 64) pending.push_back(next++);
    std::uniform_int_distribution<size_t> pick(0, pending.size() - 1);
    const size_t i = pick(rng);
    const uint32_t s = pending[i];
    const RxResult res = r.on_data(packet(base + s), 0);
    if (res.verdict == RxVerdict::kNew) {
      ASSERT_TRUE(accepted.insert(s).second) << "accepted twice: " << s;
    } else {
      ASSERT_EQ(res.verdict, RxVerdict::kDuplicate);
      ASSERT_TRUE(accepted.count(s));
    }
    if (rng() % 8 != 0)
      pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));  // else dup later
    if (pending.empty() && next == kPackets) break;
  }
  EXPECT_EQ(accepted.size(), kPackets);
  EXPECT_EQ(r.cumulative_ack(), base + kPackets);
  EXPECT_EQ(r.counters().packets_accepted, kPackets);
}

// Randomised: many multi-packet messages interleaved (so the message table
// churns through inserts and backward-shift deletions); each completes once.
TEST(ReceiverRandom, InterleavedMessagesEachCompleteOnce) {
  Config c = test::test_config(64);
  c.rx_messages = 48;
  const Params p = resolve(c);
  const uint32_t base = initial_seq(kPeerEpoch, kLocal, 0);
  PeerReceiver r(p, kLocal, kPeerEpoch);
  std::mt19937 rng(11);
  // Build a stream: up to 24 messages open at once, each 1..6 packets.
  struct Pkt {
    uint32_t msg, part, parts;
  };
  std::vector<Pkt> stream;
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> open;  // msg -> (sent, parts)
  uint32_t next_msg = 0;
  while (stream.size() < 30'000) {
    if (open.size() < 24) {
      const uint32_t parts = 1 + rng() % 6;
      open[next_msg++] = {0, parts};
    }
    auto it = open.begin();
    std::advance(it, rng() % open.size());
    stream.push_back({it->first, it->second.first, it->second.second});
    if (++it->second.first == it->second.second) open.erase(it);
  }
  std::map<uint32_t, int> completions;
  uint32_t delivered = 0;
  for (size_t s = 0; s < stream.size(); s += 8) {
    // Deliver each block of 8 in reverse: reordering within the window.
    const size_t end = std::min(stream.size(), s + 8);
    for (size_t k = end; k-- > s;) {
      const Pkt& pk = stream[k];
      const RxResult res =
          r.on_data(part_of(base + static_cast<uint32_t>(k), pk.msg, pk.part, pk.parts), 0);
      ASSERT_EQ(res.verdict, RxVerdict::kNew);
      ++delivered;
      if (res.message_complete) ++completions[pk.msg];
    }
  }
  EXPECT_EQ(delivered, stream.size());
  for (const auto& [msg, n] : completions) ASSERT_EQ(n, 1) << msg;
  // Messages still open at the end of the stream did not complete; all others did.
  EXPECT_EQ(completions.size() + open.size(), next_msg);
  const auto started =
      std::count_if(open.begin(), open.end(), [](const auto& kv) { return kv.second.first > 0; });
  EXPECT_EQ(r.messages_in_progress(), static_cast<uint32_t>(started));
}

}  // namespace
}  // namespace mercury::transport
