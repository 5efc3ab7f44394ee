// PullTracker::deliver_st over every chunk of one ResNet-50 version (2 shards,
// MTU 1500 chunks, arrival order shuffled), beside its limit measured in the
// same run: the same copies of the same payloads to the same destinations in
// the same order, with deliver_st's rule (net::stream_copy into tensors of
// net::kStreamDestinationBytes or more, memcpy into the others), and a plain
// memcpy of every chunk. The gap to the limit is the tracker's own cost
// (lookups, bitmap, window checks, completing 161 versions). GB/s of payload
// placed, CPU time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "net/stream_copy.h"
#include "worker/pull_tracker.h"

namespace mercury::worker {
namespace {

constexpr uint32_t kChunkBytes1500 = 1408;  // net::payload_per_packet(1500)

struct Arrival {
  uint32_t key;
  uint32_t offset;
  uint32_t bytes;
  const std::byte* payload;
  std::byte* destination;
  bool stream;  // deliver_st writes this tensor with non-temporal stores
};

struct Setup {
  std::vector<std::vector<float>> buffers;
  TensorTable table;
  std::vector<std::byte> payloads;  // one version's chunks, back to back
  std::vector<Arrival> arrivals;    // shuffled

  Setup() {
    std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/resnet50.txt");
    std::stringstream s;
    s << in.rdbuf();
    const auto decls = agg::parse_model_shapes(s.str());
    buffers.reserve(decls.size());
    for (const auto& d : decls) {
      buffers.emplace_back(d.elements);
      table.declare(d.name, buffers.back());
    }
    table.freeze(2, kChunkBytes1500);
    uint64_t total = 0;
    for (TensorId id = 0; id < table.tensors(); ++id) total += table.tensor(id).params.size_bytes();
    payloads.resize(total);
    for (size_t i = 0; i < payloads.size(); ++i) payloads[i] = std::byte(i * 131 % 251);
    uint64_t at = 0;
    for (TensorId id = 0; id < table.tensors(); ++id) {
      auto* base = reinterpret_cast<std::byte*>(table.tensor(id).params.data());
      uint64_t chunks = 0;
      for (const BlockGeometry& p : table.blocks(id)) chunks += p.chunks;
      const bool stream = net::streams_into(chunks * kChunkBytes1500);
      for (const BlockGeometry& p : table.blocks(id)) {
        for (uint32_t j = 0; j < p.chunks; ++j) {
          const uint32_t offset = j * kChunkBytes1500;
          const auto bytes =
              static_cast<uint32_t>(std::min<uint64_t>(kChunkBytes1500, p.bytes() - offset));
          arrivals.push_back({p.key, offset, bytes, payloads.data() + at,
                              base + p.first_element * 4 + offset, stream});
          at += bytes;
        }
      }
    }
    std::mt19937 rng(1);
    std::shuffle(arrivals.begin(), arrivals.end(), rng);
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

void BM_limit_memcpy(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) {
    for (const Arrival& a : s.arrivals) std::memcpy(a.destination, a.payload, a.bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.payloads.size()));
}

void BM_limit(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) {
    for (const Arrival& a : s.arrivals) {
      if (a.stream) {
        net::stream_copy(a.destination, a.payload, a.bytes);
      } else {
        std::memcpy(a.destination, a.payload, a.bytes);
      }
    }
    net::stream_fence();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.payloads.size()));
}

void BM_deliver(benchmark::State& state) {
  Setup& s = setup();
  PullTracker tracker(s.table, {.window = 1});
  uint32_t version = 0;
  for (auto _ : state) {
    for (const Arrival& a : s.arrivals) {
      benchmark::DoNotOptimize(tracker.deliver_st(a.key, a.offset, version, {a.payload, a.bytes}));
    }
    ++version;
  }
  for (TensorId id = 0; id < s.table.tensors(); ++id) {
    if (tracker.awaited_st(id) != version) state.SkipWithError("a version did not complete");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.payloads.size()));
  state.counters["tracker_bytes"] = static_cast<double>(tracker.memory_bytes());
  state.counters["tracker_bytes_window2"] =
      static_cast<double>(PullTracker(s.table, {.window = 2}).memory_bytes());
  state.counters["chunks"] = static_cast<double>(s.arrivals.size());
  state.counters["ns_per_chunk"] = benchmark::Counter(
      static_cast<double>(s.arrivals.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_limit)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_limit_memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_deliver)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mercury::worker

BENCHMARK_MAIN();
