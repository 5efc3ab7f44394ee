#include "worker/pull_tracker.h"

#include "wire/header.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace mercury::worker {
namespace {

constexpr uint32_t kChunkBytes1500 = 1408;  // net::payload_per_packet(1500)

std::string read_model(const std::string& name) {
  std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/" + name + ".txt");
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value element `i` of block `key` carries at `version`: distinct
// per (key, element, version), so a misplaced or stale chunk shows.
float value_of(uint32_t key, uint64_t i, uint32_t version) {
  return static_cast<float>(key) * 1e5f + static_cast<float>(i % 100000) +
         static_cast<float>(version) * 0.25f;
}

// One aggregated chunk as the server would send it.
struct Chunk {
  uint32_t key;
  uint32_t offset;
  uint32_t version;
  TensorId tensor;
  std::vector<std::byte> payload;
};

Chunk make_chunk(const BlockGeometry& p, TensorId tensor, uint32_t index, uint32_t version,
                 uint32_t chunk_bytes) {
  const uint32_t offset = index * chunk_bytes;
  const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes, p.bytes() - offset));
  std::vector<float> values(bytes / 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = value_of(p.key, offset / 4 + i, version);
  Chunk c{p.key, offset, version, tensor, std::vector<std::byte>(bytes)};
  std::memcpy(c.payload.data(), values.data(), bytes);
  return c;
}

struct Model {
  std::vector<std::vector<float>> buffers;
  TensorTable table;

  Model(const std::vector<agg::TensorDecl>& decls, uint32_t shards, uint32_t chunk_bytes) {
    buffers.reserve(decls.size());
    for (const agg::TensorDecl& d : decls) {
      buffers.emplace_back(d.elements, -1.0f);
      table.declare(d.name, buffers.back());
    }
    table.freeze(shards, chunk_bytes);
  }

  // Every chunk of every tensor at `version`.
  std::vector<Chunk> all_chunks(uint32_t version) const {
    std::vector<Chunk> out;
    for (TensorId id = 0; id < table.tensors(); ++id) {
      for (const BlockGeometry& p : table.blocks(id)) {
        for (uint32_t j = 0; j < p.chunks; ++j) {
          out.push_back(make_chunk(p, id, j, version, table.chunk_bytes()));
        }
      }
    }
    return out;
  }

  // Does tensor `id`'s buffer hold exactly the values of `version`?
  bool holds(TensorId id, uint32_t version) const {
    for (const BlockGeometry& p : table.blocks(id)) {
      for (uint64_t i = 0; i < p.elements; ++i) {
        if (buffers[id][p.first_element + i] != value_of(p.key, i, version)) return false;
      }
    }
    return true;
  }
};

std::vector<agg::TensorDecl> resnet50() { return agg::parse_model_shapes(read_model("resnet50")); }

// The whole receive path over the real ResNet-50 shapes: two shards, MTU
// 1500; every chunk of a version in a random order, with duplicates and
// stale chunks mixed in. Each tensor's version completes (awaited_st moves
// on) exactly when its last chunk lands, and the buffers then hold the bytes
// fed, never a stale one.
TEST(PullTrackerResnet50, EveryVersionCompletesExactlyWhenItsLastChunkLands) {
  Model m(resnet50(), 2, kChunkBytes1500);
  ASSERT_EQ(m.table.tensors(), 161u);
  PullTracker tracker(m.table, {.window = 2, .first_version = 7});
  const uint64_t memory = tracker.memory_bytes();
  std::mt19937 rng(2024);
  uint64_t total_duplicates = 0;
  uint64_t total_stales = 0;

  for (uint32_t version = 7; version < 9; ++version) {
    std::vector<Chunk> feed = m.all_chunks(version);
    const size_t distinct = feed.size();
    // 5% duplicates, and stale chunks of the previous version (carrying
    // that version's values, which must never land).
    std::uniform_int_distribution<size_t> pick(0, distinct - 1);
    for (size_t i = 0; i < distinct / 20; ++i) feed.push_back(feed[pick(rng)]);
    const size_t stale = 50;
    for (size_t i = 0; i < stale; ++i) {
      const Chunk& c = feed[pick(rng)];
      const BlockGeometry& p = m.table.blocks(c.tensor)[c.key - m.table.tensor(c.tensor).first_key];
      feed.push_back(
          make_chunk(p, c.tensor, c.offset / kChunkBytes1500, version - 1, kChunkBytes1500));
    }
    std::shuffle(feed.begin(), feed.end(), rng);

    std::vector<uint32_t> seen_chunks(m.table.tensors(), 0);
    std::vector<std::vector<bool>> seen(m.table.tensors());
    for (TensorId id = 0; id < m.table.tensors(); ++id)
      seen[id].assign(m.table.tensor(id).chunks, false);
    uint64_t duplicates = 0;
    uint64_t stales = 0;
    for (const Chunk& c : feed) {
      const TensorInfo& t = m.table.tensor(c.tensor);
      const BlockGeometry& p = m.table.blocks(c.tensor)[c.key - t.first_key];
      const uint32_t chunk = p.first_chunk + c.offset / kChunkBytes1500;
      const bool complete_before = seen_chunks[c.tensor] == t.chunks;
      const ChunkVerdict v = tracker.deliver_st(c.key, c.offset, c.version, c.payload);
      if (c.version != version || complete_before) {
        // An older version, or a late duplicate of a version already complete.
        ASSERT_EQ(v, ChunkVerdict::kStale);
        ++stales;
      } else if (seen[c.tensor][chunk]) {
        ASSERT_EQ(v, ChunkVerdict::kDuplicate);
        ++duplicates;
      } else {
        ASSERT_EQ(v, ChunkVerdict::kPlaced);
        seen[c.tensor][chunk] = true;
        ++seen_chunks[c.tensor];
      }
      const bool complete = seen_chunks[c.tensor] == t.chunks;
      // The version moves on exactly at the last distinct chunk, with the
      // tensor's bytes all in place.
      ASSERT_EQ(tracker.awaited_st(c.tensor), complete ? version + 1 : version) << t.name;
      if (complete && !complete_before) {
        ASSERT_TRUE(m.holds(c.tensor, version)) << t.name;
      }
    }
    for (TensorId id = 0; id < m.table.tensors(); ++id) {
      EXPECT_EQ(tracker.awaited_st(id), version + 1);
      EXPECT_TRUE(m.holds(id, version)) << m.table.tensor(id).name;
    }
    EXPECT_GT(duplicates, 0u);
    EXPECT_GE(stales, stale);
    EXPECT_EQ(duplicates + stales, distinct / 20 + stale);
    total_duplicates += duplicates;
    total_stales += stales;
  }
  const PullCounters& c = tracker.counters_st();
  const uint64_t per_version = m.all_chunks(0).size();
  EXPECT_EQ(c.count(ChunkVerdict::kPlaced), 2 * per_version);
  EXPECT_EQ(c.count(ChunkVerdict::kStale), total_stales);
  EXPECT_EQ(c.count(ChunkVerdict::kDuplicate), total_duplicates);
  EXPECT_EQ(c.bytes_placed,
            2 * m.table.placement().shard_bytes(0) + 2 * m.table.placement().shard_bytes(1));
  EXPECT_EQ(c.versions_completed, 2u * 161);
  // Memory is fixed at construction, whatever the traffic.
  EXPECT_EQ(tracker.memory_bytes(), memory);
}

// Half-precision tensors beside float32 ones, ResNet-50's shapes: every
// chunk of a version (2-byte elements for bfloat16 and float16, a chunk
// carrying 704 of them at MTU 1500) lands at its element's byte in the
// trainer's buffer, each tensor completes with its last chunk, and a chunk
// cut for float32 is refused by its length.
TEST(PullTrackerDtypes, TwoByteElementsArePlacedAtTheirElements) {
  std::vector<agg::TensorDecl> decls = resnet50();
  const wire::Dtype cycle[] = {wire::Dtype::kBFloat16, wire::Dtype::kFloat16,
                               wire::Dtype::kFloat32};
  std::vector<std::vector<std::byte>> buffers;
  buffers.reserve(decls.size());
  TensorTable table;
  for (size_t t = 0; t < decls.size(); ++t) {
    const wire::Dtype d = cycle[t % 3];
    buffers.emplace_back(decls[t].elements * wire::element_bytes(d), std::byte{0xee});
    table.declare(decls[t].name, d, buffers.back());
  }
  table.freeze(2, kChunkBytes1500);
  PullTracker tracker(table, {.window = 2, .first_version = 3});
  // Element e of block `key` at version v: a 16- or 32-bit pattern from
  // (key, e, v), so a misplaced byte shows.
  auto pattern = [](uint32_t key, uint64_t e, uint32_t v) {
    return static_cast<uint32_t>((key * 2654435761u) ^ (e * 40503u) ^ (v << 28));
  };
  std::mt19937 rng(9);
  for (uint32_t version = 3; version < 5; ++version) {
    struct Feed {
      uint32_t key, offset;
      std::vector<std::byte> payload;
    };
    std::vector<Feed> feed;
    for (TensorId id = 0; id < table.tensors(); ++id) {
      for (const BlockGeometry& p : table.blocks(id)) {
        const uint32_t size = wire::element_bytes(p.dtype);
        for (uint32_t j = 0; j < p.chunks; ++j) {
          const uint32_t offset = j * kChunkBytes1500;
          const auto bytes =
              static_cast<uint32_t>(std::min<uint64_t>(kChunkBytes1500, p.bytes() - offset));
          Feed f{p.key, offset, std::vector<std::byte>(bytes)};
          for (uint32_t e = 0; e < bytes / size; ++e) {
            const uint32_t v = pattern(p.key, offset / size + e, version);
            std::memcpy(f.payload.data() + e * size, &v, size);
          }
          feed.push_back(std::move(f));
        }
      }
    }
    std::shuffle(feed.begin(), feed.end(), rng);
    for (const Feed& f : feed) {
      const TensorId id = *table.tensor_of_key(f.key);
      if (table.tensor(id).dtype != wire::Dtype::kFloat32 && f.payload.size() * 2 <= 65532 &&
          f.payload.size() == kChunkBytes1500) {
        // The float32 length of the same chunk (twice the bytes) is not it.
        std::vector<std::byte> twice(2 * f.payload.size());
        EXPECT_EQ(tracker.deliver_st(f.key, f.offset, version, twice), ChunkVerdict::kBadLength);
      }
      ASSERT_EQ(tracker.deliver_st(f.key, f.offset, version, f.payload), ChunkVerdict::kPlaced);
    }
    for (TensorId id = 0; id < table.tensors(); ++id) {
      const TensorInfo& t = table.tensor(id);
      ASSERT_EQ(tracker.awaited_st(id), version + 1) << t.name;
      const uint32_t size = wire::element_bytes(t.dtype);
      for (const BlockGeometry& p : table.blocks(id)) {
        for (uint64_t e = 0; e < p.elements; ++e) {
          uint32_t got = 0;
          std::memcpy(&got, t.buffer.data() + p.first_byte() + e * size, size);
          const uint32_t want = pattern(p.key, e, version) & (size == 2 ? 0xffffu : 0xffffffffu);
          ASSERT_EQ(got, want) << t.name << " element " << p.first_element + e;
        }
      }
    }
  }
  const PullCounters& c = tracker.counters_st();
  EXPECT_EQ(c.bytes_placed,
            2 * (table.placement().shard_bytes(0) + table.placement().shard_bytes(1)));
  EXPECT_GT(c.count(ChunkVerdict::kBadLength), 0u);
  EXPECT_EQ(c.versions_completed, 2u * 161);
}

struct PullTrackerSmall : ::testing::Test {
  // Two tensors on two shards with a tiny chunk, so that blocks have
  // several chunks and the last one is short: a = 1000 floats (4000 B),
  // b = 10 floats (40 B).
  std::vector<float> a = std::vector<float>(1000, 0.0f);
  std::vector<float> b = std::vector<float>(10, 0.0f);
  TensorTable table;
  static constexpr uint32_t kChunk = 256;

  void SetUp() override {
    table.declare("a", a);
    table.declare("b", b);
    table.freeze(2, kChunk, {.max_block_bytes = 2048});
  }
  const BlockGeometry& block(TensorId id, uint32_t i) { return table.blocks(id)[i]; }
  Chunk chunk(TensorId id, uint32_t b, uint32_t index, uint32_t version) {
    return make_chunk(block(id, b), id, index, version, kChunk);
  }
};

TEST_F(PullTrackerSmall, BadChunksAreCountedByReasonAndTouchNothing) {
  PullTracker tracker(table);
  const std::vector<float> before = a;
  std::vector<std::byte> payload(kChunk);
  const uint32_t keys = static_cast<uint32_t>(table.placement().blocks().size());
  EXPECT_EQ(tracker.deliver_st(keys, 0, 0, payload), ChunkVerdict::kUnknownKey);
  EXPECT_EQ(tracker.deliver_st(0, 4, 0, payload), ChunkVerdict::kBadOffset);
  EXPECT_EQ(tracker.deliver_st(0, 1 << 20, 0, payload), ChunkVerdict::kBadOffset);
  EXPECT_EQ(tracker.deliver_st(0, 0, 0, std::span(payload).first(100)), ChunkVerdict::kBadLength);
  EXPECT_EQ(a, before);
  const PullCounters& c = tracker.counters_st();
  EXPECT_EQ(c.count(ChunkVerdict::kUnknownKey), 1u);
  EXPECT_EQ(c.count(ChunkVerdict::kBadOffset), 2u);
  EXPECT_EQ(c.count(ChunkVerdict::kBadLength), 1u);
  EXPECT_EQ(tracker.arrived_st(0, 0), 0u);
}

TEST_F(PullTrackerSmall, DestinationIsTheTrainerBufferOrEmptyForABadChunk) {
  PullTracker tracker(table);
  const BlockGeometry& p = block(0, 1);
  std::span<std::byte> d = tracker.destination_st(p.key, kChunk, kChunk);
  EXPECT_EQ(d.data(), reinterpret_cast<std::byte*>(a.data() + p.first_element) + kChunk);
  EXPECT_EQ(d.size(), kChunk);
  // The last chunk of the block is short.
  const uint32_t last = (p.chunks - 1) * kChunk;
  EXPECT_EQ(tracker.destination_st(p.key, last, static_cast<uint32_t>(p.bytes()) - last).size(),
            p.bytes() - last);
  EXPECT_TRUE(tracker.destination_st(p.key, last, kChunk).empty());
  EXPECT_TRUE(tracker.destination_st(p.key, 3, kChunk).empty());
  EXPECT_TRUE(tracker.destination_st(9999, 0, kChunk).empty());
  const PullCounters& c = tracker.counters_st();
  EXPECT_EQ(c.destination_refused[static_cast<size_t>(ChunkVerdict::kBadLength)], 1u);
  EXPECT_EQ(c.destination_refused[static_cast<size_t>(ChunkVerdict::kBadOffset)], 1u);
  EXPECT_EQ(c.destination_refused[static_cast<size_t>(ChunkVerdict::kUnknownKey)], 1u);
}

TEST_F(PullTrackerSmall, VersionsPastTheWindowAreTooNew) {
  PullTracker tracker(table, {.window = 2});
  const Chunk c = chunk(1, 0, 0, 2);
  EXPECT_EQ(tracker.deliver_st(c.key, c.offset, c.version, c.payload), ChunkVerdict::kTooNew);
  EXPECT_EQ(b, std::vector<float>(10, 0.0f));
  const Chunk ok = chunk(1, 0, 0, 1);
  EXPECT_EQ(tracker.deliver_st(ok.key, ok.offset, ok.version, ok.payload), ChunkVerdict::kPlaced);
  EXPECT_EQ(tracker.arrived_st(1, 1), 1u);
  EXPECT_EQ(tracker.awaited_st(1), 0u);  // version 0 is still awaited
}

TEST_F(PullTrackerSmall, AnOlderVersionNeverOverwritesANewerOne) {
  PullTracker tracker(table, {.window = 2});
  const Chunk newer = chunk(1, 0, 0, 1);
  const Chunk older = chunk(1, 0, 0, 0);
  EXPECT_EQ(tracker.deliver_st(newer.key, newer.offset, 1, newer.payload), ChunkVerdict::kPlaced);
  EXPECT_EQ(tracker.awaited_st(1), 0u);
  EXPECT_EQ(tracker.deliver_st(older.key, older.offset, 0, older.payload), ChunkVerdict::kOutrun);
  // b is one chunk: version 0 is complete (recorded), its bytes are version
  // 1's, and version 1 completed with it, since its only chunk was in.
  EXPECT_EQ(b[3], value_of(newer.key, 3, 1));
  EXPECT_EQ(tracker.awaited_st(1), 2u);
  EXPECT_EQ(tracker.counters_st().versions_completed, 2u);
}

TEST_F(PullTrackerSmall, VersionsBeforeTheFirstAreStale) {
  PullTracker tracker(table, {.window = 2, .first_version = 5});
  EXPECT_EQ(tracker.awaited_st(0), 5u);
  const Chunk old = chunk(1, 0, 0, 4);
  EXPECT_EQ(tracker.deliver_st(old.key, old.offset, old.version, old.payload),
            ChunkVerdict::kStale);
  EXPECT_EQ(b, std::vector<float>(10, 0.0f));
  const Chunk next = chunk(1, 0, 0, 6);
  EXPECT_EQ(tracker.deliver_st(next.key, next.offset, next.version, next.payload),
            ChunkVerdict::kPlaced);
  EXPECT_EQ(tracker.arrived_st(1, 6), 1u);
  EXPECT_EQ(tracker.awaited_st(1), 5u);  // version 5 is still awaited
}

TEST_F(PullTrackerSmall, WindowOfOneCompletesVersionsInTurn) {
  PullTracker tracker(table, {.window = 1});
  for (uint32_t version = 0; version < 3; ++version) {
    const Chunk c = chunk(1, 0, 0, version);
    EXPECT_EQ(tracker.deliver_st(c.key, c.offset, version, c.payload), ChunkVerdict::kPlaced);
    EXPECT_EQ(tracker.awaited_st(1), version + 1);
    EXPECT_EQ(b[9], value_of(c.key, 9, version));
    const Chunk ahead = chunk(1, 0, 0, version + 2);
    EXPECT_EQ(tracker.deliver_st(ahead.key, ahead.offset, ahead.version, ahead.payload),
              ChunkVerdict::kTooNew);
  }
}

TEST_F(PullTrackerSmall, TrackerNeedsAFrozenTableAndASaneWindow) {
  TensorTable unfrozen;
  std::vector<float> x(4);
  unfrozen.declare("x", x);
  EXPECT_THROW(PullTracker{unfrozen}, UsageError);
  EXPECT_THROW(PushTracker{unfrozen}, UsageError);
  EXPECT_THROW(PullTracker(table, {.window = 0}), UsageError);
  EXPECT_THROW(PullTracker(table, {.window = 65}), UsageError);
}

TEST_F(PullTrackerSmall, TrackersKeepWorkingAfterTheTrainerShutsDown) {
  // The net core drains after shutdown; it must never throw.
  PullTracker pulls(table);
  PushTracker pushes(table);
  Handle q;
  pushes.start_st(1, q);
  const uint32_t key = block(1, 0).key;
  const Chunk c = chunk(1, 0, 0, 0);
  table.shutdown();
  EXPECT_EQ(pulls.deliver_st(c.key, c.offset, 0, c.payload), ChunkVerdict::kPlaced);
  EXPECT_EQ(pulls.awaited_st(1), 1u);
  pushes.settled_st(key, true);
  EXPECT_TRUE(q.ok());
}

TEST_F(PullTrackerSmall, PushCompletesWhenEveryBlockIsSettled) {
  PushTracker tracker(table);
  const auto blocks = table.blocks(0);
  ASSERT_GT(blocks.size(), 1u);
  Handle h;
  EXPECT_EQ(tracker.start_st(0, h), StartResult::kStarted);
  Handle second;
  EXPECT_EQ(tracker.start_st(0, second), StartResult::kBusy);
  EXPECT_FALSE(second.ready());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_FALSE(h.ready());
    tracker.settled_st(blocks[i].key, true);
  }
  EXPECT_TRUE(h.ok());
  EXPECT_EQ(tracker.in_flight_st(), 0u);
  tracker.settled_st(blocks[0].key, true);  // nothing in flight
  EXPECT_EQ(tracker.counters_st().unexpected, 1u);
  EXPECT_EQ(tracker.counters_st().pushes_completed, 1u);
}

TEST_F(PullTrackerSmall, PushFailsWithTheFirstErrorOnceAllAreSettled) {
  PushTracker tracker(table);
  const auto blocks = table.blocks(0);
  Handle h;
  tracker.start_st(0, h);
  tracker.settled_st(blocks[0].key, false, "peer s0 (10.0.0.2:47100) restarted");
  EXPECT_FALSE(h.ready());  // the other blocks still use the gradient buffer
  for (size_t i = 1; i < blocks.size(); ++i) tracker.settled_st(blocks[i].key, false, "later");
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(h.error(), "peer s0 (10.0.0.2:47100) restarted");
  EXPECT_EQ(tracker.counters_st().pushes_failed, 1u);
  // A new push can start.
  Handle next;
  EXPECT_EQ(tracker.start_st(0, next), StartResult::kStarted);
}

// The asynchronous bookkeeping (ASP, SSP, PS+), chunk by chunk over the real
// ResNet-50 shapes: versions arrive per chunk in any order, an older one
// never overwrites a newer one, the tensor's least version and least slowest
// clock move exactly when their last laggard moves, and every packet tagged
// as answering this worker's push is counted once.
TEST(PullTrackerAsync, LeastVersionSlowestClockAndAnswersPerTensor) {
  Model m(resnet50(), 2, kChunkBytes1500);
  PullTracker tracker(m.table, {.window = 2, .first_version = 0, .async = true});
  std::mt19937 rng(13);
  const TensorId big = 159;  // fc.weight: 2048000 elements, many chunks
  ASSERT_GT(m.table.tensor(big).chunks, 1000u);
  for (TensorId id = 0; id < m.table.tensors(); ++id) EXPECT_EQ(tracker.awaited_st(id), 0u);
  // Version 0 of everything, shuffled: each tensor is in (awaited 1) once its
  // last chunk lands.
  std::vector<Chunk> feed = m.all_chunks(0);
  std::shuffle(feed.begin(), feed.end(), rng);
  std::vector<uint32_t> left(m.table.tensors());
  for (TensorId id = 0; id < m.table.tensors(); ++id) left[id] = m.table.tensor(id).chunks;
  for (const Chunk& c : feed) {
    EXPECT_EQ(tracker.awaited_st(c.tensor), 0u);
    EXPECT_EQ(tracker.deliver_async_st(c.key, c.offset, 0, 0, c.payload), ChunkVerdict::kPlaced);
    EXPECT_EQ(tracker.awaited_st(c.tensor), --left[c.tensor] == 0 ? 1u : 0u);
  }
  EXPECT_EQ(tracker.counters_st().versions_completed, m.table.tensors());
  EXPECT_EQ(tracker.least_version_st(big), 0u);

  // Every chunk of the big tensor gets 1..3 newer versions, in a random
  // order with older ones after newer ones; half the packets answer this
  // worker, and each carries a slowest clock equal to its version.
  std::vector<Chunk> all = m.all_chunks(0);
  std::vector<Chunk> updates;
  std::vector<uint32_t> top;
  uint64_t answers = 0;
  std::vector<bool> yours;
  for (const Chunk& c : all) {
    if (c.tensor != big) continue;
    const BlockGeometry& p = m.table.blocks(big)[c.key - m.table.tensor(big).first_key];
    const uint32_t n = 1 + rng() % 3;
    for (uint32_t v = 1; v <= n; ++v) {
      updates.push_back(make_chunk(p, big, c.offset / kChunkBytes1500, v, kChunkBytes1500));
    }
    top.push_back(n);
  }
  std::shuffle(updates.begin(), updates.end(), rng);
  uint32_t placed = 0, outrun = 0;
  for (const Chunk& c : updates) {
    const bool mine = rng() % 2 == 0;
    answers += mine ? 1 : 0;
    const uint32_t tag = c.version | (mine ? wire::kAggYours : 0);
    const ChunkVerdict v = tracker.deliver_async_st(c.key, c.offset, c.version, tag, c.payload);
    placed += v == ChunkVerdict::kPlaced;
    outrun += v == ChunkVerdict::kOutrun;
  }
  EXPECT_EQ(placed + outrun, updates.size());
  EXPECT_GT(outrun, 0u);
  EXPECT_EQ(tracker.answers_st(big), answers);
  const uint32_t least = *std::min_element(top.begin(), top.end());
  EXPECT_EQ(tracker.least_version_st(big), least);
  EXPECT_EQ(tracker.least_slowest_st(big), least);
  // The buffer holds each chunk's newest version, whatever the arrival order.
  size_t chunk = 0;
  for (const BlockGeometry& p : m.table.blocks(big)) {
    for (uint32_t j = 0; j < p.chunks; ++j, ++chunk) {
      const uint64_t first = uint64_t{j} * kChunkBytes1500 / 4;
      EXPECT_EQ(m.buffers[big][p.first_element + first], value_of(p.key, first, top[chunk]));
    }
  }
  // Other tensors did not move; a bad chunk is refused, not counted.
  EXPECT_EQ(tracker.least_version_st(0), 0u);
  EXPECT_EQ(tracker.answers_st(0), 0u);
  std::vector<std::byte> junk(100);
  EXPECT_EQ(tracker.deliver_async_st(0, 7, 9, wire::kAggYours, junk), ChunkVerdict::kBadOffset);
  EXPECT_EQ(tracker.answers_st(0), 0u);
}

}  // namespace
}  // namespace mercury::worker
