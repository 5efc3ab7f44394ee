// Helpers shared by the chunk table's tests (chunk_table_test.cpp: bookkeeping;
// chunk_table_update_test.cpp: what the updates are): a recording sink, a small
// model, shard configs and per-(chunk, rank) gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "agg/chunk_table.h"

namespace mercury::agg::test {

inline constexpr uint32_t kChunkBytes = 1408;  // net::payload_per_packet(1500)
inline constexpr uint32_t kChunkElems = kChunkBytes / 4;

// Records what the table hands out. A token may come back more than once
// only where a test hands the same buffer in twice (ASP, later iterations).
class RecordingSink final : public ChunkSink {
 public:
  struct Seen {
    Update u;
    std::vector<float> values;
  };
  void on_update(const Update& u) override {
    Seen s{u, std::vector<float>(u.bytes / 4)};
    std::memcpy(s.values.data(), u.data, u.bytes);
    s.u.data = nullptr;
    updates.push_back(std::move(s));
  }
  void release(void* const* tokens, uint32_t count) override {
    for (uint32_t i = 0; i < count; ++i) released.insert(tokens[i]);
  }
  std::vector<Seen> updates;
  std::multiset<void*> released;
};

// Three tensors over two shards; the test works on shard 0 (or one shard).
inline std::vector<TensorDecl> small_model() {
  return {{"conv", 1000, 0}, {"fc", 5000, 1}, {"bias", 77, 2}};
}

inline ShardConfig config(uint32_t workers, OptimizerKind kind = OptimizerKind::kSgd) {
  return ShardConfig{.shard = 0,
                     .workers = workers,
                     .chunk_bytes = kChunkBytes,
                     .optimizer = {.kind = kind, .learning_rate = 0.1f}};
}

// One chunk's address and size in the table.
struct ChunkRef {
  uint32_t key, offset, elements;
};

inline std::vector<ChunkRef> chunks_of(const Placement& p, uint32_t shard) {
  std::vector<ChunkRef> out;
  for (uint32_t key : p.shard_keys(shard)) {
    const uint64_t n = p.at(key).elements;
    for (uint64_t e = 0; e < n; e += kChunkElems) {
      out.push_back({key, static_cast<uint32_t>(e * 4),
                     static_cast<uint32_t>(std::min<uint64_t>(kChunkElems, n - e))});
    }
  }
  return out;
}

// Gradients whose magnitudes differ by orders, so float addition order shows.
inline std::vector<float> gradient(std::mt19937& rng, uint32_t n, uint32_t rank) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  const float scale = std::pow(10.0f, static_cast<float>(rank % 4) * 2.0f - 3.0f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng) * scale;
  return v;
}

// Contribution data per (chunk, rank): stable storage and a unique token.
struct Grads {
  std::vector<std::vector<std::vector<float>>> g;  // [chunk][rank]
  Grads(std::mt19937& rng, const std::vector<ChunkRef>& chunks, uint32_t workers) {
    for (const ChunkRef& c : chunks) {
      g.emplace_back();
      for (uint32_t r = 0; r < workers; ++r) g.back().push_back(gradient(rng, c.elements, r));
    }
  }
  // The clock defaults to the iteration: a rank that pushes once per version.
  Contribution make(const std::vector<ChunkRef>& chunks, size_t i, uint16_t rank,
                    uint32_t iteration, std::optional<uint32_t> clock = std::nullopt) {
    return Contribution{.key = chunks[i].key,
                        .offset = chunks[i].offset,
                        .iteration = iteration,
                        .rank = rank,
                        .clock = clock.value_or(iteration),
                        .data = reinterpret_cast<const std::byte*>(g[i][rank].data()),
                        .bytes = chunks[i].elements * 4,
                        .token = &g[i][rank]};
  }
};

}  // namespace mercury::agg::test
