#include "agg/control.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace mercury::agg {
namespace {

std::vector<TensorDecl> sample() {
  return {{"conv1.weight", 9408, 0},
          {"fc.bias", 1000, 161, wire::Dtype::kBFloat16},
          {"", 1, 255, wire::Dtype::kFloat16},
          {"bn.running_mean", 64, 2, wire::Dtype::kFloat32, UpdateRule::kRank0},
          {"bn.running_var", 64, 2, wire::Dtype::kFloat32, UpdateRule::kAverage}};
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
  ASSERT_EQ(d2.tensors.size(), 5u);
  EXPECT_EQ(d2.tensors[0].dtype, wire::Dtype::kFloat32);
  EXPECT_EQ(d2.tensors[1].dtype, wire::Dtype::kBFloat16);
  EXPECT_EQ(d2.tensors[2].dtype, wire::Dtype::kFloat16);
  EXPECT_EQ(d2.tensors[3].update, UpdateRule::kRank0);
  EXPECT_FALSE(d2.seeded);
  d.seeded = true;
  d.version = 88;
  const ControlMessage d3 = decode_control(encode_control(d));
  EXPECT_TRUE(d3.seeded);
  EXPECT_EQ(d3.version, 88u);

  ControlMessage r;
  r.kind = ControlKind::kReady;
  r.fingerprint = 0x0123456789abcdefull;
  r.shards = 7;
  r.version = 12;
  const ControlMessage r2 = decode_control(encode_control(r));
  EXPECT_EQ(r2.kind, ControlKind::kReady);
  EXPECT_EQ(r2.fingerprint, r.fingerprint);
  EXPECT_EQ(r2.shards, 7u);
  EXPECT_EQ(r2.version, 12u);

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

  ControlMessage gone;
  gone.kind = ControlKind::kWorkerGone;
  gone.rank = 2;
  gone.lost = true;
  gone.text = "worker w2 (rank 2) was lost";
  const std::vector<std::byte> gone_bytes = encode_control(gone);
  const ControlMessage gone2 = decode_control(gone_bytes);
  EXPECT_EQ(gone2.kind, ControlKind::kWorkerGone);
  EXPECT_EQ(gone2.rank, 2u);
  EXPECT_TRUE(gone2.lost);
  EXPECT_EQ(gone2.text, gone.text);
  gone.lost = false;
  EXPECT_FALSE(decode_control(encode_control(gone)).lost);
  EXPECT_THROW(decode_control(std::span(gone_bytes).first(gone_bytes.size() - 1)),
               std::invalid_argument);

  ControlMessage promoted;
  promoted.kind = ControlKind::kPromoted;
  promoted.version = 41;
  promoted.text = "standby s0b took over from s0";
  const std::vector<std::byte> promoted_bytes = encode_control(promoted);
  const ControlMessage promoted2 = decode_control(promoted_bytes);
  EXPECT_EQ(promoted2.kind, ControlKind::kPromoted);
  EXPECT_EQ(promoted2.version, 41u);
  EXPECT_EQ(promoted2.text, promoted.text);
  EXPECT_THROW(decode_control(std::span(promoted_bytes).first(promoted_bytes.size() - 1)),
               std::invalid_argument);
}

TEST(Control, RollbackRoundTrips) {
  ControlMessage rollback;
  rollback.kind = ControlKind::kRollback;
  rollback.rank = 3;
  rollback.version = 40;
  const std::vector<std::byte> bytes = encode_control(rollback);
  EXPECT_EQ(bytes.size(), 14u);       // magic, version, kind, rank, version
  EXPECT_EQ(bytes[4], std::byte{6});  // the control version (5 the spares'; 6 kPromotionRefused)
  const ControlMessage r2 = decode_control(bytes);
  EXPECT_EQ(r2.kind, ControlKind::kRollback);
  EXPECT_EQ(r2.rank, 3u);
  EXPECT_EQ(r2.version, 40u);
  EXPECT_THROW(decode_control(std::span(bytes).first(bytes.size() - 1)), std::invalid_argument);
  // A build that speaks version 3 is told which version this is.
  std::vector<std::byte> older = bytes;
  older[4] = std::byte{3};
  EXPECT_THROW(decode_control(older), std::invalid_argument);
  // Nor is a build of version 5, which has no kPromotionRefused.
  older[4] = std::byte{5};
  EXPECT_THROW(decode_control(older), std::invalid_argument);
}

TEST(Control, StandbyPartitionMessagesRoundTrip) {
  ControlMessage refused;
  refused.kind = ControlKind::kPromotionRefused;
  refused.rank = 1;
  refused.text = "s0 still answers this worker";
  const std::vector<std::byte> bytes = encode_control(refused);
  EXPECT_EQ(bytes.size(), 4 + 1 + 1 + 4 + 4 + refused.text.size());  // magic .. rank, text
  EXPECT_EQ(bytes[5], std::byte{31});
  const ControlMessage r2 = decode_control(bytes);
  EXPECT_EQ(r2.kind, ControlKind::kPromotionRefused);
  EXPECT_EQ(r2.rank, 1u);
  EXPECT_EQ(r2.text, refused.text);
  EXPECT_THROW(decode_control(std::span(bytes).first(bytes.size() - 1)), std::invalid_argument);
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW(decode_control(longer), std::invalid_argument);  // trailing bytes

  ControlMessage lost;
  lost.kind = ControlKind::kStandbyLost;
  lost.text = "s0 named its standby s0b lost";
  const std::vector<std::byte> lost_bytes = encode_control(lost);
  EXPECT_EQ(lost_bytes.size(), 4 + 1 + 1 + 4 + lost.text.size());  // magic .. text
  EXPECT_EQ(lost_bytes[5], std::byte{32});
  const ControlMessage lost2 = decode_control(lost_bytes);
  EXPECT_EQ(lost2.kind, ControlKind::kStandbyLost);
  EXPECT_EQ(lost2.text, lost.text);
  EXPECT_THROW(decode_control(std::span(lost_bytes).first(lost_bytes.size() - 1)),
               std::invalid_argument);
}

TEST(Control, JoiningRoundTrips) {
  ControlMessage joined;
  joined.kind = ControlKind::kJoined;
  joined.fingerprint = 0x0123456789abcdefull;
  joined.shards = 6;
  joined.version = 12;
  joined.generation = 0x100000007ull;
  joined.rank = 2;
  const std::vector<std::byte> bytes = encode_control(joined);
  // magic, version, kind, fingerprint, shards, version, generation, rank
  EXPECT_EQ(bytes.size(), 34u);
  const ControlMessage j2 = decode_control(bytes);
  EXPECT_EQ(j2.kind, ControlKind::kJoined);
  EXPECT_EQ(j2.fingerprint, joined.fingerprint);
  EXPECT_EQ(j2.shards, 6u);
  EXPECT_EQ(j2.version, 12u);
  EXPECT_EQ(j2.generation, joined.generation);
  EXPECT_EQ(j2.rank, 2u);
  EXPECT_THROW(decode_control(std::span(bytes).first(33)), std::invalid_argument);

  ControlMessage released;
  released.kind = ControlKind::kReleased;
  released.text = "the job is finished: spare w4 was not needed";
  const std::vector<std::byte> released_bytes = encode_control(released);
  const ControlMessage r2 = decode_control(released_bytes);
  EXPECT_EQ(r2.kind, ControlKind::kReleased);
  EXPECT_EQ(r2.text, released.text);
  EXPECT_THROW(decode_control(std::span(released_bytes).first(released_bytes.size() - 1)),
               std::invalid_argument);

  ControlMessage told;
  told.kind = ControlKind::kWorkerJoined;
  told.rank = 3;
  told.text = "worker w3 (rank 3) joined the job";
  const std::vector<std::byte> told_bytes = encode_control(told);
  const ControlMessage t2 = decode_control(told_bytes);
  EXPECT_EQ(t2.kind, ControlKind::kWorkerJoined);
  EXPECT_EQ(t2.rank, 3u);
  EXPECT_EQ(t2.text, told.text);
  std::vector<std::byte> longer = told_bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW(decode_control(longer), std::invalid_argument);
}

TEST(Control, SettingsAndStateRoundTrip) {
  ControlMessage s;
  s.kind = ControlKind::kSettings;
  s.sequence = 5;
  s.version = 41;
  s.values = {.learning_rate = 0.125f,
              .momentum = 0.875f,
              .weight_decay = 1e-4f,
              .beta1 = 0.5f,
              .beta2 = 0.25f,
              .epsilon = 1e-6f};
  const std::vector<std::byte> s_bytes = encode_control(s);
  EXPECT_EQ(s_bytes.size(), 6u + 8 + 4 + 6 * 4);
  const ControlMessage s2 = decode_control(s_bytes);
  EXPECT_EQ(s2.kind, ControlKind::kSettings);
  EXPECT_EQ(s2.sequence, 5u);
  EXPECT_EQ(s2.version, 41u);
  EXPECT_EQ(s2.values, s.values);

  for (ControlKind k : {ControlKind::kSettingsDone, ControlKind::kStateSeeded}) {
    ControlMessage d;
    d.kind = k;
    d.sequence = 9;
    d.text = "shard 3: too late";
    const ControlMessage d2 = decode_control(encode_control(d));
    EXPECT_EQ(d2.kind, k);
    EXPECT_EQ(d2.sequence, 9u);
    EXPECT_EQ(d2.text, d.text);
  }

  ControlMessage pull;
  pull.kind = ControlKind::kStatePull;
  pull.sequence = 2;
  pull.cursor = uint64_t{3} << 32 | 17;
  const ControlMessage pull2 = decode_control(encode_control(pull));
  EXPECT_EQ(pull2.sequence, 2u);
  EXPECT_EQ(pull2.cursor, pull.cursor);

  for (ControlKind k : {ControlKind::kStatePage, ControlKind::kStateSeed}) {
    ControlMessage p;
    p.kind = k;
    p.sequence = 4;
    p.cursor = k == ControlKind::kStatePage ? 99 : 0;
    p.last = true;
    if (k == ControlKind::kStatePage) p.text = "no";
    p.bytes = {std::byte{1}, std::byte{2}, std::byte{0xff}};
    const std::vector<std::byte> bytes = encode_control(p);
    const ControlMessage p2 = decode_control(bytes);
    EXPECT_EQ(p2.kind, k);
    EXPECT_EQ(p2.cursor, p.cursor);
    EXPECT_TRUE(p2.last);
    EXPECT_EQ(p2.bytes, p.bytes);
    EXPECT_EQ(p2.text, p.text);
    for (size_t n = 0; n < bytes.size(); ++n) {
      EXPECT_THROW(decode_control(std::span(bytes).first(n)), std::invalid_argument) << n;
    }
    // `last` is 0 or 1: any other byte would be a second encoding.
    std::vector<std::byte> odd = bytes;
    odd[k == ControlKind::kStatePage ? 22 : 14] = std::byte{2};
    EXPECT_THROW(decode_control(odd), std::invalid_argument);
  }
}

TEST(Control, AnUnknownUpdateRuleIsRefused) {
  ControlMessage d;
  d.kind = ControlKind::kDeclare;
  d.tensors = {{"t", 1, 0}};
  std::vector<std::byte> bytes = encode_control(d);
  bytes[24] =
      std::byte{kUpdateRules};  // header 6 + rank 4 + count 4 + elements 8 + priority, dtype
  EXPECT_THROW(decode_control(bytes), std::invalid_argument);
  bytes[24] = std::byte{2};
  EXPECT_EQ(decode_control(bytes).tensors[0].update, UpdateRule::kRank0);
  bytes[24] = std::byte{3};
  EXPECT_EQ(decode_control(bytes).tensors[0].update, UpdateRule::kOptimizerRank0);
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
  EXPECT_NE(first_difference(a, b).find("5 tensors"), std::string::npos);
  b = sample();
  b[4].update = UpdateRule::kOptimizer;
  const std::string rule = first_difference(a, b);
  EXPECT_NE(rule.find("update average"), std::string::npos) << rule;
}

}  // namespace
}  // namespace mercury::agg
