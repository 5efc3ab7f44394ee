#include "worker/tensor_table.h"

#include <gtest/gtest.h>

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sched/message.h"

namespace mercury::worker {
namespace {

// net::payload_per_packet(1500): lib/net needs DPDK, this suite does not.
constexpr uint32_t kChunkBytes1500 = 1408;

std::string read_model(const std::string& name) {
  std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/" + name + ".txt");
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `fn` and returns the UsageError's message ("" if none was thrown).
template <typename Fn>
std::string usage_error(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

struct TensorTableMisuse : ::testing::Test {
  std::vector<float> a = std::vector<float>(1000);
  std::vector<float> b = std::vector<float>(10);
  TensorTable table;
};

TEST_F(TensorTableMisuse, DeclareReturnsDeclarationOrderAndDefaultsPriorityToIt) {
  EXPECT_EQ(table.declare("a", a), 0u);
  EXPECT_EQ(table.declare("b", b, 7), 1u);
  EXPECT_EQ(table.size(), 2u);
  table.freeze(1, kChunkBytes1500);
  EXPECT_EQ(table.tensor(0).priority, 0);
  EXPECT_EQ(table.tensor(1).priority, 7);
  EXPECT_EQ(table.find("b"), 1u);
  EXPECT_EQ(table.tensor(0).params.data(), a.data());
}

TEST(UsageErrorType, IsALogicError) {
  static_assert(std::is_base_of_v<std::logic_error, UsageError>);
}

TEST_F(TensorTableMisuse, DuplicateNameIsRefused) {
  table.declare("conv1.weight", a);
  EXPECT_EQ(usage_error([&] { table.declare("conv1.weight", b); }),
            "declare: tensor 'conv1.weight' is already declared (id 0)");
}

TEST_F(TensorTableMisuse, EmptyTensorIsRefused) {
  EXPECT_EQ(usage_error([&] { table.declare("bias", std::span<float>()); }),
            "declare: tensor 'bias' has no elements");
}

TEST_F(TensorTableMisuse, EmptyNameIsRefused) {
  EXPECT_EQ(usage_error([&] { table.declare("", a); }), "declare: a tensor needs a non-empty name");
}

TEST_F(TensorTableMisuse, OverlongNameIsRefused) {
  const std::string name(agg::kMaxTensorNameBytes + 1, 'n');
  EXPECT_EQ(usage_error([&] { table.declare(name, a); }),
            "declare: a tensor name of 1025 bytes; at most 1024");
  EXPECT_NO_THROW(table.declare(std::string(agg::kMaxTensorNameBytes, 'n'), a));
}

TEST_F(TensorTableMisuse, OversizedTensorIsRefusedBeforeAnySizeIsComputed) {
  // Only the count is looked at: the span is never read.
  const std::span<float> huge(a.data(), agg::kMaxTensorElements + 1);
  EXPECT_NE(usage_error([&] { table.declare("huge", huge); }).find("elements; at most 2^36"),
            std::string::npos);
}

TEST_F(TensorTableMisuse, NegativePriorityIsRefused) {
  EXPECT_NE(usage_error([&] { table.declare("a", a, -2); }).find("tensor 'a' has priority -2"),
            std::string::npos);
}

TEST_F(TensorTableMisuse, DeclareAfterFreezeIsRefused) {
  table.declare("a", a);
  table.freeze(2, kChunkBytes1500);
  EXPECT_NE(usage_error([&] {
              table.declare("b", b);
            }).find("declare: tensor 'b' declared after freeze()"),
            std::string::npos);
}

TEST_F(TensorTableMisuse, FreezeMisuseIsRefused) {
  EXPECT_EQ(usage_error([&] { table.freeze(2, kChunkBytes1500); }),
            "freeze: no tensor has been declared");
  table.declare("a", a);
  EXPECT_EQ(usage_error([&] { table.freeze(0, kChunkBytes1500); }),
            "freeze: the job needs at least one shard");
  EXPECT_NE(usage_error([&] {
              table.freeze(2, 1415);
            }).find("freeze: chunk_bytes 1415 must be a multiple of 4"),
            std::string::npos);
  table.freeze(2, kChunkBytes1500);
  EXPECT_EQ(usage_error([&] { table.freeze(2, kChunkBytes1500); }),
            "freeze: the tensors are already frozen");
}

TEST_F(TensorTableMisuse, GeometryBeforeFreezeIsRefused) {
  table.declare("a", a);
  EXPECT_EQ(usage_error([&] { (void)table.tensor(0); }),
            "tensor: tensors are not frozen yet (call freeze() first)");
  EXPECT_EQ(usage_error([&] { table.check_push(0, a); }),
            "push: tensors are not frozen yet (call freeze() first)");
}

TEST_F(TensorTableMisuse, UnknownIdIsRefused) {
  table.declare("a", a);
  table.freeze(1, kChunkBytes1500);
  EXPECT_EQ(usage_error([&] { (void)table.tensor(5); }),
            "tensor: unknown tensor id 5 (1 tensors declared)");
  EXPECT_EQ(usage_error([&] { table.check_pull(1, a); }),
            "pull: unknown tensor id 1 (1 tensors declared)");
  EXPECT_EQ(usage_error([&] { (void)table.find("nope"); }),
            "find: no tensor is declared as 'nope'");
}

TEST_F(TensorTableMisuse, WrongSizeSpanIsRefused) {
  table.declare("a", a);
  table.freeze(1, kChunkBytes1500);
  EXPECT_EQ(usage_error([&] { table.check_push(0, b); }),
            "push: tensor 'a' has 1000 elements but the buffer has 10");
  EXPECT_EQ(usage_error([&] { table.check_pull(0, std::span<const float>(a).first(999)); }),
            "pull: tensor 'a' has 1000 elements but the buffer has 999");
  table.check_push(0, a);  // the right size passes
  table.check_pull(0, a);
}

TEST_F(TensorTableMisuse, EveryCallAfterShutdownIsRefused) {
  table.declare("a", a);
  table.freeze(1, kChunkBytes1500);
  table.shutdown();
  const std::string shut = ": the worker has been shut down";
  EXPECT_EQ(usage_error([&] { table.check_push(0, a); }), "push" + shut);
  EXPECT_EQ(usage_error([&] { table.check_pull(0, a); }), "pull" + shut);
  EXPECT_EQ(usage_error([&] { (void)table.tensor(0); }), "tensor" + shut);
  EXPECT_EQ(usage_error([&] { table.declare("b", b); }), "declare" + shut);
  EXPECT_EQ(usage_error([&] { table.freeze(1, 4); }), "freeze" + shut);
  EXPECT_EQ(usage_error([&] { (void)table.placement(); }), "placement" + shut);
}

TEST(TensorLevels, FewPrioritiesKeepTheirRank) {
  const std::vector<int> p = {10, 3, 3, 50, 0};
  EXPECT_EQ(TensorTable::levels_for(p), (std::vector<uint8_t>{2, 1, 1, 3, 0}));
}

TEST(TensorLevels, ManyPrioritiesAreMonotoneAndSpanEveryLevel) {
  std::mt19937 rng(7);
  for (int distinct : {64, 65, 100, 161, 1000}) {
    std::vector<int> p(static_cast<size_t>(distinct));
    for (int i = 0; i < distinct; ++i) p[static_cast<size_t>(i)] = i * 3 + 1;
    std::shuffle(p.begin(), p.end(), rng);
    const std::vector<uint8_t> levels = TensorTable::levels_for(p);
    std::vector<std::pair<int, uint8_t>> by_priority;
    for (size_t i = 0; i < p.size(); ++i) by_priority.emplace_back(p[i], levels[i]);
    std::sort(by_priority.begin(), by_priority.end());
    std::set<uint8_t> used;
    for (size_t i = 0; i < by_priority.size(); ++i) {
      ASSERT_LT(by_priority[i].second, sched::kPriorityLevels);
      if (i > 0) {
        ASSERT_LE(by_priority[i - 1].second, by_priority[i].second) << distinct;
      }
      used.insert(by_priority[i].second);
    }
    EXPECT_EQ(by_priority.front().second, 0) << distinct;
    EXPECT_EQ(by_priority.back().second, sched::kPriorityLevels - 1) << distinct;
    // Even groups: every level is used.
    EXPECT_EQ(used.size(), sched::kPriorityLevels) << distinct;
  }
}

TEST(TensorTableResnet50, GeometryCoversEveryByteOnce) {
  const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(read_model("resnet50"));
  ASSERT_EQ(decls.size(), 161u);
  std::vector<std::vector<float>> buffers;
  TensorTable table;
  for (const agg::TensorDecl& d : decls) {
    buffers.emplace_back(d.elements);
    table.declare(d.name, buffers.back());
  }
  table.freeze(2, kChunkBytes1500);
  EXPECT_EQ(table.tensors(), 161u);
  EXPECT_EQ(table.shards(), 2u);
  EXPECT_EQ(table.chunk_bytes(), kChunkBytes1500);

  // The same placement as any other node computes from the same declarations.
  const agg::Placement other = agg::Placement::compute(table.declarations(), 2);
  EXPECT_EQ(table.fingerprint(), other.fingerprint());

  uint32_t next_key = 0;
  std::set<uint32_t> shards;
  uint8_t last_level = 0;
  for (TensorId id = 0; id < table.tensors(); ++id) {
    const TensorInfo& t = table.tensor(id);
    EXPECT_EQ(t.first_key, next_key);
    EXPECT_GE(t.level, last_level);  // declaration order = forward order
    last_level = t.level;
    uint64_t element = 0;
    uint32_t chunk = 0;
    for (const BlockGeometry& p : table.blocks(id)) {
      EXPECT_EQ(p.key, next_key++);
      EXPECT_EQ(table.tensor_of_key(p.key), id);
      EXPECT_EQ(p.first_element, element);
      EXPECT_EQ(p.first_chunk, chunk);
      EXPECT_EQ(p.chunks, (p.bytes() + kChunkBytes1500 - 1) / kChunkBytes1500);
      EXPECT_EQ(table.placement().at(p.key).shard, p.shard);
      EXPECT_EQ(table.placement().at(p.key).priority, t.level);
      shards.insert(p.shard);
      element += p.elements;
      chunk += p.chunks;
    }
    EXPECT_EQ(element, t.params.size());
    EXPECT_EQ(chunk, t.chunks);
  }
  EXPECT_EQ(next_key, table.placement().blocks().size());
  EXPECT_FALSE(table.tensor_of_key(next_key).has_value());
  EXPECT_EQ(shards.size(), 2u);
  EXPECT_EQ(table.tensor(0).level, 0);
  EXPECT_EQ(table.tensor(160).level, sched::kPriorityLevels - 1);
}

// A tensor's dtype is what its buffer holds and what its geometry counts:
// 2-byte elements take half the bytes, so twice the elements per chunk.
TEST(TensorTableDtypes, HalfPrecisionTensorsAreSizedInTheirElements) {
  std::vector<uint16_t> w(3000);
  std::vector<uint16_t> v(777);
  std::vector<float> u(1000);
  TensorTable table;
  const auto bytes_of = [](std::vector<uint16_t>& x) {
    return std::as_writable_bytes(std::span(x));
  };
  EXPECT_EQ(table.declare("w", wire::Dtype::kBFloat16, bytes_of(w)), 0u);
  EXPECT_EQ(table.declare("v", wire::Dtype::kFloat16, bytes_of(v), 5), 1u);
  EXPECT_EQ(table.declare("u", u), 2u);
  table.freeze(2, kChunkBytes1500, {.max_block_bytes = 4096});

  const TensorInfo& tw = table.tensor(0);
  EXPECT_EQ(tw.dtype, wire::Dtype::kBFloat16);
  EXPECT_EQ(tw.elements, 3000u);
  EXPECT_EQ(tw.buffer.data(), reinterpret_cast<std::byte*>(w.data()));
  EXPECT_EQ(tw.buffer.size(), 6000u);
  EXPECT_TRUE(tw.params.empty());  // not float32
  EXPECT_EQ(table.tensor(1).dtype, wire::Dtype::kFloat16);
  EXPECT_EQ(table.tensor(2).dtype, wire::Dtype::kFloat32);
  EXPECT_EQ(table.tensor(2).params.data(), u.data());
  EXPECT_EQ(table.tensor(2).elements, 1000u);

  // The declarations carry the dtypes, so every node places the same bytes.
  ASSERT_EQ(table.declarations().size(), 3u);
  EXPECT_EQ(table.declarations()[0].dtype, wire::Dtype::kBFloat16);
  EXPECT_EQ(table.declarations()[1].dtype, wire::Dtype::kFloat16);
  EXPECT_EQ(table.declarations()[2].dtype, wire::Dtype::kFloat32);
  EXPECT_EQ(
      table.fingerprint(),
      agg::Placement::compute(table.declarations(), 2, {.max_block_bytes = 4096}).fingerprint());

  for (TensorId id = 0; id < 3; ++id) {
    const TensorInfo& t = table.tensor(id);
    const uint32_t size = wire::element_bytes(t.dtype);
    uint64_t element = 0;
    uint32_t chunks = 0;
    for (const BlockGeometry& p : table.blocks(id)) {
      EXPECT_EQ(p.dtype, t.dtype);
      EXPECT_EQ(p.first_element, element);
      EXPECT_EQ(p.first_byte(), element * size);
      EXPECT_EQ(p.bytes(), p.elements * size);
      EXPECT_LE(p.bytes(), 4096u + 64 * size);  // split at the bytes, on 64-element boundaries
      EXPECT_EQ(p.chunks, (p.bytes() + kChunkBytes1500 - 1) / kChunkBytes1500);
      element += p.elements;
      chunks += p.chunks;
    }
    EXPECT_EQ(element, t.elements);
    EXPECT_EQ(chunks, t.chunks);
  }
  // 6000 bytes of bfloat16 (704 elements a chunk) against 4000 of float32.
  EXPECT_EQ(table.tensor(0).blocks, 2u);
  EXPECT_EQ(table.tensor(2).blocks, 1u);
  EXPECT_EQ(table.tensor(0).chunks, 6u);  // blocks of 2944 and 3056 bytes: 3 chunks each
  EXPECT_EQ(table.tensor(2).chunks, 3u);  // 4000 bytes

  // A buffer of the tensor's dtype and size passes; any other is refused,
  // naming both dtypes: nothing converts on the worker.
  table.check_push(0, wire::Dtype::kBFloat16, 3000);
  table.check_pull(1, wire::Dtype::kFloat16, 777);
  table.check_push(2, u);
  EXPECT_EQ(usage_error([&] { table.check_push(0, std::span<const float>(u)); }),
            "push: tensor 'w' is bfloat16 but the buffer is float32");
  EXPECT_EQ(usage_error([&] { table.check_pull(1, wire::Dtype::kBFloat16, 777); }),
            "pull: tensor 'v' is float16 but the buffer is bfloat16");
  EXPECT_EQ(usage_error([&] { table.check_pull(2, wire::Dtype::kFloat16, 1000); }),
            "pull: tensor 'u' is float32 but the buffer is float16");
  EXPECT_EQ(usage_error([&] { table.check_push(0, wire::Dtype::kBFloat16, 2999); }),
            "push: tensor 'w' has 3000 elements but the buffer has 2999");
}

TEST_F(TensorTableMisuse, BadDtypesAndBuffersAreRefused) {
  std::vector<std::byte> odd(7);
  EXPECT_EQ(usage_error([&] { table.declare("h", wire::Dtype::kBFloat16, odd); }),
            "declare: tensor 'h' is bfloat16 but its buffer has 7 bytes, not a whole number of "
            "2-byte elements");
  EXPECT_EQ(
      usage_error([&] { table.declare("f", wire::Dtype::kFloat32, std::span(odd).first(6)); }),
      "declare: tensor 'f' is float32 but its buffer has 6 bytes, not a whole number of "
      "4-byte elements");
  EXPECT_EQ(usage_error([&] { table.declare("b", wire::Dtype::kBytes, odd); }),
            "declare: tensor 'b' has dtype bytes; a tensor is float32, bfloat16 or float16");
  EXPECT_EQ(usage_error([&] { table.declare("e", wire::Dtype::kFloat16, {}); }),
            "declare: tensor 'e' has no elements");
  std::vector<std::byte> two(8);
  EXPECT_EQ(usage_error([&] {
              table.declare("r", wire::Dtype::kBFloat16, two, -1, agg::UpdateRule::kOptimizerRank0);
            }),
            "declare: tensor 'r' is bfloat16; the update rule optimizer on rank 0's push takes "
            "float32 tensors only");
  EXPECT_EQ(table.size(), 0u);
  // A float32 tensor declared through the byte form is the same as through
  // the float one.
  EXPECT_EQ(table.declare("a", wire::Dtype::kFloat32, std::as_writable_bytes(std::span(a))), 0u);
  table.freeze(1, kChunkBytes1500);
  EXPECT_EQ(table.tensor(0).params.data(), a.data());
  EXPECT_EQ(table.tensor(0).params.size(), a.size());
}

// Many trainer threads declare at once, then read and misuse the frozen
// table at once: every tensor gets one id, the default priority is the id,
// and the readers answer (or throw) consistently without locks.
std::string name_of(int i) {
  std::string name = std::to_string(i);
  name.insert(0, 1, 't');  // not "t" + ...: GCC 12 warns falsely (-Wrestrict) on that
  return name;
}

TEST(TensorTableConcurrency, ManyThreadsDeclareThenReadAtOnce) {
  constexpr int kTensors = 512;
  std::vector<std::vector<float>> buffers(kTensors);
  for (int i = 0; i < kTensors; ++i) buffers[static_cast<size_t>(i)].resize(1 + i % 300);
  TensorTable table;
  std::vector<TensorId> ids(kTensors);
  tbb::parallel_for(0, kTensors, [&](int i) {
    ids[static_cast<size_t>(i)] = table.declare(name_of(i), buffers[static_cast<size_t>(i)]);
  });
  std::vector<TensorId> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < kTensors; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], TensorId(i));
  table.freeze(3, kChunkBytes1500);
  std::atomic<int> refused{0};
  tbb::parallel_for(0, kTensors * 8, [&](int j) {
    const int i = j % kTensors;
    const TensorId id = ids[static_cast<size_t>(i)];
    const TensorInfo& t = table.tensor(id);
    EXPECT_EQ(t.priority, static_cast<int>(id));
    EXPECT_EQ(t.params.data(), buffers[static_cast<size_t>(i)].data());
    EXPECT_EQ(table.find(name_of(i)), id);
    table.check_push(id, buffers[static_cast<size_t>(i)]);
    try {
      table.check_pull(id, std::span<const float>(buffers[static_cast<size_t>(i)]).first(0));
    } catch (const UsageError&) {
      refused.fetch_add(1, std::memory_order_relaxed);
    }
  });
  EXPECT_EQ(refused.load(), kTensors * 8);
}

}  // namespace
}  // namespace mercury::worker
