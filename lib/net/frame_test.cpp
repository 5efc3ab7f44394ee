#include "net/frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "net/checksum.h"

namespace mercury::net {
namespace {

// RFC 1071 reference: 16-bit big-endian words, end-around carry.
uint16_t reference_checksum(const std::vector<uint8_t>& bytes) {
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += 2) {
    uint16_t w = static_cast<uint16_t>(bytes[i] << 8);
    if (i + 1 < bytes.size()) w |= bytes[i + 1];
    sum += w;
    sum = (sum & 0xffff) + (sum >> 16);
  }
  return static_cast<uint16_t>(~sum);
}

TEST(Checksum, MatchesReferenceForAllLengths) {
  std::mt19937 rng(1);
  for (size_t len = 0; len < 600; ++len) {
    std::vector<uint8_t> b(len);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    const uint16_t want = reference_checksum(b);
    const uint16_t got = checksum_of(partial_sum(b.data(), b.size()));
    // Stored natively, `got` has the reference's network byte order.
    uint8_t stored[2];
    std::memcpy(stored, &got, 2);
    EXPECT_EQ((stored[0] << 8) | stored[1], want) << len;
    // Split at any even point, the partial sums add up to the same checksum.
    const size_t half = len / 2 & ~size_t{1};
    EXPECT_EQ(checksum_of(partial_sum(b.data() + half, len - half, partial_sum(b.data(), half))),
              got)
        << len;
  }
}

// Frame-sized and much larger buffers, all 0xff (the largest words, so any
// lane that could overflow would) and random: the vector paths split long
// buffers into blocks their 32-bit lanes can hold.
TEST(Checksum, MatchesReferenceForLargeBuffers) {
  std::mt19937 rng(2);
  for (size_t len : {1416u, 1417u, 8958u, 9000u, 3u << 20, (5u << 20) + 7}) {
    for (bool ones : {true, false}) {
      std::vector<uint8_t> b(len, 0xff);
      if (!ones) {
        for (auto& x : b) x = static_cast<uint8_t>(rng());
      }
      const uint16_t got = checksum_of(partial_sum(b.data(), b.size()));
      uint8_t stored[2];
      std::memcpy(stored, &got, 2);
      EXPECT_EQ((stored[0] << 8) | stored[1], reference_checksum(b)) << len << " " << ones;
    }
  }
}

// The send path's fused copy and sum: the same bytes as memcpy and the same
// sum as partial_sum, at every length up to 600, at misaligned addresses,
// and past the 2 MiB at which the vector lanes are folded.
TEST(Checksum, CopyAndSumMatchesCopyThenSum) {
  std::mt19937 rng(3);
  for (size_t len :
       {0u, 1u, 63u, 127u, 128u, 255u, 256u, 257u, 599u, 1416u, 8958u, 3u << 20, (5u << 20) + 7}) {
    for (size_t misalign : {0u, 1u, 30u}) {
      std::vector<uint8_t> src(len + 64), dst(len + 128, 0xa5);
      for (auto& x : src) x = static_cast<uint8_t>(rng());
      const uint8_t* from = src.data() + misalign;
      uint8_t* to = dst.data() + 64 - misalign;
      const uint64_t got = copy_partial_sum(to, from, len, 17);
      EXPECT_EQ(checksum_of(got), checksum_of(partial_sum(from, len, 17))) << len;
      EXPECT_EQ(std::memcmp(to, from, len), 0) << len;
      EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + (64 - misalign),
                              [](uint8_t x) { return x == 0xa5; }));
      EXPECT_TRUE(std::all_of(dst.begin() + (64 - misalign) + len, dst.end(),
                              [](uint8_t x) { return x == 0xa5; }))
          << "written past the end, len " << len;
    }
  }
  for (size_t len = 0; len < 600; ++len) {
    std::vector<uint8_t> src(len), dst(len), plain(len);
    for (auto& x : src) x = static_cast<uint8_t>(rng());
    EXPECT_EQ(checksum_of(copy_partial_sum(dst.data(), src.data(), len)),
              checksum_of(partial_sum(src.data(), len)))
        << len;
    EXPECT_EQ(dst, src) << len;
    copy_payload(plain.data(), src.data(), len);  // the same loop without the sum
    EXPECT_EQ(plain, src) << len;
  }
  copy_payload(nullptr, nullptr, 0);
  EXPECT_EQ(copy_partial_sum(nullptr, nullptr, 0, 5), 5u);
}

struct Fixture : ::testing::Test {
  LocalAddr a{MacAddr{{2, 0, 0, 0, 0, 1}}, 0x0a000001, 47100};
  LocalAddr b{MacAddr{{2, 0, 0, 0, 0, 2}}, 0x0a000002, 47101};
  std::vector<std::byte> payload;
  wire::HeaderFields h;

  Fixture() {
    payload.resize(1400);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte(i * 7 + 3);
    h.type = wire::PacketType::kData;
    h.dtype = wire::Dtype::kFloat32;
    h.block_key = 17;
    h.msg_len = 1 << 20;
    h.offset = 4096;
    h.seq = 5;
  }
  std::vector<std::byte> frame_to_b(ChecksumMode mode, size_t payload_bytes) {
    std::vector<std::byte> f(kFrameOverhead + payload_bytes + kMinFrame);
    const size_t n = build_data_frame(f, a, Route{b.mac, b.ip, b.udp_port}, h,
                                      std::span(payload).first(payload_bytes), mode);
    f.resize(n);
    return f;
  }
};

TEST_F(Fixture, RoundTripsHeadersAndPayload) {
  for (auto mode : {ChecksumMode::kSoftware, ChecksumMode::kNone}) {
    auto f = frame_to_b(mode, payload.size());
    EXPECT_EQ(f.size(), kFrameOverhead + payload.size());
    ParsedFrame p;
    parse_frame(f, b, RxChecks{true, mode == ChecksumMode::kSoftware}, p);
    ASSERT_EQ(p.kind, FrameKind::kMercury) << drop_reason_name(p.drop);
    EXPECT_EQ(p.src_mac, a.mac);
    EXPECT_EQ(p.src_ip, a.ip);
    EXPECT_EQ(p.src_port, a.udp_port);
    wire::HeaderFields want = h;
    want.payload_len = static_cast<uint16_t>(payload.size());
    EXPECT_EQ(p.header, want);
    ASSERT_EQ(p.payload.size(), payload.size());
    EXPECT_EQ(std::memcmp(p.payload.data(), payload.data(), payload.size()), 0);
  }
}

TEST_F(Fixture, HeadersAlonePlusThePayloadAreTheWholeFrame) {
  // The by-reference send path writes the headers into one segment and
  // leaves the payload where it is: the two together must be byte for byte
  // the frame the copying path builds, checksums included.
  const FrameTemplate t = make_frame_template(a, Route{b.mac, b.ip, b.udp_port});
  for (auto mode : {ChecksumMode::kSoftware, ChecksumMode::kNone, ChecksumMode::kOffload}) {
    for (size_t n : {size_t{18}, size_t{1024}, size_t{1399}, payload.size()}) {
      std::vector<std::byte> headers(kFrameOverhead);
      const auto part = std::span(payload).first(n);
      ASSERT_EQ(build_data_headers(headers, t, h, part, mode), kFrameOverhead);
      headers.insert(headers.end(), part.begin(), part.end());
      EXPECT_EQ(headers, frame_to_b(mode, n)) << "mode " << static_cast<int>(mode) << ", " << n;
    }
  }
}

TEST_F(Fixture, AnAuthBlockGoesBetweenHeaderAndPayloadOnBothPaths) {
  wire::AuthBlock block;
  block.counter.set(0x0102030405060708ull);
  for (int i = 0; i < 16; ++i) block.tag[i] = static_cast<unsigned char>(0xa0 + i);
  h.flags = wire::flags::kAuth;
  const FrameTemplate t = make_frame_template(a, Route{b.mac, b.ip, b.udp_port});
  for (auto mode : {ChecksumMode::kSoftware, ChecksumMode::kNone}) {
    std::vector<std::byte> f(kFrameOverhead + wire::kAuthSize + payload.size());
    ASSERT_EQ(build_data_frame(f, t, h, payload, mode, &block), f.size());
    ParsedFrame p;
    parse_frame(f, b, RxChecks{true, mode == ChecksumMode::kSoftware}, p);
    ASSERT_EQ(p.kind, FrameKind::kMercury) << drop_reason_name(p.drop);
    EXPECT_EQ(p.header.payload_len, payload.size());  // the block is not payload
    ASSERT_NE(p.auth, nullptr);
    EXPECT_EQ(p.auth->counter.get(), 0x0102030405060708ull);
    EXPECT_EQ(std::memcmp(p.auth->tag, block.tag, 16), 0);
    EXPECT_EQ(p.wire_header, f.data() + FrameTemplate::kSize);
    ASSERT_EQ(p.payload.size(), payload.size());
    EXPECT_EQ(std::memcmp(p.payload.data(), payload.data(), payload.size()), 0);
    // The by-reference path: headers and block in one segment, the payload after.
    std::vector<std::byte> headers(kFrameOverhead + wire::kAuthSize);
    ASSERT_EQ(build_data_headers(headers, t, h, payload, mode, &block),
              kFrameOverhead + wire::kAuthSize);
    headers.insert(headers.end(), payload.begin(), payload.end());
    EXPECT_EQ(headers, f);
  }
  // Without its block, a packet flagged kAuth does not add up.
  h.flags = wire::flags::kAuth;
  auto f = frame_to_b(ChecksumMode::kSoftware, 100);
  ParsedFrame p;
  parse_frame(f, b, RxChecks{}, p);
  EXPECT_EQ(p.kind, FrameKind::kDrop);
  EXPECT_EQ(p.reject, wire::Reject::kPayloadMismatch);
}

TEST_F(Fixture, ShortFramesArePaddedAndStillParse) {
  h.dtype = wire::Dtype::kBytes;
  auto f = frame_to_b(ChecksumMode::kSoftware, 0);
  EXPECT_EQ(f.size(), kFrameOverhead);  // 98 > 60: no padding needed
  h.type = wire::PacketType::kAck;
  ParsedFrame p;
  parse_frame(f, b, {}, p);
  EXPECT_EQ(p.kind, FrameKind::kMercury);
}

TEST_F(Fixture, EveryBitFlipPastTheEthernetHeaderIsRejected) {
  auto f = frame_to_b(ChecksumMode::kSoftware, 64);
  for (size_t byte = kL2Len; byte < f.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto g = f;
      g[byte] ^= std::byte(1 << bit);
      ParsedFrame p;
      parse_frame(g, b, {}, p);
      EXPECT_EQ(p.kind, FrameKind::kDrop) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST_F(Fixture, EachDropReason) {
  auto base = frame_to_b(ChecksumMode::kSoftware, 64);
  auto expect = [&](std::vector<std::byte> f, DropReason r, RxChecks c = {}) {
    ParsedFrame p;
    parse_frame(f, b, c, p);
    EXPECT_EQ(p.kind, FrameKind::kDrop);
    EXPECT_EQ(p.drop, r) << drop_reason_name(p.drop) << " instead of " << drop_reason_name(r);
  };
  expect(std::vector<std::byte>(base.begin(), base.begin() + 13), DropReason::kFrameTruncated);
  {
    auto f = base;
    f[0] = std::byte{4};
    expect(f, DropReason::kNotOurMac);
  }
  {
    auto f = base;
    f[12] = std::byte{0x86};
    f[13] = std::byte{0xdd};
    expect(f, DropReason::kUnknownEtherType);
  }
  expect(std::vector<std::byte>(base.begin(), base.begin() + 30), DropReason::kIpTruncated);
  {
    auto f = base;
    f[14] = std::byte{0x65};
    expect(f, DropReason::kIpBadHeader);
  }
  {
    auto f = base;
    f[14 + 8] = std::byte{1};  // TTL changed, checksum not updated
    expect(f, DropReason::kIpBadChecksum);
  }
  // The rest need a consistent IP checksum: rebuild it after each change.
  auto fix_ip = [](std::vector<std::byte>& f) {
    f[24] = f[25] = std::byte{0};
    uint16_t c = checksum_of(partial_sum(f.data() + 14, 20));
    std::memcpy(f.data() + 24, &c, 2);
  };
  {
    auto f = base;
    f[14 + 6] = std::byte{0x20};  // more fragments
    fix_ip(f);
    expect(f, DropReason::kIpFragment);
  }
  {
    auto f = base;
    f[14 + 19] = std::byte{9};
    fix_ip(f);
    expect(f, DropReason::kNotOurIp);
  }
  {
    auto f = base;
    f[14 + 9] = std::byte{6};
    fix_ip(f);
    expect(f, DropReason::kNotUdp);
  }
  {
    auto f = base;
    f[34 + 5] = std::byte(std::to_integer<unsigned>(f[34 + 5]) - 1);  // UDP length
    expect(f, DropReason::kUdpBadLength);
  }
  {
    auto f = base;
    f.back() ^= std::byte{0xff};
    expect(f, DropReason::kUdpBadChecksum);
    ParsedFrame p;  // unverified, the flipped payload byte is just data
    parse_frame(f, b, RxChecks{true, false}, p);
    EXPECT_EQ(p.kind, FrameKind::kMercury);
  }
  {
    auto f = frame_to_b(ChecksumMode::kNone, 64);
    expect(f, DropReason::kUdpBadChecksum);  // a checksum is required when verifying
  }
  {
    LocalAddr other = b;
    other.udp_port = 1;
    auto f = base;
    ParsedFrame p;
    parse_frame(f, other, {}, p);
    EXPECT_EQ(p.drop, DropReason::kNotOurPort);
  }
  {
    h.offset = h.msg_len;  // payload past the end of the message
    auto f = frame_to_b(ChecksumMode::kSoftware, 64);
    ParsedFrame p;
    parse_frame(f, b, {}, p);
    EXPECT_EQ(p.drop, DropReason::kMercury);
    EXPECT_EQ(p.reject, wire::Reject::kBadRange);
  }
}

TEST_F(Fixture, ArpRequestAndReply) {
  std::vector<std::byte> f(kMinFrame);
  ASSERT_EQ(build_arp_frame(f, 1, a, MacAddr{}, b.ip), kMinFrame);
  ParsedFrame p;
  parse_frame(f, b, {}, p);
  ASSERT_EQ(p.kind, FrameKind::kArp);
  EXPECT_EQ(p.arp_oper, 1);
  EXPECT_EQ(p.src_ip, a.ip);
  EXPECT_EQ(p.src_mac, a.mac);
  EXPECT_EQ(p.arp_target_ip, b.ip);

  LocalAddr c = b;
  c.ip = 0x0a000009;
  parse_frame(f, c, {}, p);
  EXPECT_EQ(p.drop, DropReason::kArpNotForUs);

  build_arp_frame(f, 2, b, a.mac, a.ip);
  parse_frame(f, a, {}, p);
  ASSERT_EQ(p.kind, FrameKind::kArp);
  EXPECT_EQ(p.arp_oper, 2);
  EXPECT_EQ(p.src_mac, b.mac);

  f[21] = std::byte{7};  // oper 7
  parse_frame(f, a, {}, p);
  EXPECT_EQ(p.drop, DropReason::kArpMalformed);
}

TEST_F(Fixture, EveryTruncationIsDroppedNotRead) {
  auto f = frame_to_b(ChecksumMode::kSoftware, 128);
  for (size_t n = 0; n < f.size(); ++n) {
    // A fresh heap copy of exactly n bytes, so ASan would see an overread.
    std::vector<std::byte> g(f.begin(), f.begin() + static_cast<long>(n));
    ParsedFrame p;
    parse_frame(g, b, {}, p);
    EXPECT_EQ(p.kind, FrameKind::kDrop) << n;
  }
}

TEST(PayloadPerPacket, FollowsMtuInWholeCacheLines) {
  EXPECT_EQ(payload_per_packet(1500), 1408u);
  EXPECT_EQ(payload_per_packet(9000), 8896u);
  EXPECT_EQ(payload_per_packet(576), 448u);
  EXPECT_EQ(payload_per_packet(1500, true), 1344u);
  EXPECT_EQ(payload_per_packet(9000, true), 8832u);
  for (uint32_t mtu = 576; mtu <= kMaxMtu; ++mtu) {
    const uint32_t p = payload_per_packet(mtu);
    ASSERT_EQ(p % 64, 0u) << mtu;
    ASSERT_LE(p + kFrameOverhead - kL2Len, mtu) << mtu;       // it fits
    ASSERT_GT(p + 64 + kFrameOverhead - kL2Len, mtu) << mtu;  // a line more would not
  }
}

}  // namespace
}  // namespace mercury::net
