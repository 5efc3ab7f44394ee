// The control channel between two endpoints on in-memory ports, under a
// fake clock: messages arrive whole and decoded (also through loss and
// reordering), malformed and oversized ones are counted and dropped,
// heartbeats go to active peers only, and a peer that stops answering is
// named by lost_st() within the transport's peer timeout, idle or not, and
// a probe is reported answered, or failed when the peer is silent.
#include "node/control_channel.h"

#include <gtest/gtest.h>

#include <vector>

#include "transport/endpoint_test_util.h"

namespace mercury::node {
namespace {

using transport::test::kMs;
using transport::test::kUs;

struct Record final : ControlChannel::Handler {
  void on_control_st(uint32_t from, agg::ControlMessage&& m) override {
    got.push_back({from, std::move(m)});
  }
  void on_control_failed_st(uint32_t to, const transport::SendResult& r) override {
    failed.push_back({to, std::string(r.error)});
  }
  void on_control_delivered_st(uint32_t to, agg::ControlKind kind) override {
    answered.push_back(to);
    kinds.push_back(kind);
  }
  std::vector<std::pair<uint32_t, agg::ControlMessage>> got;
  std::vector<std::pair<uint32_t, std::string>> failed;
  std::vector<uint32_t> answered;
  std::vector<agg::ControlKind> kinds;
};

// Hands the endpoint's control messages to a channel (peer index = ours).
struct Receiver final : transport::MessageReceiver {
  std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) override {
    return channel->begin_st(peer, h);
  }
  void on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte*) override {
    channel->complete_st(peer, h);
  }
  void on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte*) override {
    channel->abandon_st(peer, msg_id);
  }
  ControlChannel* channel = nullptr;
};

// One side: an endpoint, its receiver and channel.
struct Side {
  Side(net::MemoryPort& port, uint32_t epoch, uint16_t id, const transport::PeerSpec& peer,
       transport::Tick now)
      : endpoint(port, transport::test::endpoint_config(epoch, id, peer),
                 transport::Receivers{&receiver, nullptr}, now),
        channel({ControlPeer{&endpoint, 0}}, handler,
                {.max_bytes = 4096,
                 .heartbeat_every = transport::keepalive_interval(
                     transport::test::endpoint_config(epoch, id, peer).transport)}) {
    receiver.channel = &channel;
  }
  Record handler;
  Receiver receiver;
  transport::Endpoint endpoint;
  ControlChannel channel;
};

struct Pair {
  transport::test::Link link;
  Side a{link.a, 11, 1, transport::test::peer_at("b", transport::test::kAddrB), link.now};
  Side b{link.b, 22, 2, transport::test::peer_at("a", transport::test::kAddrA), link.now};
  template <class Done>
  bool run(Done done, transport::Tick limit = 2'000 * kMs) {
    return link.run({&a.endpoint, &b.endpoint}, done, limit);
  }
};

agg::ControlMessage declare(uint32_t rank, uint32_t tensors) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kDeclare;
  m.rank = rank;
  for (uint32_t t = 0; t < tensors; ++t) {
    m.tensors.push_back(
        agg::TensorDecl{"layer" + std::to_string(t), 1000 + t, static_cast<uint8_t>(t % 64)});
  }
  return m;
}

TEST(ControlChannel, MessagesArriveWholeAndDecoded) {
  Pair p;
  ASSERT_TRUE(p.a.channel.send_st(0, declare(3, 20)));
  agg::ControlMessage barrier;
  barrier.kind = agg::ControlKind::kBarrier;
  barrier.generation = 9;
  ASSERT_TRUE(p.b.channel.send_st(0, barrier));
  ASSERT_TRUE(p.run([&] {
    return p.a.handler.got.size() == 1 && p.b.handler.got.size() == 1 && p.a.channel.settled_st() &&
           p.b.channel.settled_st();
  }));
  EXPECT_EQ(p.b.handler.got[0].first, 0u);
  EXPECT_EQ(p.b.handler.got[0].second.kind, agg::ControlKind::kDeclare);
  EXPECT_EQ(p.b.handler.got[0].second.rank, 3u);
  ASSERT_EQ(p.b.handler.got[0].second.tensors.size(), 20u);
  EXPECT_EQ(p.b.handler.got[0].second.tensors[19].name, "layer19");
  EXPECT_EQ(p.a.handler.got[0].second.generation, 9u);
  EXPECT_EQ(p.a.channel.counters().sent, 1u);
  EXPECT_EQ(p.b.channel.counters().received, 1u);
}

TEST(ControlChannel, ThroughLossAndReorderingInOrderOfSending) {
  Pair p;
  p.link.impair(0.1, 0.1, 0.05, 5);
  for (uint32_t i = 0; i < 30; ++i) ASSERT_TRUE(p.a.channel.send_st(0, declare(i, 40)));
  ASSERT_TRUE(p.run([&] { return p.b.handler.got.size() == 30 && p.a.channel.settled_st(); }));
  // Each arrives once, whole; the transport completes messages as they finish.
  std::vector<bool> seen(30);
  for (const auto& [from, m] : p.b.handler.got) {
    ASSERT_LT(m.rank, 30u);
    EXPECT_FALSE(seen[m.rank]);
    seen[m.rank] = true;
    EXPECT_EQ(m.tensors.size(), 40u);
  }
}

TEST(ControlChannel, MalformedAndOversizedMessagesAreCountedAndDropped) {
  Pair p;
  // Bytes that are no control message, sent raw through the endpoint.
  std::vector<std::byte> junk(64, std::byte{0x5a});
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kControl;
  transport::test::Log log;
  ASSERT_EQ(
      p.a.endpoint.send(0, junk.data(), 64, 0, meta, {&transport::test::Log::callback, &log, 1}),
      transport::SubmitStatus::kQueued);
  // One over max_bytes (4096).
  ASSERT_TRUE(p.a.channel.send_st(0, declare(1, 400)));
  ASSERT_TRUE(p.run([&] {
    return p.b.channel.counters().malformed == 1 && p.b.channel.counters().too_big == 1;
  }));
  EXPECT_TRUE(p.b.handler.got.empty());
}

TEST(ControlChannel, HeartbeatsGoToActivePeersOnAnInterval) {
  Pair p;
  const transport::Tick every =
      transport::keepalive_interval(transport::test::endpoint_config(1, 1, {}).transport);
  p.a.channel.heartbeat_st(p.link.now, [](uint32_t) { return true; });
  p.a.channel.heartbeat_st(p.link.now + 1, [](uint32_t) { return true; });  // not due yet
  EXPECT_EQ(p.a.channel.counters().heartbeats, 1u);
  p.a.channel.heartbeat_st(p.link.now + every, [](uint32_t) { return false; });  // due, inactive
  EXPECT_EQ(p.a.channel.counters().heartbeats, 1u);
  p.a.channel.heartbeat_st(p.link.now + 2 * every, [](uint32_t) { return true; });
  EXPECT_EQ(p.a.channel.counters().heartbeats, 2u);
  ASSERT_TRUE(p.run([&] { return p.b.handler.got.size() == 2; }));
  EXPECT_EQ(p.b.handler.got[1].second.kind, agg::ControlKind::kHeartbeat);
}

// A peer that goes silent while a message is outstanding is dead within the
// peer timeout (1 s here); the message fails, naming the peer.
TEST(ControlChannel, ASilentPeerIsNamedLost) {
  Pair p;
  ASSERT_TRUE(p.a.channel.send_st(0, declare(0, 1)));
  ASSERT_TRUE(p.run([&] { return p.b.handler.got.size() == 1 && p.a.channel.settled_st(); }));
  p.link.a.set_link({.cut = true});
  p.link.b.set_link({.cut = true});
  ASSERT_TRUE(p.a.channel.send_st(0, declare(0, 2)));
  const auto all = [](uint32_t) { return true; };
  EXPECT_FALSE(p.a.channel.lost_st(all).has_value());
  ASSERT_TRUE(p.link.run(
      {&p.a.endpoint}, [&] { return p.a.channel.lost_st(all).has_value(); }, 2'000 * kMs));
  EXPECT_EQ(*p.a.channel.lost_st(all), 0u);
  EXPECT_FALSE(p.a.channel.lost_st([](uint32_t) { return false; }).has_value());
  ASSERT_TRUE(p.link.run(
      {&p.a.endpoint}, [&] { return !p.a.handler.failed.empty(); }, 100 * kMs));
  EXPECT_EQ(p.a.handler.failed[0].first, 0u);
  EXPECT_NE(p.a.handler.failed[0].second.find('b'), std::string::npos);
  EXPECT_EQ(p.a.channel.counters().failed, 1u);
  EXPECT_TRUE(p.a.channel.settled_st());
}

// A node with nothing outstanding but its heartbeats (a worker between
// rounds) names a peer that went silent within 1.125 x the peer timeout
// (1 s here): the first heartbeat after the cut starts the liveness clock.
TEST(ControlChannel, AnIdleNodeNamesASilentPeerByItsHeartbeats) {
  Pair p;
  const auto all = [](uint32_t) { return true; };
  p.a.channel.heartbeat_st(p.link.now, all);
  ASSERT_TRUE(p.run([&] { return p.b.handler.got.size() == 1 && p.a.channel.settled_st(); }));
  p.link.idle({&p.a.endpoint, &p.b.endpoint}, 50 * kMs);  // idle: nothing outstanding
  ASSERT_TRUE(p.a.channel.settled_st());
  p.link.a.set_link({.cut = true});
  p.link.b.set_link({.cut = true});
  const transport::Tick cut = p.link.now;
  // The node's slow work: a heartbeat when one is due, then liveness.
  ASSERT_TRUE(p.link.run(
      {&p.a.endpoint},
      [&] {
        p.a.channel.heartbeat_st(p.link.now, all);
        return p.a.channel.lost_st(all).has_value();
      },
      3'000 * kMs));
  const double seconds = static_cast<double>(p.link.now - cut) / (1'000 * kMs);
  EXPECT_GE(seconds, 1.0);
  EXPECT_LE(seconds, 1.125 + 0.01);
}

// A probe's acknowledgement is reported, and a message's sent with a report
// (a heartbeat's or a plain send's is not); a probe to a silent peer fails,
// named, within the peer timeout.
TEST(ControlChannel, AProbeIsAnsweredOrFails) {
  Pair p;
  p.a.channel.heartbeat_st(p.link.now, [](uint32_t) { return true; });
  ASSERT_TRUE(p.a.channel.send_st(0, declare(0, 1)));
  ASSERT_TRUE(p.a.channel.probe_st(0));
  ASSERT_TRUE(p.run([&] { return p.a.channel.settled_st(); }));
  EXPECT_EQ(p.a.handler.answered, std::vector<uint32_t>{0});
  agg::ControlMessage released;
  released.kind = agg::ControlKind::kReleased;
  ASSERT_TRUE(p.a.channel.send_st(0, released, true));
  ASSERT_TRUE(p.run([&] { return p.a.channel.settled_st(); }));
  EXPECT_EQ(p.a.handler.answered, (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(p.a.handler.kinds, (std::vector<agg::ControlKind>{agg::ControlKind::kHeartbeat,
                                                              agg::ControlKind::kReleased}));
  EXPECT_EQ(p.b.handler.got.size(), 4u);
  p.link.a.set_link({.cut = true});
  p.link.b.set_link({.cut = true});
  ASSERT_TRUE(p.a.channel.probe_st(0));
  ASSERT_TRUE(p.link.run(
      {&p.a.endpoint}, [&] { return !p.a.handler.failed.empty(); }, 2'000 * kMs));
  EXPECT_EQ(p.a.handler.failed[0].first, 0u);
  EXPECT_EQ(p.a.handler.answered.size(), 2u);
  EXPECT_TRUE(p.a.channel.settled_st());
}

}  // namespace
}  // namespace mercury::node
