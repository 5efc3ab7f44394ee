// Aggregation throughput of one shard core against the memory-bandwidth limit.
//
// Workload: the ResNet-50 tensors (config/models/resnet50.txt, 25.6 M float32,
// 102 MB) all on one shard, cut into 1408-byte chunks (MTU 1500), N = 4
// workers. One benchmark iteration = one BSP iteration: every chunk receives
// its 4 contributions (chunk by chunk, the completing rank rotating) through
// ChunkTable::contribute(), which reduces them in rank order and applies the
// optimizer. Contributions are read from four 102 MB buffers (one per rank,
// on 2 MB pages like DPDK mbufs), far larger than the caches.
//
// Limit ("limit_sum"): reduce_sum() of the same four buffers into a fifth,
// as one contiguous stream each (the best case for the memory system): the
// rate at which this core can read gradient. Every variant reports GB/s of
// gradient consumed (4 x 102 MB per iteration), in CPU time (on a shared
// 2-core machine the wall clock also counts time descheduled).
//
// Variants: sgd, sum_only, momentum, adam (the table, AVX-512 kernel);
// momentum_wd, adam_wd (with torch's L2 weight decay), adamw (the decay
// decoupled), adamw_scheduled (AdamW whose learning rate changes every
// iteration, a versioned setting from that iteration's version, as a
// warm-up or cosine schedule sets it);
// sgd_portable (the table with the intrinsic-free kernel); sgd_jumbo (the
// table with 8896-byte chunks, MTU 9000, over the same bytes); kernel_sgd
// (reduce_apply() chunk by chunk without the table: the table's own cost is
// the gap to sgd). Arg "all" = every chunk (from DRAM); "l2" = the first 180
// chunks (4 x 255 KB, L2-resident: the compute-bound case).
//
// Run (interleaved, repeated; figures in docs/agg.md):
//   agg_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "agg/chunk_table.h"
#include "ratio_reporter.h"

namespace mercury::agg {
namespace {

constexpr uint32_t kWorkers = 4;
constexpr uint32_t kChunkBytes = 1408;       // net::payload_per_packet(1500)
constexpr uint32_t kJumboChunkBytes = 8896;  // net::payload_per_packet(9000)

class NullSink final : public ChunkSink {
 public:
  void on_update(const Update& u) override { bytes += u.bytes; }
  void release(void* const*, uint32_t) override {}
  uint64_t bytes = 0;
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Floats = std::unique_ptr<float[], FreeDeleter>;

// Contributions live in DPDK mbufs, which sit in hugepages: back the
// benchmark's buffers with (transparent) 2 MB pages as well, so neither side
// of the ratio is measuring 4 KB-page TLB misses.
Floats huge_floats(uint64_t elements) {
  constexpr uint64_t kHuge = 2u << 20;
  const uint64_t bytes = (elements * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint; fine if refused
  std::memset(p, 0, bytes);
  return Floats(static_cast<float*>(p));
}

struct ChunkRef {
  uint32_t key, offset, bytes;
  uint64_t first_byte;  // in the shard's element order
};

struct Workload {
  Placement placement;
  std::vector<ChunkRef> chunks;        // MTU 1500
  std::vector<ChunkRef> jumbo_chunks;  // MTU 9000, same bytes
  uint64_t bytes = 0;
  std::vector<Floats> grads;  // one buffer per rank
  Floats sum_out;

  static Workload& get() {
    static Workload w = make();
    return w;
  }

  static Workload make() {
    std::ifstream in(std::string(MERCURY_MODELS_DIR) + "/resnet50.txt");
    if (!in) throw std::runtime_error("cannot read resnet50.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    const auto decls = parse_model_shapes(ss.str());
    Workload w{Placement::compute(decls, 1), {}, {}, 0, {}, {}};
    for (const Block& p : w.placement.blocks()) {
      for (uint64_t b = 0; b < p.bytes(); b += kChunkBytes) {
        const auto len = static_cast<uint32_t>(std::min<uint64_t>(kChunkBytes, p.bytes() - b));
        w.chunks.push_back({p.key, static_cast<uint32_t>(b), len, w.bytes + b});
      }
      for (uint64_t b = 0; b < p.bytes(); b += kJumboChunkBytes) {
        const auto len = static_cast<uint32_t>(std::min<uint64_t>(kJumboChunkBytes, p.bytes() - b));
        w.jumbo_chunks.push_back({p.key, static_cast<uint32_t>(b), len, w.bytes + b});
      }
      w.bytes += p.bytes();
    }
    const uint64_t elems = w.bytes / 4;
    for (uint32_t r = 0; r < kWorkers; ++r) {
      w.grads.push_back(huge_floats(elems));
      for (uint64_t i = 0; i < elems; ++i) w.grads[r][i] = 1e-3f * static_cast<float>(i % 97 + r);
    }
    w.sum_out = huge_floats(elems);
    return w;
  }
};

void set_rate(benchmark::State& state, uint64_t bytes_per_iteration) {
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(bytes_per_iteration) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// The working set: every chunk (arg "all", 4 x 102 MB, from DRAM) or the
// first kCachedChunks (arg "l2", 4 x 255 KB, from L2: the compute limit).
constexpr size_t kCachedChunks = 180;
size_t chunk_count(const Workload& w, bool cached) {
  return cached ? kCachedChunks : w.chunks.size();
}
uint64_t set_bytes(const Workload& w, bool cached) {
  return cached ? w.chunks[kCachedChunks].first_byte : w.bytes;
}

void BM_LimitSum(benchmark::State& state, bool cached) {
  Workload& w = Workload::get();
  const std::byte* src[kWorkers];
  for (uint32_t r = 0; r < kWorkers; ++r) {
    src[r] = reinterpret_cast<const std::byte*>(w.grads[r].get());
  }
  const uint64_t bytes = set_bytes(w, cached);
  for (auto _ : state) {
    reduce_sum(Simd::kAuto, src, kWorkers, bytes / 4, w.sum_out.get());
    benchmark::ClobberMemory();
  }
  set_rate(state, bytes * kWorkers);
}

struct Variant {
  const char* name;
  OptimizerKind kind;
  Simd simd = Simd::kAuto;
  bool jumbo = false;
  float weight_decay = 0;
  bool decoupled = false;
  bool scheduled = false;  // a new learning rate from every iteration's version
};

void BM_ChunkTable(benchmark::State& state, const Variant& v, bool cached) {
  Workload& w = Workload::get();
  NullSink sink;
  const bool jumbo = v.jumbo;
  const ShardConfig config{.shard = 0,
                           .workers = kWorkers,
                           .chunk_bytes = jumbo ? kJumboChunkBytes : kChunkBytes,
                           .optimizer = {.kind = v.kind,
                                         .learning_rate = 1e-6f,
                                         .weight_decay = v.weight_decay,
                                         .decoupled_weight_decay = v.decoupled},
                           .simd = v.simd};
  // One table per benchmark run, built outside the timed loop.
  ChunkTable table(w.placement, config, make_bsp(), sink);
  const std::vector<ChunkRef>& refs = jumbo ? w.jumbo_chunks : w.chunks;
  // The same bytes as the 1500-MTU set: whole jumbo chunks up to its end.
  size_t chunks = refs.size();
  if (cached) {
    chunks = 0;
    while (refs[chunks].first_byte < set_bytes(w, cached)) ++chunks;
  }
  uint32_t iteration = 0;
  Hyperparameters h = hyperparameters_of(config.optimizer);
  for (auto _ : state) {
    if (v.scheduled) {
      // What a schedule's step costs the shard: a setting from this version on.
      h.learning_rate = 1e-6f * static_cast<float>(1 + iteration % 7);
      const auto [lowest, highest] = table.version_range();
      if (!accepted(table.optimizer().hyperparameters().change(iteration, h, lowest, highest))) {
        state.SkipWithError("the setting was refused");
      }
    }
    for (size_t c = 0; c < chunks; ++c) {
      const ChunkRef& ch = refs[c];
      for (uint32_t k = 0; k < kWorkers; ++k) {
        const uint32_t r = static_cast<uint32_t>((c + k) % kWorkers);
        table.contribute(Contribution{
            .key = ch.key,
            .offset = ch.offset,
            .iteration = iteration,
            .rank = static_cast<uint16_t>(r),
            .data = reinterpret_cast<const std::byte*>(w.grads[r].get()) + ch.first_byte,
            .bytes = ch.bytes});
      }
    }
    ++iteration;
  }
  if (table.counters().updates != uint64_t{iteration} * chunks) {
    state.SkipWithError("not every chunk was updated");
  }
  const uint64_t bytes = chunks == refs.size() ? w.bytes : refs[chunks].first_byte;
  set_rate(state, bytes * kWorkers);
}

// The kernel alone, chunk by chunk, without the table's bookkeeping: the
// difference to agg/sgd is the cost of contribute() itself.
void BM_KernelSgd(benchmark::State& state, bool cached) {
  Workload& w = Workload::get();
  const size_t chunks = chunk_count(w, cached);
  Floats param = huge_floats(w.bytes / 4);
  const StepParams k = step_params({.kind = OptimizerKind::kSgd, .learning_rate = 1e-6f}, 4, 1, 1);
  for (auto _ : state) {
    for (size_t c = 0; c < chunks; ++c) {
      const ChunkRef& ch = w.chunks[c];
      const std::byte* src[kWorkers];
      for (uint32_t r = 0; r < kWorkers; ++r) {
        src[r] = reinterpret_cast<const std::byte*>(w.grads[r].get()) + ch.first_byte;
      }
      reduce_apply(OptimizerKind::kSgd, Simd::kAuto, src, kWorkers, ch.bytes / 4,
                   param.get() + ch.first_byte / 4, nullptr, nullptr, k);
    }
    benchmark::ClobberMemory();
  }
  set_rate(state, set_bytes(w, cached) * kWorkers);
}

// CPU time, not wall time: on a shared 2-core machine the wall clock also
// counts the time this thread is descheduled, which is not aggregation.
void register_all() {
  for (const bool cached : {false, true}) {
    const std::string arg = cached ? "/l2" : "/all";
    const auto unit = cached ? benchmark::kMicrosecond : benchmark::kMillisecond;
    benchmark::RegisterBenchmark(("agg/limit_sum" + arg).c_str(), BM_LimitSum, cached)->Unit(unit);
    benchmark::RegisterBenchmark(("agg/kernel_sgd" + arg).c_str(), BM_KernelSgd, cached)
        ->Unit(unit);
    static const Variant kVariants[] = {
        {"sgd", OptimizerKind::kSgd},
        {"sum_only", OptimizerKind::kSumOnly},
        {"momentum", OptimizerKind::kMomentum},
        {"adam", OptimizerKind::kAdam},
        {"momentum_wd", OptimizerKind::kMomentum, Simd::kAuto, false, 1e-4f},
        {"adam_wd", OptimizerKind::kAdam, Simd::kAuto, false, 1e-4f},
        {"adamw", OptimizerKind::kAdam, Simd::kAuto, false, 1e-2f, true},
        {"adamw_scheduled", OptimizerKind::kAdam, Simd::kAuto, false, 1e-2f, true, true},
        {"sgd_portable", OptimizerKind::kSgd, Simd::kPortable},
        {"sgd_jumbo", OptimizerKind::kSgd, Simd::kAuto, true}};
    for (const Variant& v : kVariants) {
      benchmark::RegisterBenchmark((std::string("agg/") + v.name + arg).c_str(), BM_ChunkTable, v,
                                   cached)
          ->Unit(unit);
    }
  }
}

}  // namespace
}  // namespace mercury::agg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::agg::register_all();
  mercury::bench::RatioReporter reporter("GBps", "limit_sum");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
