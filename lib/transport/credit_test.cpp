// Flow control by credit: the receiver's credit bounds what its peer sends,
// a credit that grows again is a window update, and a sender the credit
// stopped with nothing in flight probes for it every RTO. Every header goes
// through wire::encode/decode, so the credit is what the wire carries.
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

struct Side {
  Side(uint32_t epoch, Tick now) : peer(test::test_config(16), epoch, now) {}
  Peer peer;
  RecordingSink sink;
};

wire::HeaderFields pure_ack(Side& from, Tick now) {
  wire::HeaderFields h;
  from.peer.fill_pure_ack(now, h);
  return over_the_wire(h);
}

// `from` sends one single-packet message (slice i); `to` receives it.
void send_one(Side& from, Side& to, uint32_t i, Tick now) {
  wire::HeaderFields h;
  h.type = wire::PacketType::kData;
  h.msg_id = i + 1;
  h.msg_len = 64;
  h.payload_len = 64;
  ASSERT_TRUE(from.peer.send(slice_of(i), now, h));
  EXPECT_EQ(to.peer.on_packet(over_the_wire(h), now, to.sink).verdict, RxVerdict::kNew);
}

// a and b know each other's epochs.
void handshake(Side& a, Side& b, Tick now) {
  for (int i = 0; i < 4 && (a.peer.ack_due(now) || b.peer.ack_due(now)); ++i) {
    if (a.peer.ack_due(now)) b.peer.on_packet(pure_ack(a, now), now, b.sink);
    if (b.peer.ack_due(now)) a.peer.on_packet(pure_ack(b, now), now, a.sink);
  }
}

// Sends from a to b while a may (at most `most`); returns how many went.
uint32_t send_while_allowed(Side& a, Side& b, uint32_t first, uint32_t most, Tick now) {
  uint32_t n = 0;
  while (n < most && a.peer.can_send()) send_one(a, b, first + n++, now);
  return n;
}

TEST(Credit, TheReceiversCreditBoundsWhatItsPeerSends) {
  Side a(1, 0), b(2, 0);
  handshake(a, b, 0);
  b.peer.set_credit(3);
  send_one(a, b, 0, 10 * kUs);
  const wire::HeaderFields ack = pure_ack(b, 20 * kUs);
  EXPECT_NE(ack.flags & wf::kAckValid, 0);
  EXPECT_EQ(ack.credit, 3);
  a.peer.on_packet(ack, 20 * kUs, a.sink);
  // The window (16) and cwnd would allow 15 more; the credit allows 3 from the ack.
  EXPECT_EQ(send_while_allowed(a, b, 1, 100, 30 * kUs), 3u);
  EXPECT_TRUE(a.peer.sender().credit_exhausted());
  EXPECT_EQ(a.peer.sender().counters().credit, 3u);
  // Acknowledging them (credit still 3) opens room for 3 more.
  a.peer.on_packet(pure_ack(b, 40 * kUs), 40 * kUs, a.sink);
  EXPECT_EQ(send_while_allowed(a, b, 4, 100, 50 * kUs), 3u);
}

TEST(Credit, CreditNeverExceedsTheReceiveWindow) {
  Side a(1, 0), b(2, 0);
  handshake(a, b, 0);
  b.peer.set_credit(1'000'000);
  send_one(a, b, 0, 10 * kUs);
  EXPECT_EQ(pure_ack(b, 20 * kUs).credit, 16);  // rx_window = window = 16
}

TEST(Credit, ACreditThatGrowsAgainIsAWindowUpdate) {
  Side a(1, 0), b(2, 0);
  handshake(a, b, 0);
  b.peer.set_credit(0);
  send_one(a, b, 0, 10 * kUs);
  a.peer.on_packet(pure_ack(b, 20 * kUs), 20 * kUs, a.sink);
  EXPECT_FALSE(a.peer.can_send());
  EXPECT_TRUE(a.peer.sender().credit_exhausted());
  EXPECT_FALSE(b.peer.ack_due(30 * kUs));  // nothing new to acknowledge
  // Room again (a quarter of the window or more, from below half of it):
  // b tells a without waiting for data.
  b.peer.set_credit(8);
  ASSERT_TRUE(b.peer.ack_due(30 * kUs));
  EXPECT_EQ(b.peer.counters().rx.window_updates, 1u);
  a.peer.on_packet(pure_ack(b, 30 * kUs), 30 * kUs, a.sink);
  EXPECT_EQ(send_while_allowed(a, b, 1, 100, 40 * kUs), 8u);
  // A small step up is not worth an ACK of its own.
  Side c(3, 0), d(4, 0);
  handshake(c, d, 0);
  d.peer.set_credit(0);
  send_one(c, d, 0, 10 * kUs);
  c.peer.on_packet(pure_ack(d, 20 * kUs), 20 * kUs, c.sink);
  d.peer.set_credit(2);
  EXPECT_FALSE(d.peer.ack_due(30 * kUs));
}

TEST(Credit, AStoppedSenderProbesForTheCreditEveryRto) {
  Side a(1, 0), b(2, 0);
  handshake(a, b, 0);
  b.peer.set_credit(0);
  send_one(a, b, 0, 10 * kUs);
  a.peer.on_packet(pure_ack(b, 20 * kUs), 20 * kUs, a.sink);
  ASSERT_EQ(a.peer.sender().outstanding(), 0u);
  ASSERT_TRUE(a.peer.sender().credit_exhausted());
  // b's window update is lost.
  b.peer.set_credit(16);
  ASSERT_TRUE(b.peer.ack_due(30 * kUs));
  pure_ack(b, 30 * kUs);
  // a probes once an RTO after it stopped, asking for an answer...
  const Tick rto = a.peer.sender().rto();
  EXPECT_FALSE(a.peer.ack_due(20 * kUs + rto - 1));
  EXPECT_NE(a.peer.next_deadline(), 0u);
  ASSERT_TRUE(a.peer.ack_due(20 * kUs + rto));
  const wire::HeaderFields probe = pure_ack(a, 20 * kUs + rto);
  EXPECT_EQ(probe.flags & wf::kAckRequest, wf::kAckRequest);
  EXPECT_EQ(a.peer.counters().persist_probes, 1u);
  EXPECT_FALSE(a.peer.ack_due(20 * kUs + rto + 1));  // the next one an RTO later
  // ...and b's answer carries the credit.
  b.peer.on_packet(probe, 20 * kUs + rto, b.sink);
  ASSERT_TRUE(b.peer.ack_due(20 * kUs + rto));
  a.peer.on_packet(pure_ack(b, 20 * kUs + rto), 20 * kUs + rto, a.sink);
  EXPECT_TRUE(a.peer.can_send());
  EXPECT_FALSE(a.peer.ack_due(20 * kUs + 3 * rto));  // no longer persisting
}

TEST(Credit, AReorderedOlderAcksCreditIsIgnored) {
  PeerSender s(test::test_params(16), 1000, 0);
  RecordingSink sink;
  for (uint32_t i = 0; i < 4; ++i) s.on_send(slice_of(i), 0);
  s.on_ack(1004, 0, 10 * kMs, sink, 2);   // room to 1006
  s.on_ack(1002, 0, 10 * kMs, sink, 16);  // older: its credit says nothing now
  EXPECT_TRUE(s.can_send());
  s.on_send(slice_of(4), 11 * kMs);
  EXPECT_TRUE(s.can_send());
  s.on_send(slice_of(5), 11 * kMs);
  EXPECT_FALSE(s.can_send());
  EXPECT_TRUE(s.credit_exhausted());
  // An ACK without credit information leaves the window in charge.
  s.on_ack(1006, 0, 12 * kMs, sink);
  EXPECT_FALSE(s.credit_exhausted());
  EXPECT_EQ(s.counters().credit, 16u);
}

}  // namespace
}  // namespace mercury::transport
