#include "agg/control.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace mercury::agg {
namespace {

std::vector<TensorDecl> sample() {
  return {{"conv1.weight", 9408, 0},
          {"fc.bias", 1000, 161, wire::Dtype::kBFloat16},
          {"", 1, 255, wire::Dtype::kFloat16}};
}

TEST(Control, EveryKindRoundTrips) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.rank = 3;
  d.tensors = sample();
  const ControlMessage d2 = decode_control(encode_control(d));
  EXPECT_EQ(d2.kind, ControlKind::kDeclare);
  EXPECT_EQ(d2.rank, 3u);
  EXPECT_EQ(first_difference(d2.tensors, d.tensors), "");
  ASSERT_EQ(d2.tensors.size(), 3u);
  EXPECT_EQ(d2.tensors[0].dtype, wire::Dtype::kFloat32);
  EXPECT_EQ(d2.tensors[1].dtype, wire::Dtype::kBFloat16);
  EXPECT_EQ(d2.tensors[2].dtype, wire::Dtype::kFloat16);

  ControlMessage r;
  r.kind = ControlKind::kReady;
  r.fingerprint = 0x0123456789abcdefull;
  r.shards = 7;
  const ControlMessage r2 = decode_control(encode_control(r));
  EXPECT_EQ(r2.kind, ControlKind::kReady);
  EXPECT_EQ(r2.fingerprint, r.fingerprint);
  EXPECT_EQ(r2.shards, 7u);

  ControlMessage x;
  x.kind = ControlKind::kRefused;
  x.text = "rank 2 declares something else";
  EXPECT_EQ(decode_control(encode_control(x)).text, x.text);

  ControlMessage b;
  b.kind = ControlKind::kBarrier;
  b.rank = 1;
  b.generation = uint64_t{1} << 40;
  const ControlMessage b2 = decode_control(encode_control(b));
  EXPECT_EQ(b2.kind, ControlKind::kBarrier);
  EXPECT_EQ(b2.rank, 1u);
  EXPECT_EQ(b2.generation, b.generation);

  ControlMessage bd;
  bd.kind = ControlKind::kBarrierDone;
  bd.generation = 9;
  EXPECT_EQ(decode_control(encode_control(bd)).generation, 9u);

  ControlMessage hb;
  hb.kind = ControlKind::kHeartbeat;
  const std::vector<std::byte> hb_bytes = encode_control(hb);
  EXPECT_EQ(hb_bytes.size(), 6u);  // magic, version, kind: nothing else
  EXPECT_EQ(decode_control(hb_bytes).kind, ControlKind::kHeartbeat);
  std::vector<std::byte> hb_longer = hb_bytes;
  hb_longer.push_back(std::byte{0});
  EXPECT_THROW(decode_control(hb_longer), std::invalid_argument);

  ControlMessage leave;
  leave.kind = ControlKind::kLeave;
  leave.rank = 3;
  const std::vector<std::byte> leave_bytes = encode_control(leave);
  EXPECT_EQ(leave_bytes.size(), 10u);  // magic, version, kind, rank
  const ControlMessage leave2 = decode_control(leave_bytes);
  EXPECT_EQ(leave2.kind, ControlKind::kLeave);
  EXPECT_EQ(leave2.rank, 3u);
  EXPECT_THROW(decode_control(std::span(leave_bytes).first(9)), std::invalid_argument);
}

TEST(Control, EveryTruncationIsRefused) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.tensors = sample();
  const std::vector<std::byte> bytes = encode_control(d);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(decode_control(std::span(bytes).first(n)), std::invalid_argument) << n;
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW(decode_control(longer), std::invalid_argument);
}

TEST(Control, BadHeaderFieldsAreRefused) {
  ControlMessage b;
  b.kind = ControlKind::kBarrierDone;
  const std::vector<std::byte> good = encode_control(b);
  for (size_t i : {0, 3, 4, 5}) {  // magic, version, kind
    std::vector<std::byte> bad = good;
    bad[i] = std::byte{0x7f};
    EXPECT_THROW(decode_control(bad), std::invalid_argument) << i;
  }
}

TEST(Control, AHugeTensorCountDoesNotAllocate) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  std::vector<std::byte> bytes = encode_control(d);
  for (size_t i = 10; i < 14; ++i) bytes[i] = std::byte{0xff};  // count = 2^32 - 1
  EXPECT_THROW(decode_control(bytes), std::invalid_argument);
}

TEST(Control, ZeroElementTensorIsRefused) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.tensors = {{"empty", 1, 0}};
  std::vector<std::byte> bytes = encode_control(d);
  bytes[21] = std::byte{0};  // the low byte of elements (header 6 + rank 4 + count 4 + 7)
  EXPECT_THROW(decode_control(bytes), std::invalid_argument);
}

// A tensor's dtype (the byte after its priority) must be a tensor dtype:
// bytes (0) and anything past float16 are refused, naming the tensor.
TEST(Control, ADtypeThatIsNotATensorDtypeIsRefused) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.tensors = {{"w", 1, 0, wire::Dtype::kFloat16}};
  std::vector<std::byte> bytes = encode_control(d);
  constexpr size_t kDtypeAt = 6 + 4 + 4 + 8 + 1;  // header, rank, count, elements, priority
  ASSERT_EQ(bytes[kDtypeAt], std::byte{3});
  for (uint8_t bad : {0, 4, 255}) {
    bytes[kDtypeAt] = std::byte{bad};
    try {
      decode_control(bytes);
      ADD_FAILURE() << "dtype " << int{bad} << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'w' has dtype " + std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Control, OversizedTensorsAndNamesAreRefused) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.tensors = {{"big", kMaxTensorElements, 0}};
  EXPECT_NO_THROW(decode_control(encode_control(d)));
  d.tensors = {{"big", kMaxTensorElements + 1, 0}};
  EXPECT_THROW(decode_control(encode_control(d)), std::invalid_argument);
  d.tensors = {{"max", UINT64_MAX, 0}};
  EXPECT_THROW(decode_control(encode_control(d)), std::invalid_argument);
  d.tensors = {{std::string(kMaxTensorNameBytes, 'n'), 1, 0}};
  EXPECT_NO_THROW(decode_control(encode_control(d)));
  d.tensors = {{std::string(kMaxTensorNameBytes + 1, 'n'), 1, 0}};
  EXPECT_THROW(encode_control(d), std::invalid_argument);
}

TEST(Control, FirstDifferenceNamesTheTensor) {
  std::vector<TensorDecl> a = sample();
  std::vector<TensorDecl> b = sample();
  EXPECT_EQ(first_difference(a, b), "");
  b[1].elements = 999;
  const std::string why = first_difference(a, b);
  EXPECT_NE(why.find("tensor 1"), std::string::npos) << why;
  EXPECT_NE(why.find("fc.bias"), std::string::npos) << why;
  EXPECT_NE(why.find("999"), std::string::npos) << why;
  b = sample();
  b[0].dtype = wire::Dtype::kBFloat16;
  const std::string dtype_why = first_difference(a, b);
  EXPECT_NE(dtype_why.find("'conv1.weight' (9408 elements, priority 0) on one side and "
                           "'conv1.weight' (9408 bfloat16 elements, priority 0)"),
            std::string::npos)
      << dtype_why;
  b = sample();
  b.pop_back();
  EXPECT_NE(first_difference(a, b).find("3 tensors"), std::string::npos);
}

}  // namespace
}  // namespace mercury::agg
