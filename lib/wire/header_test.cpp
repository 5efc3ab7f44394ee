#include "wire/header.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <vector>

namespace mercury::wire {
namespace {

HeaderFields sample() {
  HeaderFields f;
  f.type = PacketType::kData;
  f.flags = flags::kAckValid | flags::kRetransmit;
  f.job_id = 0x01020304;
  f.sender_id = 0x0506;
  f.priority = 7;
  f.dtype = Dtype::kFloat32;
  f.block_key = 0x0a0b0c0d;
  f.msg_id = 42;
  f.msg_len = 4096;
  f.offset = 1024;
  f.iteration = 99;
  f.param_version = 98;
  f.seq = 0xfffffff0;
  f.ack = 0x11223344;
  f.payload_len = 8;
  f.epoch = 0x90a1b2c3;  // above 2^31: no sign or width is lost on the way
  f.sack = 0x8000000000000001ull;
  f.credit = 0x0708;
  return f;
}

std::vector<std::byte> packet_of(const HeaderFields& f) {
  std::vector<std::byte> p(kHeaderSize + f.payload_len);
  encode(f, std::span<std::byte, kHeaderSize>(p.data(), kHeaderSize));
  return p;
}

TEST(WireHeader, RoundTripsEveryField) {
  const HeaderFields f = sample();
  auto p = packet_of(f);
  HeaderFields g;
  ASSERT_EQ(decode(p, g), Reject::kNone);
  EXPECT_EQ(f, g);
}

TEST(WireHeader, FieldsAreBigEndianAtDocumentedOffsets) {
  auto p = packet_of(sample());
  auto byte = [&](size_t i) { return std::to_integer<unsigned>(p[i]); };
  EXPECT_EQ(byte(0), kVersion);
  EXPECT_EQ(byte(1), 1u);  // kData
  EXPECT_EQ(byte(2), 0u);
  EXPECT_EQ(byte(3), 3u);  // kAckValid | kRetransmit
  EXPECT_EQ(byte(4), 0x01u);
  EXPECT_EQ(byte(7), 0x04u);
  EXPECT_EQ(byte(8), 0x05u);
  EXPECT_EQ(byte(9), 0x06u);
  EXPECT_EQ(byte(10), 7u);
  EXPECT_EQ(byte(11), 1u);
  EXPECT_EQ(byte(12), 0x0au);
  EXPECT_EQ(byte(15), 0x0du);
  EXPECT_EQ(byte(36), 0xffu);
  EXPECT_EQ(byte(39), 0xf0u);
  EXPECT_EQ(byte(44), 0u);
  EXPECT_EQ(byte(45), 8u);
  EXPECT_EQ(byte(46), 0x07u);  // credit
  EXPECT_EQ(byte(47), 0x08u);
  EXPECT_EQ(byte(48), 0x80u);
  EXPECT_EQ(byte(55), 0x01u);
  EXPECT_EQ(byte(56), 0x90u);  // epoch, all 32 bits
  EXPECT_EQ(byte(57), 0xa1u);
  EXPECT_EQ(byte(58), 0xb2u);
  EXPECT_EQ(byte(59), 0xc3u);
  for (size_t i = 60; i < kHeaderSize; ++i) EXPECT_EQ(byte(i), 0u) << i;  // reserved
}

TEST(WireHeader, ReservedFieldsAreIgnoredOnReceipt) {
  auto p = packet_of(sample());
  for (size_t i = 60; i < kHeaderSize; ++i) p[i] = std::byte{0xa5};
  HeaderFields g;
  ASSERT_EQ(decode(p, g), Reject::kNone);
  EXPECT_EQ(g, sample());
}

TEST(WireHeader, RejectsEachBrokenRule) {
  HeaderFields out;
  {
    auto p = packet_of(sample());
    EXPECT_EQ(decode(std::span(p).first(kHeaderSize - 1), out), Reject::kTruncated);
  }
  // 5: the previous wire version (float32 the only tensor dtype), 4: a 16-bit
  // epoch at 46, 3: no authentication block, 2: a 56-byte header.
  for (uint8_t v : {0, 2, 3, 4, 5, 7}) {
    auto p = packet_of(sample());
    p[0] = std::byte{v};
    EXPECT_EQ(decode(p, out), Reject::kBadVersion) << int{v};
  }
  for (uint8_t t : {0, 7, 255}) {
    auto p = packet_of(sample());
    p[1] = std::byte{t};
    EXPECT_EQ(decode(p, out), Reject::kBadType) << int{t};
  }
  {
    auto p = packet_of(sample());
    p[2] = std::byte{0x80};
    EXPECT_EQ(decode(p, out), Reject::kBadFlags);
  }
  {
    // Bit 7, the first reserved bit above kAuth, is refused...
    auto p = packet_of(sample());
    p[3] = std::byte{0x80};
    EXPECT_EQ(decode(p, out), Reject::kBadFlags);
    // ... and kSlice (bit 3) is known: the slice's offset and msg_len are
    // range-checked like any message's.
    p[3] = std::byte{0x08};
    ASSERT_EQ(decode(p, out), Reject::kNone);
    EXPECT_EQ(out.flags, flags::kSlice);
  }
  for (uint8_t d : {4, 9, 255}) {  // 4: the first value past float16
    auto p = packet_of(sample());
    p[11] = std::byte{d};
    EXPECT_EQ(decode(p, out), Reject::kBadDtype) << int{d};
  }
  {
    auto p = packet_of(sample());
    p.push_back(std::byte{0});
    EXPECT_EQ(decode(p, out), Reject::kPayloadMismatch);
  }
  {
    HeaderFields f = sample();
    f.type = PacketType::kAck;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kAckWithPayload);
    f.payload_len = 0;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kNone);
  }
  {
    // A partition start-up carries nothing; without payload it is valid.
    HeaderFields f = sample();
    f.type = PacketType::kPartitionStart;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kStartWithPayload);
    f.payload_len = 0;
    f.msg_len = 0;
    f.offset = 0;
    ASSERT_EQ(decode(packet_of(f), out), Reject::kNone);
    EXPECT_EQ(out.type, PacketType::kPartitionStart);
    // Its offset and msg_len are range-checked like any non-ACK packet's.
    f.offset = 4;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kBadRange);
  }
  {
    HeaderFields f = sample();
    f.offset = f.msg_len - 4;  // 8 bytes from 4 before the end
    EXPECT_EQ(decode(packet_of(f), out), Reject::kBadRange);
    f.offset = 0xfffffffc;  // would wrap in 32 bits
    EXPECT_EQ(decode(packet_of(f), out), Reject::kBadRange);
  }
  {
    HeaderFields f = sample();
    f.offset = 2;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kBadAlignment);
    f.dtype = Dtype::kBytes;
    EXPECT_EQ(decode(packet_of(f), out), Reject::kNone);
  }
}

// Each dtype's elements must not straddle packets: offset, payload_len and
// msg_len are multiples of its element size (4, 2, 2; bytes: any).
TEST(WireHeader, AlignmentFollowsTheDtypesElementSize) {
  HeaderFields out;
  struct Case {
    Dtype dtype;
    uint32_t size;
  };
  for (const Case c : {Case{Dtype::kBytes, 1}, Case{Dtype::kFloat32, 4}, Case{Dtype::kBFloat16, 2},
                       Case{Dtype::kFloat16, 2}}) {
    for (uint32_t shift = 1; shift < 4; ++shift) {
      const bool aligned = shift % c.size == 0;
      const Reject want = aligned ? Reject::kNone : Reject::kBadAlignment;
      HeaderFields f = sample();
      f.dtype = c.dtype;
      f.offset = 1024 + shift;
      EXPECT_EQ(decode(packet_of(f), out), want) << dtype_name(c.dtype) << " offset +" << shift;
      f = sample();
      f.dtype = c.dtype;
      f.payload_len = static_cast<uint16_t>(8 + shift);
      EXPECT_EQ(decode(packet_of(f), out), want) << dtype_name(c.dtype) << " payload +" << shift;
      f = sample();
      f.dtype = c.dtype;
      f.msg_len = 4096 + shift;
      EXPECT_EQ(decode(packet_of(f), out), want) << dtype_name(c.dtype) << " msg_len +" << shift;
    }
    // An ACK carries no elements: its offset is a probe's token, never checked.
    HeaderFields ack = sample();
    ack.type = PacketType::kAck;
    ack.dtype = c.dtype;
    ack.payload_len = 0;
    ack.offset = 3;
    EXPECT_EQ(decode(packet_of(ack), out), Reject::kNone) << dtype_name(c.dtype);
  }
}

TEST(WireHeader, EveryDtypeRoundTripsAtOffset11) {
  for (const Dtype d : {Dtype::kBytes, Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16}) {
    HeaderFields f = sample();
    f.dtype = d;
    const auto p = packet_of(f);
    EXPECT_EQ(std::to_integer<unsigned>(p[11]), static_cast<unsigned>(d));
    HeaderFields g;
    ASSERT_EQ(decode(p, g), Reject::kNone) << dtype_name(d);
    EXPECT_EQ(g, f);
  }
  static_assert(element_bytes(Dtype::kBFloat16) == 2 && element_bytes(Dtype::kFloat16) == 2);
  static_assert(element_bytes(Dtype::kFloat32) == 4 && element_bytes(Dtype::kBytes) == 1);
  static_assert(!is_tensor_dtype(Dtype::kBytes) && is_tensor_dtype(Dtype::kBFloat16));
  EXPECT_EQ(dtype_name(Dtype::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(Dtype::kFloat16), "float16");
  EXPECT_EQ(dtype_name(static_cast<Dtype>(kDtypeCount)), "?");
}

TEST(WireHeader, WordSumMatchesTheEncodedBytes) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    HeaderFields f = sample();
    f.job_id = static_cast<uint32_t>(rng());
    f.seq = static_cast<uint32_t>(rng());
    f.epoch = static_cast<uint32_t>(rng());
    f.sack = rng();
    f.priority = static_cast<uint8_t>(rng());
    f.payload_len = static_cast<uint16_t>(rng());
    Header h;
    encode(f, h);
    const auto* b = reinterpret_cast<const uint8_t*>(&h);
    uint64_t want = 0;
    for (size_t k = 0; k < kHeaderSize; k += 2) want += (uint64_t{b[k]} << 8) | b[k + 1];
    EXPECT_EQ(header_word_sum(f), want);
  }
}

#if defined(__AVX512BW__)
// The send path's vector encode writes what encode() writes, with payload_len
// replaced, and returns the sum of the written bytes as native 16-bit words.
TEST(WireHeader, EncodeSummedMatchesEncodeAndItsBytes) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    HeaderFields f;
    f.type = static_cast<PacketType>(1 + rng() % 6);
    f.flags = static_cast<uint16_t>(rng());
    f.job_id = static_cast<uint32_t>(rng());
    f.sender_id = static_cast<uint16_t>(rng());
    f.priority = static_cast<uint8_t>(rng());
    f.dtype = static_cast<Dtype>(rng() % kDtypeCount);
    f.block_key = static_cast<uint32_t>(rng());
    f.msg_id = static_cast<uint32_t>(rng());
    f.msg_len = static_cast<uint32_t>(rng());
    f.offset = static_cast<uint32_t>(rng());
    f.iteration = static_cast<uint32_t>(rng());
    f.param_version = static_cast<uint32_t>(rng());
    f.seq = static_cast<uint32_t>(rng());
    f.ack = static_cast<uint32_t>(rng());
    f.payload_len = static_cast<uint16_t>(rng());
    f.epoch = static_cast<uint32_t>(rng());
    f.sack = rng();
    f.credit = static_cast<uint16_t>(rng());
    const auto payload_len = static_cast<uint16_t>(rng());
    HeaderFields g = f;
    g.payload_len = payload_len;
    Header want;
    encode(g, want);
    // Bytes after the header must survive: the store is exactly the header.
    std::array<uint8_t, kHeaderSize + 16> buf;
    buf.fill(0x5a);
    const uint64_t sum = encode_summed(f, payload_len, *reinterpret_cast<Header*>(buf.data()));
    ASSERT_EQ(std::memcmp(buf.data(), &want, kHeaderSize), 0) << i;
    for (size_t k = kHeaderSize; k < buf.size(); ++k) ASSERT_EQ(buf[k], 0x5a) << k;
    uint64_t native = 0;
    for (size_t k = 0; k < kHeaderSize; k += 2) {
      uint16_t w;
      std::memcpy(&w, buf.data() + k, 2);
      native += w;
    }
    ASSERT_EQ(sum, native) << i;
  }
}
#endif

TEST(WireHeader, EveryRejectHasADistinctName) {
  std::vector<std::string_view> names;
  for (size_t i = 0; i < kRejectCount; ++i) {
    auto n = reject_name(static_cast<Reject>(i));
    EXPECT_NE(n, "unknown");
    for (auto m : names) EXPECT_NE(n, m);
    names.push_back(n);
  }
}

TEST(WireHeader, RandomBytesNeverReadOutOfBounds) {
  std::mt19937_64 rng(7);
  HeaderFields out;
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> p(rng() % 128);
    for (auto& b : p) b = std::byte(rng());
    if (p.size() >= 2) {  // bias towards plausible headers
      p[0] = std::byte{kVersion};
      p[1] = std::byte(1 + rng() % 6);
    }
    if (decode(p, out) == Reject::kNone) {
      ++accepted;
      EXPECT_EQ(out.payload_len + kHeaderSize, p.size());
    }
  }
  EXPECT_LT(accepted, 20000u);
}

}  // namespace
}  // namespace mercury::wire
