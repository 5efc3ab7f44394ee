// The endpoint without EAL: two Endpoints on a net::MemoryPort link under a
// fake clock. Delivery both ways with every completion exactly once; loss,
// reordering and duplication recovered; scripted losses retransmitted by the
// right rule (fast retransmit, the timer, the left edge, the scheduler's
// requeue); a dead or unreachable peer reported with its error text; a peer
// restarted a millisecond later (a new epoch) seen as a restart.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "transport/endpoint_test_util.h"

namespace mercury::transport {
namespace {

using test::Inbox;
using test::kAddrA;
using test::kAddrB;
using test::kPayload;
using test::Link;
using test::Log;
using test::pattern;
using test::peer_at;

std::vector<std::vector<std::byte>> bodies(const std::vector<uint32_t>& sizes, uint32_t salt = 0) {
  std::vector<std::vector<std::byte>> v;
  for (uint32_t i = 0; i < sizes.size(); ++i) v.push_back(pattern(i + salt, sizes[i]));
  return v;
}

// One byte up to 2 MiB: one packet, exactly one, one more, many, and a
// message placed with non-temporal stores (net::streams_into).
const std::vector<uint32_t> kSizes = {
    0, 1, 100, kPayload, kPayload + 1, 5 * kPayload, 64 * 1024, (1 << 20) + 13, 2 << 20};

TEST(EndpointUnit, DeliversMessagesBothWaysWithEachCompletionOnce) {
  Link l;
  Inbox in_a, in_b;
  // Epochs unknown: the probe exchange runs first.
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA)), in_b, l.now);
  const auto to_b = bodies(kSizes), to_a = bodies({7, 3000, 100'000}, 100);
  Log log_a, log_b;
  test::send_all(a, to_b, log_a);
  test::send_all(b, to_a, log_b);
  ASSERT_TRUE(l.run(
      {&a, &b}, [&] { return log_a.ok.size() == to_b.size() && log_b.ok.size() == to_a.size(); }));
  l.idle({&a, &b}, 10 * test::kMs);  // a late duplicate completion would show now
  EXPECT_TRUE(log_a.all_ok(to_b.size()));
  EXPECT_TRUE(log_b.all_ok(to_a.size()));
  for (uint32_t i = 0; i < to_b.size(); ++i) EXPECT_TRUE(in_b.has(i, to_b[i])) << "message " << i;
  for (uint32_t i = 0; i < to_a.size(); ++i) EXPECT_TRUE(in_a.has(i, to_a[i])) << "message " << i;
  EXPECT_EQ(a.counters_st().messages_completed, to_b.size());
  EXPECT_EQ(b.counters_st().messages_received, to_b.size());
  EXPECT_EQ(b.peer_stats_st(0).messages_received, to_b.size());
  EXPECT_GT(a.peer_stats_st(0).transport.probes_sent, 0u);
  EXPECT_EQ(a.counters_st().tx_retransmits + b.counters_st().tx_retransmits, 0u);
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(b.idle_st());
  EXPECT_EQ(l.a.buffers_free(), l.a.buffers());  // every frame came back to its port
  EXPECT_EQ(l.b.buffers_free(), l.b.buffers());
}

TEST(EndpointUnit, RecoversFromLossReorderingAndDuplication) {
  Link l;
  l.impair(0.05, 0.05, 0.05, 11);
  Inbox in_a, in_b;
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA)), in_b, l.now);
  const auto to_b = bodies({3 << 20, 1 << 20, 70'000, 5, kPayload, 200'000});
  const auto to_a = bodies({1 << 20, 9, 50'000}, 50);
  Log log_a, log_b;
  test::send_all(a, to_b, log_a);
  test::send_all(b, to_a, log_b);
  ASSERT_TRUE(l.run(
      {&a, &b}, [&] { return log_a.ok.size() == to_b.size() && log_b.ok.size() == to_a.size(); }));
  l.idle({&a, &b}, 50 * test::kMs);
  EXPECT_TRUE(log_a.all_ok(to_b.size()));
  EXPECT_TRUE(log_b.all_ok(to_a.size()));
  for (uint32_t i = 0; i < to_b.size(); ++i) EXPECT_TRUE(in_b.has(i, to_b[i])) << "message " << i;
  for (uint32_t i = 0; i < to_a.size(); ++i) EXPECT_TRUE(in_a.has(i, to_a[i])) << "message " << i;
  // The faults were real, and the transport repaired them.
  EXPECT_GT(l.a.counters().link_lost, 0u);
  EXPECT_GT(l.a.counters().link_reordered, 0u);
  EXPECT_GT(l.a.counters().link_duplicated, 0u);
  EXPECT_GT(a.counters_st().tx_retransmits, 0u);
  EXPECT_GT(b.peer_stats_st(0).transport.rx.duplicates, 0u);
  EXPECT_EQ(a.counters_st().requeue_stashed + b.counters_st().requeue_stashed, 0u);
  EXPECT_EQ(a.peer_stats_st(0).outstanding, 0u);
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(b.idle_st());
}

TEST(EndpointUnit, DuplicatesAreSuppressed) {
  Link l;
  l.impair(0, 0, 0.5, 4);
  Inbox in_a, in_b;
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB, 5)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), in_b, l.now);
  const auto to_b = bodies({1, 3 * kPayload, 100'000});
  Log log;
  test::send_all(a, to_b, log);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == to_b.size(); }));
  l.idle({&a, &b}, 10 * test::kMs);
  EXPECT_TRUE(log.all_ok(to_b.size()));
  for (uint32_t i = 0; i < to_b.size(); ++i) EXPECT_TRUE(in_b.has(i, to_b[i])) << "message " << i;
  const uint64_t dups = b.peer_stats_st(0).transport.rx.duplicates;
  EXPECT_GT(dups, 0u);
  EXPECT_EQ(b.counters_st().verdicts[static_cast<size_t>(RxVerdict::kDuplicate)], dups);
  EXPECT_EQ(b.counters_st().messages_received, to_b.size());
  EXPECT_EQ(a.counters_st().tx_retransmits, 0u);  // nothing was lost
}

// Drops the first transmission of the data packets whose order of first
// transmission (0, 1, ...) is in `drop`; everything else passes.
struct ScriptedLoss {
  std::set<uint32_t> drop;
  uint32_t seen = 0;
  static bool drop_if(void* self, const wire::HeaderFields& h) {
    auto& s = *static_cast<ScriptedLoss*>(self);
    if (h.type == wire::PacketType::kAck || (h.flags & wire::flags::kRetransmit) != 0) return false;
    return s.drop.count(s.seen++) != 0;
  }
};

struct Scripted {
  Link l;
  ScriptedLoss loss;
  Inbox in_a, in_b;
  Endpoint a{l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB, 5)), in_a, l.now};
  Endpoint b{l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), in_b, l.now};
  Log log;

  // A 12-packet message a -> b (all of it fits the window of 16).
  explicit Scripted(std::set<uint32_t> drop) {
    loss.drop = std::move(drop);
    l.a.set_link({.drop_if = &ScriptedLoss::drop_if, .drop_context = &loss});
    const auto body = bodies({12 * kPayload});
    test::send_all(a, body, log);
    EXPECT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 1; }));
    l.idle({&a, &b}, 20 * test::kMs);
    EXPECT_TRUE(log.all_ok(1));
    EXPECT_TRUE(in_b.has(0, body[0]));
    EXPECT_EQ(l.a.counters().link_lost, loss.drop.size());
  }
  const SenderCounters& tx() const { return tx_ = a.peer_stats_st(0).transport.tx; }
  mutable SenderCounters tx_;
};

// Packets 2 and 8 of 12 are lost; the later ones arrive, so the SACK rule
// finds both (in the one ACK that answers the burst). Packet 2 is then the
// oldest unacknowledged one: the left-edge path resends it at once. Packet
// 8 is not (2 still holds the cumulative ACK): it goes through the
// scheduler's retransmission queue.
TEST(EndpointUnit, FastLossesAreResentFromTheLeftEdgeAndTheScheduler) {
  Scripted s({2, 8});
  EXPECT_EQ(s.tx().losses_fast, 2u);
  EXPECT_EQ(s.tx().retransmits_fast, 2u);
  EXPECT_EQ(s.tx().retransmits_timeout, 0u);
  const EndpointCounters c = s.a.counters_st();
  EXPECT_EQ(c.tx_retransmits, 2u);
  EXPECT_EQ(c.resends_left_edge, 1u);
  EXPECT_EQ(c.resends_window_blocked, 0u);
  // The left edge's slice still waited in the scheduler: dropped as stale.
  EXPECT_EQ(c.drop(EndpointDrop::kRetransmitStale), 1u);
  EXPECT_EQ(s.b.peer_stats_st(0).transport.rx.duplicates, 0u);  // nothing resent twice
}

// The last packet is lost: nothing after it can show the gap, so the
// retransmission timer asks the peer, whose answer shows it lost, and as
// the left edge it goes out at once.
TEST(EndpointUnit, ATailLossIsFoundByTheTimer) {
  Scripted s({11});
  EXPECT_EQ(s.tx().losses_timeout, 1u);
  EXPECT_EQ(s.tx().retransmits_timeout, 1u);
  EXPECT_EQ(s.tx().retransmits_fast, 0u);
  EXPECT_EQ(s.tx().rto_probes, 1u);
  EXPECT_EQ(s.tx().probe_answers, 1u);
  EXPECT_EQ(s.tx().rto_expirations, 0u);  // the answer, not a second expiry
  EXPECT_EQ(s.a.counters_st().tx_retransmits, 1u);
  EXPECT_EQ(s.a.counters_st().resends_left_edge, 1u);
}

// A peer that stops answering: everything queued and in flight fails, once
// each, with an error naming it; later sends fail at once.
TEST(EndpointUnit, ADeadPeerFailsEverythingWithItsName) {
  Link l;
  Inbox in_a, in_b;
  EndpointConfig ca = test::endpoint_config(3, 0, peer_at("w2", kAddrB, 5));
  ca.transport.peer_timeout_us = 200'000;
  Endpoint a(l.a, ca, in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), in_b, l.now);
  const auto to_b = bodies({100, 1 << 20, 1 << 20, 1 << 20, 1 << 20});
  Log log;
  test::send_all(a, to_b, log);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() >= 1; }));
  l.a.set_link({.cut = true});  // b is gone
  l.b.set_link({.cut = true});
  ASSERT_TRUE(l.run({&a, &b}, [&] {
    uint64_t n = 0;
    for (uint64_t i = 0; i < to_b.size(); ++i) n += log.settled(i);
    return n == to_b.size();
  }));
  for (uint64_t i = 0; i < to_b.size(); ++i) EXPECT_EQ(log.settled(i), 1u) << "message " << i;
  EXPECT_FALSE(log.failed.empty());
  EXPECT_EQ(log.first_status, SendStatus::kPeerTimeout);
  EXPECT_EQ(log.first_error, "peer w2 (10.0.0.2:47101) did not acknowledge for 200 ms");
  EXPECT_TRUE(a.peer_stats_st(0).dead);
  EXPECT_EQ(a.peer_stats_st(0).messages_failed, log.failed.size());
  l.idle({&a}, test::kMs);  // settles stale resend requests
  EXPECT_TRUE(a.idle_st());
  MessageMeta meta;
  ASSERT_EQ(a.send(0, to_b[0].data(), 100, 0, meta, log.done(99)), SubmitStatus::kQueued);
  l.idle({&a}, 2 * test::kUs);
  EXPECT_EQ(log.failed[99], 1u);
}

// Nothing answers at the peer's address (it never resolves): after the
// connect timeout every queued message fails with that reason.
TEST(EndpointUnit, AnUnreachablePeerFailsAfterTheConnectTimeout) {
  Link l;
  Inbox in;
  EndpointConfig c =
      test::endpoint_config(3, 0, PeerSpec{"ps0", test::address(3, 47101).ip, 47101, 0});
  c.transport.connect_timeout_us = 50'000;
  Endpoint a(l.a, c, in, l.now);
  const auto to = bodies({10, 5000});
  Log log;
  test::send_all(a, to, log);
  ASSERT_TRUE(l.run({&a}, [&] { return log.failed.size() == to.size(); }));
  EXPECT_TRUE(log.ok.empty());
  EXPECT_EQ(log.first_status, SendStatus::kPeerUnreachable);
  EXPECT_EQ(log.first_error, "peer ps0 (10.0.0.3:47101) did not answer within 50 ms");
  EXPECT_FALSE(a.peer_stats_st(0).resolved);
  EXPECT_TRUE(a.peer_stats_st(0).dead);
  EXPECT_TRUE(a.idle_st());
  EXPECT_GT(l.a.counters().resolve_failed, 0u);
}

// What a server's glue hears of its peer: each run of packets of one epoch
// as that epoch, and 0 where a restart was heard.
struct Incarnations final : PacketReceiver {
  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte>,
                 net::PacketBuf*) override {
    if (epochs.empty() || epochs.back() != h.epoch) epochs.push_back(h.epoch);
    return false;
  }
  void on_peer_restarted(uint16_t) override { epochs.push_back(0); }
  std::vector<uint32_t> epochs;
};

// A worker killed and started again at once comes back with an epoch one
// millisecond later than its predecessor's (job::fresh_epoch counts
// milliseconds; EAL's start-up alone takes longer), and that is a restart:
// the server's end (b) hears it once, on the new incarnation's first packet,
// before anything of it; the message it had in flight to the old one fails
// naming the restart, and the leftovers of that stream reaching the new
// incarnation are refused as another stream's; then both directions carry
// the new incarnation's messages. The same across the 32-bit wrap, where
// fresh_epoch steps over 0.
TEST(EndpointUnit, APeerBackOneMillisecondLaterIsARestart) {
  // 2026-12-04 00:00:00 UTC in milliseconds, mod 2^32; then the wrap.
  constexpr auto kMidnight = static_cast<uint32_t>(1'796'342'400'000ull);
  for (const auto& [before, after] :
       std::vector<std::pair<uint32_t, uint32_t>>{{kMidnight, kMidnight + 1}, {0xffffffffu, 1}}) {
    SCOPED_TRACE(before);
    ASSERT_TRUE(epoch_newer(after, before));
    Link l;
    Incarnations heard;
    Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("w1", kAddrA)), heard, l.now);
    // Bodies outlive the endpoints: a message is sent from its buffer in place.
    const auto up_old = bodies({3000}), up_new = bodies({5000}, 10);
    const auto down_lost = bodies({1 << 20}, 50), down_new = bodies({2000}, 60);
    Log up1, up2, lost, down2;
    Inbox in_a1, in_a2;
    {
      Endpoint a1(l.a, test::endpoint_config(before, 0, peer_at("s0", kAddrB)), in_a1, l.now);
      test::send_all(a1, up_old, up1);
      ASSERT_TRUE(l.run({&a1, &b}, [&] { return up1.ok.size() == 1; }));
      // b sends 1 MiB; the old incarnation dies with a window of it in flight.
      test::send_all(b, down_lost, lost);
      l.idle({&b}, 20 * test::kUs);
      ASSERT_GT(b.peer_stats_st(0).transport.tx.packets_sent, 0u);
    }
    Endpoint a2(l.a, test::endpoint_config(after, 0, peer_at("s0", kAddrB)), in_a2, l.now);
    test::send_all(a2, up_new, up2, wire::PacketType::kData, 1);
    ASSERT_TRUE(l.run({&a2, &b}, [&] { return up2.ok.size() == 1 && lost.failed.size() == 1; }));
    EXPECT_EQ(heard.epochs, (std::vector<uint32_t>{before, 0, after}));
    EXPECT_EQ(b.peer_stats_st(0).transport.rx.peer_restarts, 1u);
    EXPECT_EQ(b.peer_stats_st(0).transport.rx.stale_epoch, 0u);
    EXPECT_TRUE(lost.ok.empty());
    EXPECT_EQ(lost.first_status, SendStatus::kPeerRestarted);
    EXPECT_EQ(lost.first_error,
              "peer w1 (10.0.0.1:47100) restarted (new epoch): the message was lost with its old "
              "state");
    EXPECT_GT(a2.peer_stats_st(0).transport.rx.unsynced, 0u);  // the old stream's leftovers
    test::send_all(b, down_new, down2, wire::PacketType::kData, 1);
    ASSERT_TRUE(l.run({&a2, &b}, [&] { return down2.ok.size() == 1; }));
    EXPECT_TRUE(in_a2.has(1, down_new[0]));
    EXPECT_EQ(in_a2.messages.count(0), 0u);  // nothing of the old stream completed here
  }
}

}  // namespace
}  // namespace mercury::transport
