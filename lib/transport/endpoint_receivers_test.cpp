// The endpoint's receivers without EAL (net::MemoryPort, fake clock): slices
// to a PacketReceiver that keeps some buffers, admission refused then
// granted, a MessageReceiver refusing messages, routing with both receivers,
// partition start-ups (acknowledged, never delivered), a peer restart heard by
// the PacketReceiver, a packet from no peer, and the submission refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
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

// Takes packets one by one, checks each payload against the logical
// message's bytes, and keeps every third buffer until release().
class Chunks final : public PacketReceiver {
 public:
  Chunks(net::MemoryPort& port, const std::vector<std::byte>& logical)
      : port_(port), logical_(logical) {}
  bool admit(uint16_t, const wire::HeaderFields& h) override {
    if (!open && h.type == wire::PacketType::kData) {
      ++refusals;
      return false;
    }
    return true;
  }
  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    ++got[{h.block_key, h.offset}];
    slices += (h.flags & wire::flags::kSlice) != 0;
    if (h.msg_len != logical_.size() || h.offset + payload.size() > logical_.size() ||
        !std::equal(payload.begin(), payload.end(), logical_.begin() + h.offset)) {
      ++wrong;
    }
    if (++n_ % 3 != 0) return false;
    held_.push_back(buf);
    held_payloads_.push_back({payload, h.offset});
    return true;
  }
  void on_peer_restarted(uint16_t) override { ++restarts; }
  /// Gives the kept buffers back; false if a kept payload changed meanwhile
  /// (its buffer was reused while held).
  bool release() {
    bool intact = true;
    for (const auto& [p, offset] : held_payloads_) {
      intact = intact && std::equal(p.begin(), p.end(), logical_.begin() + offset);
    }
    port_.release_st(held_.data(), static_cast<uint16_t>(held_.size()));
    held_.clear();
    held_payloads_.clear();
    return intact;
  }
  size_t held() const { return held_.size(); }

  bool open = true;
  uint32_t refusals = 0;
  uint32_t slices = 0;
  uint32_t wrong = 0;
  uint32_t restarts = 0;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> got;  // (key, offset) -> deliveries

 private:
  net::MemoryPort& port_;  // the port the endpoint receives on
  const std::vector<std::byte>& logical_;
  std::vector<net::PacketBuf*> held_;
  std::vector<std::pair<std::span<const std::byte>, uint32_t>> held_payloads_;
  uint32_t n_ = 0;
};

// Every packet offset of [0, len) was delivered exactly once.
bool each_packet_once(const Chunks& c, uint32_t key, uint32_t base, uint32_t len) {
  for (uint32_t off = base; off < base + len; off += kPayload) {
    const auto it = c.got.find({key, off});
    if (it == c.got.end() || it->second != 1) return false;
  }
  return true;
}

TEST(EndpointReceivers, SlicesGoToThePacketReceiverOnceEach) {
  Link l;
  l.impair(0.03, 0.05, 0.05, 21);
  const std::vector<std::byte> logical = pattern(7, 40 * kPayload);
  Inbox in_a;
  Chunks chunks(l.b, logical);
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA)), chunks, l.now);
  // Four parts of one logical message, sent out of order.
  MessageMeta meta;
  meta.type = wire::PacketType::kAggData;
  meta.block_key = 7;
  Log log;
  const uint32_t part = 10 * kPayload;
  for (uint32_t i : {2u, 0u, 3u, 1u}) {
    ASSERT_EQ(a.send_slice(0, logical.data() + i * part, part, i * part,
                           static_cast<uint32_t>(logical.size()), static_cast<uint8_t>(i), meta,
                           log.done(i)),
              SubmitStatus::kQueued);
  }
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 4; }));
  l.idle({&a, &b}, 20 * test::kMs);
  EXPECT_TRUE(log.all_ok(4));
  EXPECT_TRUE(each_packet_once(chunks, 7, 0, static_cast<uint32_t>(logical.size())));
  EXPECT_EQ(chunks.got.size(), 40u);
  EXPECT_EQ(chunks.wrong, 0u);
  EXPECT_EQ(chunks.slices, 40u);
  const EndpointCounters c = b.counters_st();
  EXPECT_EQ(c.packets_delivered, 40u);
  EXPECT_EQ(c.packets_kept, chunks.held());
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.slice_packets, 40u);
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.messages_completed, 0u);  // no message accounting
  EXPECT_EQ(a.counters_st().slices_submitted, 4u);
  // The kept buffers are a's frames (the link carries the sender's buffers):
  // they come back when the receiver releases them.
  EXPECT_GT(chunks.held(), 0u);
  EXPECT_EQ(l.a.buffers_free() + chunks.held(), l.a.buffers());
  EXPECT_TRUE(chunks.release());  // every kept payload intact until now
  EXPECT_EQ(l.a.buffers_free(), l.a.buffers());
}

// While the receiver refuses, its packets are not acknowledged: the sender
// resends them, and once admitted each is delivered exactly once.
TEST(EndpointReceivers, RefusedPacketsAreResentAndThenDeliveredOnce) {
  Link l;
  const std::vector<std::byte> body = pattern(1, 20 * kPayload);
  Inbox in_a;
  Chunks chunks(l.b, body);
  chunks.open = false;
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB, 5)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), chunks, l.now);
  Log log;
  MessageMeta meta;
  meta.block_key = 1;
  ASSERT_EQ(a.send(0, body.data(), static_cast<uint32_t>(body.size()), 0, meta, log.done(0)),
            SubmitStatus::kQueued);
  l.idle({&a, &b}, 30 * test::kMs);
  EXPECT_TRUE(log.ok.empty());
  EXPECT_TRUE(chunks.got.empty());
  EXPECT_GT(chunks.refusals, 0u);
  EXPECT_EQ(b.counters_st().drop(EndpointDrop::kBackpressure), chunks.refusals);
  EXPECT_EQ(b.peer_stats_st(0).packets_refused, chunks.refusals);
  chunks.open = true;
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 1; }));
  l.idle({&a, &b}, 10 * test::kMs);
  EXPECT_TRUE(log.all_ok(1));
  EXPECT_TRUE(each_packet_once(chunks, 1, 0, static_cast<uint32_t>(body.size())));
  EXPECT_EQ(chunks.wrong, 0u);
  EXPECT_GT(a.counters_st().tx_retransmits, 0u);
  EXPECT_TRUE(chunks.release());
}

// A MessageReceiver may refuse a message: counted, its bytes acknowledged
// and dropped (the sender's completion succeeds), the others intact.
TEST(EndpointReceivers, AReceiverMayRefuseAMessage) {
  Link l;
  Inbox in_a, in_b;
  in_b.refuse = [](uint32_t key) { return key % 2 == 0; };
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB, 5)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), in_b, l.now);
  std::vector<std::vector<std::byte>> to_b;
  for (uint32_t i = 0; i < 6; ++i) to_b.push_back(pattern(i, i < 3 ? 100 : 5 * kPayload));
  Log log;
  test::send_all(a, to_b, log);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == to_b.size(); }));
  EXPECT_TRUE(log.all_ok(to_b.size()));
  EXPECT_EQ(in_b.refused, 3u);
  for (uint32_t i = 0; i < to_b.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_EQ(in_b.messages.count(i), 0u) << "message " << i;
    } else {
      EXPECT_TRUE(in_b.has(i, to_b[i])) << "message " << i;
    }
  }
  EXPECT_EQ(b.peer_stats_st(0).messages_refused, 3u);
  EXPECT_EQ(b.peer_stats_st(0).messages_received, 3u);
  // One drop per refused packet: one for a single-packet message, five for
  // the multi-packet one.
  EXPECT_EQ(b.counters_st().drop(EndpointDrop::kRefused), 1u + 1u + 5u);
}

struct Packets final : PacketReceiver {
  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte>,
                 net::PacketBuf*) override {
    types.push_back(h.type);
    offsets.push_back(h.offset);
    slices += (h.flags & wire::flags::kSlice) != 0;
    epochs.push_back(h.epoch);
    return false;
  }
  void on_peer_restarted(uint16_t) override { epochs.push_back(0); }
  std::vector<wire::PacketType> types;
  std::vector<uint32_t> offsets;
  std::vector<uint32_t> epochs;
  uint32_t slices = 0;
};

// With both receivers, control messages arrive whole and data packet by
// packet; an endpoint with only a MessageReceiver drops slices (counted,
// acknowledged: the sender's completion still succeeds).
TEST(EndpointReceivers, EachPacketIsRoutedByItsFlagsAndType) {
  Link l;
  Inbox msgs_a, msgs_b;
  Packets pkts_b;
  Endpoint a(l.a, test::endpoint_config(3, 1, peer_at("b", kAddrB)), msgs_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 0, peer_at("a", kAddrA)), Receivers{&msgs_b, &pkts_b},
             l.now);
  const std::vector<std::byte> bytes = pattern(0, 20'000);
  Log log;
  MessageMeta control;
  control.type = wire::PacketType::kControl;
  MessageMeta data;
  ASSERT_EQ(a.send(0, bytes.data(), 20'000, 0, control, log.done(0)), SubmitStatus::kQueued);
  ASSERT_EQ(a.send(0, bytes.data(), 20'000, 1, data, log.done(1)), SubmitStatus::kQueued);
  ASSERT_EQ(a.send_slice(0, bytes.data(), 100, 500, 1000, 2, data, log.done(2)),
            SubmitStatus::kQueued);
  ASSERT_EQ(b.send_slice(0, bytes.data(), 100, 0, 100, 0, data, log.done(3)),
            SubmitStatus::kQueued);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 4; }));
  l.idle({&a, &b}, 10 * test::kMs);
  ASSERT_EQ(msgs_b.messages.size(), 1u);
  EXPECT_EQ(msgs_b.messages.at(0).type, wire::PacketType::kControl);
  EXPECT_TRUE(msgs_b.has(0, bytes));
  EXPECT_EQ(pkts_b.types.size(), 15u + 1u);  // 20'000 bytes in 15 packets, and the slice
  EXPECT_EQ(pkts_b.slices, 1u);
  EXPECT_EQ(b.counters_st().packets_delivered, 16u);
  EXPECT_EQ(b.counters_st().messages_received, 1u);
  EXPECT_TRUE(msgs_a.messages.empty());
  EXPECT_EQ(a.counters_st().drop(EndpointDrop::kNoReceiver), 1u);
  EXPECT_EQ(a.peer_stats_st(0).transport.rx.slice_packets, 1u);
  EXPECT_EQ(l.a.buffers_free(), l.a.buffers());
  EXPECT_EQ(l.b.buffers_free(), l.b.buffers());
}

// In partition mode (the P3 baseline) every partition's start-up travels as
// a kPartitionStart packet: acknowledged and counted by the receiver, never
// delivered to either receiver. Partitions are whole packets: a partition
// size that is not a multiple of the packet payload is rounded down to one,
// so every data packet starts on the payload grid the receivers index by. A
// zero-length kControl message is an ordinary message: delivered whole, empty.
TEST(EndpointReceivers, PartitionStartsAreAcknowledgedNotDeliveredAndEmptyControlIsAMessage) {
  Link l;
  Inbox msgs_a, msgs_b;
  Packets pkts_b;
  const uint32_t payload = net::payload_per_packet(l.a.mtu());
  ASSERT_LT(payload, 4096u);
  ASSERT_NE(4096 % payload, 0u);  // the size asked for is not whole packets
  const uint32_t part = 4096 / payload * payload;
  EndpointConfig ca = test::endpoint_config(3, 1, peer_at("b", kAddrB));
  ca.mode = sched::Mode::kPartition;
  ca.partition_bytes = 4096;
  ca.credit_bytes = 8192;
  Endpoint a(l.a, ca, msgs_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 0, peer_at("a", kAddrA)), Receivers{&msgs_b, &pkts_b},
             l.now);
  const std::vector<std::byte> bytes = pattern(0, 10'000);
  Log log;
  MessageMeta data;
  data.block_key = 1;
  MessageMeta control;
  control.type = wire::PacketType::kControl;
  control.block_key = 2;
  ASSERT_EQ(a.send(0, bytes.data(), 10'000, 0, data, log.done(0)), SubmitStatus::kQueued);
  ASSERT_EQ(a.send(0, nullptr, 0, 1, control, log.done(1)), SubmitStatus::kQueued);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 2; }));
  l.idle({&a, &b}, 10 * test::kMs);
  // The data's partitions of `part` bytes and the empty message's one (empty)
  // partition: a start-up each, each acknowledged once.
  const uint32_t parts = (10'000 + part - 1) / part;
  EXPECT_EQ(a.scheduler().stats_st().partition_starts, parts + 1);
  EXPECT_EQ(b.counters_st().partition_starts_received, parts + 1);
  ASSERT_EQ(msgs_b.messages.size(), 1u);
  EXPECT_EQ(msgs_b.messages.at(2).type, wire::PacketType::kControl);
  EXPECT_TRUE(msgs_b.has(2, {}));
  // 10'000 bytes in as few packets as without partitions, each on the grid.
  const uint32_t packets = (10'000 + payload - 1) / payload;
  ASSERT_EQ(pkts_b.types.size(), packets);
  EXPECT_EQ(std::count(pkts_b.types.begin(), pkts_b.types.end(), wire::PacketType::kData), packets);
  std::vector<uint32_t> offsets = pkts_b.offsets;
  std::sort(offsets.begin(), offsets.end());
  for (uint32_t k = 0; k < packets; ++k) EXPECT_EQ(offsets[k], k * payload);
  EXPECT_EQ(b.counters_st().drop(EndpointDrop::kNoReceiver), 0u);
  EXPECT_TRUE(log.failed.empty());
}

// The sending side restarts (a new incarnation on the same port): the
// PacketReceiver hears it once, before the new incarnation's first packet,
// and packets from both incarnations are each delivered once.
TEST(EndpointReceivers, APacketReceiverHearsAPeerRestart) {
  Link l;
  Inbox msgs;
  Packets rx;
  const std::vector<std::byte> bytes = pattern(0, 4096);
  MessageMeta meta;
  meta.type = wire::PacketType::kAggData;
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA)), rx, l.now);
  Log log;
  {
    Endpoint a1(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), msgs, l.now);
    ASSERT_EQ(a1.send_slice(0, bytes.data(), 1000, 0, 4000, 0, meta, log.done(0)),
              SubmitStatus::kQueued);
    ASSERT_TRUE(l.run({&a1, &b}, [&] { return log.ok.size() == 1; }));
    l.idle({&a1, &b}, 10 * test::kMs);
  }
  Endpoint a2(l.a, test::endpoint_config(4, 0, peer_at("b", kAddrB)), msgs, l.now);
  ASSERT_EQ(a2.send_slice(0, bytes.data() + 1000, 1000, 1000, 4000, 0, meta, log.done(1)),
            SubmitStatus::kQueued);
  ASSERT_TRUE(l.run({&a2, &b}, [&] { return log.ok.size() == 2; }));
  EXPECT_TRUE(log.all_ok(2));
  EXPECT_EQ(rx.epochs, (std::vector<uint32_t>{3, 0, 4}));  // 0: where the restart was heard
}

// A pure ACK forged with a's address and a newer epoch, injected into b's
// port while a and b exchange messages: b challenges a, a answers, and the
// forgery changes nothing; every one of its copies is counted.
TEST(EndpointReceivers, AForgedNewEpochChangesNothingAndIsCounted) {
  Link l;
  Inbox in_a, in_b;
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), in_a, l.now);
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA)), in_b, l.now);
  Log log;
  std::vector<std::vector<std::byte>> bodies;
  for (uint32_t k = 0; k < 8; ++k) bodies.push_back(pattern(k, 5000));
  send_all(a, {bodies[0]}, log);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return log.ok.size() == 1; }));
  net::Route to_b{kAddrB.mac, kAddrB.ip, kAddrB.udp_port};
  wire::HeaderFields h;
  h.type = wire::PacketType::kAck;
  h.flags = wire::flags::kAckValid;
  h.epoch = 4;  // a's next incarnation
  std::vector<std::byte> frame(net::kFrameOverhead + 64);
  const size_t len =
      net::build_data_frame(frame, kAddrA, to_b, h, {}, net::ChecksumMode::kSoftware);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(l.b.inject_st({frame.data(), len}));
  Log after;
  send_all(a, bodies, after, wire::PacketType::kData, 100);
  ASSERT_TRUE(l.run({&a, &b}, [&] { return after.ok.size() == bodies.size(); }));
  l.idle({&a, &b}, 300 * test::kMs);  // past the challenge timeout
  constexpr auto kChallenged = static_cast<size_t>(RxVerdict::kChallenged);
  EXPECT_EQ(b.counters_st().verdicts[kChallenged], 5u);
  const PeerCounters pc = b.peer_stats_st(0).transport;
  EXPECT_EQ(pc.challenges, 1u);
  EXPECT_EQ(pc.challenge_answers, 1u);
  EXPECT_EQ(pc.rx.peer_restarts, 0u);
  EXPECT_EQ(in_b.abandoned, 0u);
  EXPECT_TRUE(log.failed.empty());
  EXPECT_TRUE(after.all_ok(bodies.size()));
  for (uint32_t k = 0; k < bodies.size(); ++k) EXPECT_TRUE(in_b.has(100 + k, bodies[k])) << k;
}

// A valid Mercury packet from an address that is no peer: dropped, counted,
// its buffer back to the port.
TEST(EndpointReceivers, APacketFromNoPeerIsDroppedAndCounted) {
  Link l;
  Inbox in;
  Endpoint b(l.b, test::endpoint_config(5, 1, peer_at("a", kAddrA, 3)), in, l.now);
  const net::LocalAddr stranger = test::address(9, 47100);
  net::Route to_b{kAddrB.mac, kAddrB.ip, kAddrB.udp_port};
  wire::HeaderFields h;
  h.epoch = 3;
  h.msg_len = 4;
  const std::vector<std::byte> payload(4, std::byte{1});
  std::vector<std::byte> frame(net::kFrameOverhead + 64);
  const size_t len =
      net::build_data_frame(frame, stranger, to_b, h, payload, net::ChecksumMode::kSoftware);
  ASSERT_TRUE(l.b.inject_st({frame.data(), len}));
  l.idle({&b}, 3 * test::kUs);
  const EndpointCounters c = b.counters_st();
  EXPECT_EQ(c.rx_packets, 1u);
  EXPECT_EQ(c.drop(EndpointDrop::kUnknownPeer), 1u);
  EXPECT_EQ(b.peer_stats_st(0).transport.rx.packets_accepted, 0u);
  EXPECT_TRUE(in.messages.empty());
  // The injected frame's buffer is back; b's own frames (its probes) wait at
  // a, which nobody polls.
  EXPECT_EQ(l.b.buffers_free() + l.b.counters().tx_frames, l.b.buffers());
}

// A packet of another job from a peer's own address (jobs may share hosts
// and ports): dropped and counted before the transport sees it; the same
// header with this job's id is taken.
TEST(EndpointReceivers, APacketOfAnotherJobIsDroppedAndCounted) {
  Link l;
  Inbox in;
  EndpointConfig config = test::endpoint_config(5, 1, peer_at("a", kAddrA));
  config.job_id = 7;
  constexpr auto kAckOnly = static_cast<size_t>(RxVerdict::kAckOnly);
  Endpoint b(l.b, config, in, l.now);
  net::Route to_b{kAddrB.mac, kAddrB.ip, kAddrB.udp_port};
  wire::HeaderFields h;
  h.type = wire::PacketType::kAck;
  h.epoch = 3;
  h.job_id = 8;
  std::vector<std::byte> frame(net::kFrameOverhead + 64);
  size_t len = net::build_data_frame(frame, kAddrA, to_b, h, {}, net::ChecksumMode::kSoftware);
  ASSERT_TRUE(l.b.inject_st({frame.data(), len}));
  l.idle({&b}, 3 * test::kUs);
  EXPECT_EQ(b.counters_st().drop(EndpointDrop::kWrongJob), 1u);
  EXPECT_EQ(b.counters_st().verdicts[kAckOnly], 0u);  // the transport never saw it
  h.job_id = 7;
  len = net::build_data_frame(frame, kAddrA, to_b, h, {}, net::ChecksumMode::kSoftware);
  ASSERT_TRUE(l.b.inject_st({frame.data(), len}));
  l.idle({&b}, 3 * test::kUs);
  const EndpointCounters c = b.counters_st();
  EXPECT_EQ(c.drop(EndpointDrop::kWrongJob), 1u);
  EXPECT_EQ(c.drop(EndpointDrop::kUnknownPeer), 0u);
  EXPECT_EQ(c.verdicts[kAckOnly], 1u);  // this job's: the transport took it
}

TEST(EndpointReceivers, SubmissionsWithInvalidArgumentsAreRefused) {
  Link l;
  Inbox in;
  Endpoint a(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), in, l.now);
  const std::vector<std::byte> bytes = pattern(0, 1024);
  MessageMeta meta;
  EXPECT_EQ(a.send(1, bytes.data(), 10, 0, meta, {}), SubmitStatus::kInvalid);   // no peer 1
  EXPECT_EQ(a.send(0, bytes.data(), 10, 64, meta, {}), SubmitStatus::kInvalid);  // priority
  EXPECT_EQ(a.send(0, nullptr, 10, 0, meta, {}), SubmitStatus::kInvalid);
  meta.type = wire::PacketType::kPartitionStart;  // the endpoint's own
  EXPECT_EQ(a.send(0, bytes.data(), 0, 0, meta, {}), SubmitStatus::kInvalid);
  meta.type = wire::PacketType::kAck;
  EXPECT_EQ(a.send(0, bytes.data(), 10, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.counters_st().submit_invalid, 5u);
  // send_slice: an empty part, a part past the logical message, a control
  // type, misaligned float32 and bfloat16, a dtype past the enum, no such peer.
  meta = MessageMeta{};
  EXPECT_EQ(a.send_slice(0, bytes.data(), 0, 0, 100, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 1, 100, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 0xffffffc0u, 0xffffffffu, 0, meta, {}),
            SubmitStatus::kInvalid);
  meta.type = wire::PacketType::kControl;
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 0, 100, 0, meta, {}), SubmitStatus::kInvalid);
  meta.type = wire::PacketType::kAggData;
  meta.dtype = wire::Dtype::kFloat32;
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 2, 200, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 0, 202, 0, meta, {}), SubmitStatus::kInvalid);
  meta.dtype = wire::Dtype::kBFloat16;
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 1, 200, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 99, 0, 200, 0, meta, {}), SubmitStatus::kInvalid);
  meta.dtype = static_cast<wire::Dtype>(wire::kDtypeCount);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 0, 200, 0, meta, {}), SubmitStatus::kInvalid);
  meta.dtype = wire::Dtype::kFloat32;
  EXPECT_EQ(a.send_slice(1, bytes.data(), 100, 0, 200, 0, meta, {}), SubmitStatus::kInvalid);
  EXPECT_EQ(a.counters_st().submit_invalid, 5u + 10u);
  EXPECT_EQ(a.counters_st().slices_submitted, 0u);
  EXPECT_EQ(a.send_slice(0, bytes.data(), 100, 100, 200, 0, meta, {}), SubmitStatus::kQueued);
  // Two-byte elements need only even offsets and lengths.
  meta.dtype = wire::Dtype::kFloat16;
  EXPECT_EQ(a.send_slice(0, bytes.data(), 98, 2, 200, 0, meta, {}), SubmitStatus::kQueued);
  EXPECT_EQ(a.counters_st().slices_submitted, 2u);
}

TEST(EndpointReceivers, AnEndpointNeedsAReceiverAndAValidConfig) {
  Link l;
  Inbox in;
  EXPECT_THROW(Endpoint(l.a, test::endpoint_config(3, 0, peer_at("b", kAddrB)), Receivers{}, l.now),
               std::invalid_argument);
  EndpointConfig c = test::endpoint_config(0, 0, peer_at("b", kAddrB));
  EXPECT_THROW(Endpoint(l.a, c, in, l.now), std::invalid_argument);  // epoch 0
  c = test::endpoint_config(3, 0, peer_at("b", kAddrB));
  c.tx_burst = net::PacketPort::kBurst + 1;
  EXPECT_THROW(Endpoint(l.a, c, in, l.now), std::invalid_argument);
  c = test::endpoint_config(3, 0, peer_at("b", kAddrB));
  c.peers.push_back(peer_at("b2", kAddrB));  // the same address twice
  EXPECT_THROW(Endpoint(l.a, c, in, l.now), std::invalid_argument);
}

}  // namespace
}  // namespace mercury::transport
