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
// rate at which this core can read gradient (bench::limit_sum, which
// server/server_bench holds a whole server node against too). Every variant
// reports GB/s of gradient consumed (4 x 102 MB per iteration), in CPU time
// (on a shared 2-core machine the wall clock also counts time descheduled).
//
// Variants: sgd, sum_only, momentum, adam (the table, AVX-512 kernel);
// momentum_wd, adam_wd (with torch's L2 weight decay), adamw (the decay
// decoupled), adamw_scheduled (AdamW whose learning rate changes every
// iteration, a versioned setting from that iteration's version, as a
// warm-up or cosine schedule sets it; "all" only);
// sgd_portable (the table with the intrinsic-free kernel); sgd_jumbo (the
// table with 8896-byte chunks, MTU 9000, over the same bytes); kernel_sgd
// (reduce_apply() chunk by chunk without the table: the table's own cost is
// the gap to sgd). Arg "all" = every chunk (from DRAM); "l2" = the first 180
// chunks (4 x 255 KB, L2-resident: the compute-bound case).
//
// Group "half": the half-precision kernels (agg/half.h) and the table with
// bfloat16 and float16 tensors, against the same memory-bandwidth limit, all
// in GB/s of memory traffic, the bytes each must read and write per element
// (so that kernels moving different amounts compare with one limit):
// limit_sum 20 (4 float32 in, 1 out), sgd_f32 24 (4 gradients in, the
// parameters in and out), sgd_bf16 / sgd_fp16 16 (4 two-byte gradients, the
// float32 parameters in and out; the rounded update stays in L1), widen_<dtype>_<impl>
// 12 (4 two-byte contributions in, the float32 sum out), narrow_<dtype>_<impl> 6
// (float32 in, two bytes out), for every implementation compiled in. The
// kernels run over the whole set as one stream per buffer, as the limit does;
// the table variants chunk by chunk, as sgd does (704 elements a chunk, the
// same ResNet-50 shapes in the dtype). After the usual tables, the time per
// element of sgd_bf16 and sgd_fp16 over sgd_f32's, repetition by repetition.
//
// Run (interleaved, repeated; figures in docs/agg.md and benchmarks/agg/README.md):
//   agg_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/half.h"
#include "memory_limit.h"
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

// Contributions live in DPDK mbufs, which sit in hugepages: the benchmark's
// buffers are on 2 MB pages as well (bench::huge_floats).
using bench::Floats;
using bench::huge_floats;

struct ChunkRef {
  uint32_t key, offset, bytes;
  uint64_t first_byte;  // in the shard's element order
};

// The same tensors in a two-byte dtype: placement, chunks (MTU 1500) and one
// buffer of each rank's gradients rounded into it.
struct HalfSet {
  Placement placement;
  std::vector<ChunkRef> chunks;
  std::vector<Floats> grads;  // elements x 2 bytes each, in float-sized storage
};

struct Workload {
  Placement placement;
  std::vector<ChunkRef> chunks;        // MTU 1500
  std::vector<ChunkRef> jumbo_chunks;  // MTU 9000, same bytes
  uint64_t bytes = 0;
  std::vector<Floats> grads;  // one buffer per rank
  Floats sum_out;
  std::vector<TensorDecl> decls;

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
    Workload w{Placement::compute(decls, 1), {}, {}, 0, {}, {}, decls};
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

// The half-precision sets, made when a benchmark of group half first asks
// (so that the other groups run in the same memory as before they existed).
const HalfSet& half_set(wire::Dtype d) {
  static const std::vector<HalfSet> sets = [] {
    const Workload& w = Workload::get();
    const uint64_t elems = w.bytes / 4;
    std::vector<HalfSet> out;
    for (const wire::Dtype d : {wire::Dtype::kBFloat16, wire::Dtype::kFloat16}) {
      std::vector<TensorDecl> half_decls = w.decls;
      for (TensorDecl& t : half_decls) t.dtype = d;
      HalfSet h{Placement::compute(half_decls, 1), {}, {}};
      uint64_t first = 0;
      for (const Block& p : h.placement.blocks()) {
        for (uint64_t b = 0; b < p.bytes(); b += kChunkBytes) {
          const auto len = static_cast<uint32_t>(std::min<uint64_t>(kChunkBytes, p.bytes() - b));
          h.chunks.push_back({p.key, static_cast<uint32_t>(b), len, first + b});
        }
        first += p.bytes();
      }
      for (uint32_t r = 0; r < kWorkers; ++r) {
        h.grads.push_back(huge_floats(elems / 2 + 1));
        half_kernels(d).narrow(w.grads[r].get(), elems,
                               reinterpret_cast<std::byte*>(h.grads[r].get()));
      }
      out.push_back(std::move(h));
    }
    return out;
  }();
  return sets[d == wire::Dtype::kBFloat16 ? 0 : 1];
}

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

// `counted` bytes per element: the gradient read (group agg) or all the
// traffic, the sum written too (group half).
void BM_LimitSum(benchmark::State& state, bool cached, uint64_t counted) {
  Workload& w = Workload::get();
  const std::byte* src[kWorkers];
  for (uint32_t r = 0; r < kWorkers; ++r) {
    src[r] = reinterpret_cast<const std::byte*>(w.grads[r].get());
  }
  const uint64_t elements = set_bytes(w, cached) / 4;
  for (auto _ : state) {
    bench::limit_sum(src, kWorkers, elements * 4, w.sum_out.get());
    benchmark::ClobberMemory();
  }
  set_rate(state, elements * counted);
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

// ---- group "half": rates in bytes of memory traffic (file comment) ----

// Elements in the working set: every one, or those of the first kCachedChunks
// float32 chunks.
uint64_t set_elements(const Workload& w, bool cached) { return set_bytes(w, cached) / 4; }

void BM_Widen(benchmark::State& state, wire::Dtype d, const HalfKernels* k, bool cached) {
  Workload& w = Workload::get();
  const HalfSet& h = half_set(d);
  const std::byte* src[kWorkers];
  for (uint32_t r = 0; r < kWorkers; ++r) {
    src[r] = reinterpret_cast<const std::byte*>(h.grads[r].get());
  }
  const uint64_t n = set_elements(w, cached);
  for (auto _ : state) {
    k->widen_sum(src, kWorkers, n, w.sum_out.get());
    benchmark::ClobberMemory();
  }
  set_rate(state, n * (kWorkers * 2 + 4));
}

void BM_Narrow(benchmark::State& state, wire::Dtype d, const HalfKernels* k, bool cached) {
  Workload& w = Workload::get();
  const HalfSet& h = half_set(d);
  auto* out = reinterpret_cast<std::byte*>(h.grads[0].get());  // overwritten with itself
  const uint64_t n = set_elements(w, cached);
  for (auto _ : state) {
    k->narrow(w.grads[0].get(), n, out);
    benchmark::ClobberMemory();
  }
  set_rate(state, n * (4 + 2));
}

// The chunk table, SGD, every chunk's four contributions (as BM_ChunkTable),
// float32 or a two-byte dtype.
void BM_HalfTable(benchmark::State& state, wire::Dtype d, Simd simd, bool cached) {
  Workload& w = Workload::get();
  const bool f32 = d == wire::Dtype::kFloat32;
  const HalfSet* h = f32 ? nullptr : &half_set(d);
  const Placement& placement = f32 ? w.placement : h->placement;
  const std::vector<ChunkRef>& refs = f32 ? w.chunks : h->chunks;
  const uint32_t size = wire::element_bytes(d);
  NullSink sink;
  const ShardConfig config{.shard = 0,
                           .workers = kWorkers,
                           .chunk_bytes = kChunkBytes,
                           .optimizer = {.kind = OptimizerKind::kSgd, .learning_rate = 1e-6f},
                           .simd = simd};
  ChunkTable table(placement, config, make_bsp(), sink);
  const uint64_t elements = set_elements(w, cached);
  size_t chunks = 0;
  while (chunks < refs.size() && refs[chunks].first_byte < elements * size) ++chunks;
  uint32_t iteration = 0;
  for (auto _ : state) {
    for (size_t c = 0; c < chunks; ++c) {
      const ChunkRef& ch = refs[c];
      for (uint32_t k = 0; k < kWorkers; ++k) {
        const uint32_t r = static_cast<uint32_t>((c + k) % kWorkers);
        const auto* base =
            reinterpret_cast<const std::byte*>(f32 ? w.grads[r].get() : h->grads[r].get());
        table.contribute(Contribution{.key = ch.key,
                                      .offset = ch.offset,
                                      .iteration = iteration,
                                      .rank = static_cast<uint16_t>(r),
                                      .data = base + ch.first_byte,
                                      .bytes = ch.bytes});
      }
    }
    ++iteration;
  }
  if (table.counters().updates != uint64_t{iteration} * chunks) {
    state.SkipWithError("not every chunk was updated");
  }
  const uint64_t done = chunks == refs.size() ? w.bytes / 4 : refs[chunks].first_byte / size;
  set_rate(state, done * (kWorkers * size + 8));
}

// The usual tables, then the table's time per element with a two-byte dtype
// over float32's (group "half": rates are bytes moved, 16 and 24 an element).
class AggReporter final : public bench::RatioReporter {
 public:
  AggReporter() : RatioReporter("GBps", "limit_sum") {}
  void Finalize() override {
    RatioReporter::Finalize();
    std::printf("\ntime per element over sgd_f32's (group half, per repetition)\n");
    for (const char* arg : {"all", "l2"}) {
      const std::vector<double> f32 = values("half", "sgd_f32", arg);
      for (const char* v : {"sgd_bf16", "sgd_fp16", "sgd_bf16_portable", "sgd_fp16_portable"}) {
        std::vector<double> r;
        const std::vector<double> half = values("half", v, arg);
        for (size_t i = 0; i < half.size() && i < f32.size(); ++i) {
          if (half[i] > 0) r.push_back((f32[i] / 24) / (half[i] / 16));
        }
        if (r.empty()) continue;
        const auto [mn, mx] = std::minmax_element(r.begin(), r.end());
        std::printf("  %-4s %-18s %8.3f   [%6.3f, %6.3f]  (n=%zu)\n", arg, v, bench::median(r), *mn,
                    *mx, r.size());
      }
    }
  }
};

// CPU time, not wall time: on a shared 2-core machine the wall clock also
// counts the time this thread is descheduled, which is not aggregation.
void register_all() {
  for (const bool cached : {false, true}) {
    const std::string arg = cached ? "/l2" : "/all";
    const auto unit = cached ? benchmark::kMicrosecond : benchmark::kMillisecond;
    benchmark::RegisterBenchmark(("agg/limit_sum" + arg).c_str(), BM_LimitSum, cached, kWorkers * 4)
        ->Unit(unit);
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
      // A schedule needs every chunk to move on: at l2 the chunks past the
      // first 180 stay at version 0, so the shard keeps every change and the
      // ninth is refused (docs/agg.md, "Limits and decisions").
      if (v.scheduled && cached) continue;
      benchmark::RegisterBenchmark((std::string("agg/") + v.name + arg).c_str(), BM_ChunkTable, v,
                                   cached)
          ->Unit(unit);
    }

    benchmark::RegisterBenchmark(("half/limit_sum" + arg).c_str(), BM_LimitSum, cached,
                                 kWorkers * 4 + 4)
        ->Unit(unit);
    struct Table {
      const char* name;
      wire::Dtype dtype;
      Simd simd;
    };
    for (const Table& t : {Table{"sgd_f32", wire::Dtype::kFloat32, Simd::kAuto},
                           Table{"sgd_bf16", wire::Dtype::kBFloat16, Simd::kAuto},
                           Table{"sgd_fp16", wire::Dtype::kFloat16, Simd::kAuto},
                           Table{"sgd_bf16_portable", wire::Dtype::kBFloat16, Simd::kPortable},
                           Table{"sgd_fp16_portable", wire::Dtype::kFloat16, Simd::kPortable}}) {
      benchmark::RegisterBenchmark((std::string("half/") + t.name + arg).c_str(), BM_HalfTable,
                                   t.dtype, t.simd, cached)
          ->Unit(unit);
    }
    for (const wire::Dtype d : {wire::Dtype::kBFloat16, wire::Dtype::kFloat16}) {
      const std::string type = d == wire::Dtype::kBFloat16 ? "bf16_" : "fp16_";
      WidenSumFn widen_done = nullptr;  // variants may share a widen_sum (avx512, avx512_bf16)
      for (const HalfKernels& k : half_kernel_variants(d)) {
        if (k.widen_sum != widen_done) {
          benchmark::RegisterBenchmark(("half/widen_" + type + std::string(k.name) + arg).c_str(),
                                       BM_Widen, d, &k, cached)
              ->Unit(unit);
          widen_done = k.widen_sum;
        }
        benchmark::RegisterBenchmark(("half/narrow_" + type + std::string(k.name) + arg).c_str(),
                                     BM_Narrow, d, &k, cached)
            ->Unit(unit);
      }
    }
  }
}

}  // namespace
}  // namespace mercury::agg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  mercury::agg::register_all();
  mercury::agg::AggReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
