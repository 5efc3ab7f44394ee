// End-to-end push + pull of a real model's gradients through the parameter
// server, beside the raw PMD moving the same frames on the same links, in
// the same run.
//
//   <model>/raw/1500          the frames of one round (every worker's push and
//                             every worker's pull, payload-sized frames copied
//                             from the model's buffers) through the same four
//                             net_ring links with a raw rx/tx loop: the
//                             iteration-time lower bound of this vdev on one core.
//   <model>/push_pull/1500    one BSP round: 4 of the library's workers (the
//                             public Worker with its net core polled here,
//                             worker::PolledWorker) push_pull every tensor, the
//                             server (ServerNode built from the job's declares,
//                             2 shards inline) aggregates each chunk and sends
//                             it back to every worker, whose net core places it
//                             in the trainer's buffer; the round ends when every
//                             push_pull handle has completed.
//   resnet50/shard_cores/1500 the same with the server's 2 shards on lcores 1
//                             and 2 (fed by the net core through rings), a job
//                             of its own.
//
// The jobs are the PMD tests' (pmd-tests/common/ps_job.h: the server built as
// ps-server builds it, the workers the library's), summing only (stable
// values over any number of rounds), with 8191-mbuf pools per link end.
// Counter "rounds": rounds per second; the ratio push_pull / raw is the
// fraction of the PMD's raw rate the whole parameter server achieves. One
// lcore polls everything (like ps-demo's ring mode), so both variants are
// CPU-bound on that core: the raw variant does one copy per frame, the
// server and workers do the push copy, the pull copy, the per-packet
// transport work, the reduction and the workers' request and handle work.
// shard_cores against push_pull shows what moving the shards off the net
// core gains, or on a machine of 2 CPUs costs (docs/server.md). Each job
// starts (declare, ready, rank 0's initial parameters) once, before the
// measured rounds.
// Run (see benchmarks/ps/README.md):
//   build/benchmarks/ps/ps_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_eal.h"
#include "net/eal.h"
#include "net/frame.h"
#include "ps_job.h"
#include "ratio_reporter.h"

namespace mercury {
namespace {

constexpr uint32_t kWorkers = 4;
constexpr uint32_t kMtu = pstest::kMtu;
constexpr uint16_t kBurst = 32;

// One model's job: links, workers, server; rounds run on this thread.
class Cluster {
 public:
  Cluster(const char* model, std::vector<unsigned> shard_lcores)
      : job_(options(model, std::move(shard_lcores))) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (auto& g : job_.worker(w).grads()) {
        std::fill(g.begin(), g.end(), 1.0f / static_cast<float>(w + 1));
      }
    }
    for (const agg::TensorDecl& d : job_.decls()) bytes_ += d.elements * 4;
    job_.start();  // declare, ready, rank 0's parameters as version 0
    packets_per_worker_ = job_.chunks();
  }
  // One BSP round; "" or why it did not finish.
  std::string round() { return job_.push_pull("round"); }

  // The same frames through the same links, raw: each worker's push frames
  // worker -> server, then each worker's pull frames server -> worker.
  void raw_round() {
    const uint32_t chunk = job_.chunk_bytes();
    for (int dir = 0; dir < 2; ++dir) {
      for (uint32_t w = 0; w < kWorkers; ++w) {
        pmdtest::RingLink& l = job_.link(w);  // a: the server's end, b: the worker's
        net::Port& tx_port = dir == 0 ? l.port_b() : l.port_a();
        net::Port& rx_port = dir == 0 ? l.port_a() : l.port_b();
        net::Mempool& pool = dir == 0 ? l.end_b().pool : l.end_a().pool;
        const auto& src = job_.worker(w).grads();
        size_t tensor = 0, offset = 0;
        uint64_t left = packets_per_worker_, received = 0;
        rte_mbuf* tx[kBurst];
        rte_mbuf* rx[kBurst];
        while (received < packets_per_worker_) {
          const uint16_t n = static_cast<uint16_t>(std::min<uint64_t>(left, kBurst));
          if (n > 0 && rte_pktmbuf_alloc_bulk(pool.get(), tx, n) == 0) {
            for (uint16_t i = 0; i < n; ++i) {
              const auto* bytes = reinterpret_cast<const std::byte*>(src[tensor].data());
              const size_t len = std::min<size_t>(chunk, src[tensor].size() * 4 - offset);
              std::memcpy(rte_pktmbuf_mtod(tx[i], std::byte*), bytes + offset, len);
              tx[i]->data_len = tx[i]->pkt_len = static_cast<uint32_t>(len + net::kFrameOverhead);
              offset += len;
              if (offset >= src[tensor].size() * 4) {
                offset = 0;
                tensor = (tensor + 1) % src.size();
              }
            }
            const uint16_t sent = tx_port.tx_burst(0, tx, n);
            if (sent < n) rte_pktmbuf_free_bulk(tx + sent, n - sent);
            left -= sent;
          }
          const uint16_t got = rx_port.rx_burst(0, rx, kBurst);
          received += got;
          rte_pktmbuf_free_bulk(rx, got);
        }
      }
    }
  }

  [[nodiscard]] uint64_t bytes() const { return bytes_; }
  [[nodiscard]] uint64_t packets_per_worker() const { return packets_per_worker_; }

 private:
  static pstest::JobOptions options(const char* model, std::vector<unsigned> shard_lcores) {
    pstest::JobOptions o;
    o.model = model;
    o.workers = kWorkers;
    o.job_shards = {2};
    o.shard_lcores = std::move(shard_lcores);
    o.optimizer.kind = agg::OptimizerKind::kSumOnly;  // stable values over any number of rounds
    o.link_mbuf_cache = 256;
    o.round_limit_s = 120;
    return o;
  }

  pstest::Job job_;
  uint64_t bytes_ = 0;
  uint64_t packets_per_worker_ = 0;
};

std::unique_ptr<Cluster> g_resnet, g_resnet_cores, g_vgg;

void finish(benchmark::State& state, const Cluster& c) {
  state.counters["rounds"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // Gradient pushed plus parameters pulled, by every worker.
  state.counters["Gbps"] = benchmark::Counter(
      static_cast<double>(state.iterations() * c.bytes() * kWorkers * 2 * 8) / 1e9,
      benchmark::Counter::kIsRate);
}

void push_pull(benchmark::State& state, Cluster& c) {
  for (auto _ : state) {
    if (const std::string why = c.round(); !why.empty()) {
      state.SkipWithError(why.c_str());
      break;
    }
  }
  finish(state, c);
}

void raw(benchmark::State& state, Cluster& c) {
  for (auto _ : state) c.raw_round();
  finish(state, c);
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) {
  using namespace mercury;
  // Lcores 1 and 2 for the shard cores of resnet50/shard_cores (as the PMD
  // tests give them, on this machine's 2 CPUs); the others poll on lcore 0.
  return bench::run_with_eal(argc, argv, "ps_bench", {"--lcores=0@0,1@1,2@1"}, [] {
    g_resnet = std::make_unique<Cluster>("resnet50.txt", std::vector<unsigned>{});
    g_resnet_cores = std::make_unique<Cluster>("resnet50.txt", std::vector<unsigned>{1, 2});
    g_vgg = std::make_unique<Cluster>("vgg16.txt", std::vector<unsigned>{});
    std::printf("resnet50: %.1f MB, %lu packets per worker per direction; vgg16: %.1f MB, %lu\n",
                static_cast<double>(g_resnet->bytes()) / 1e6,
                static_cast<unsigned long>(g_resnet->packets_per_worker()),
                static_cast<double>(g_vgg->bytes()) / 1e6,
                static_cast<unsigned long>(g_vgg->packets_per_worker()));
    const auto add = [](const char* name, Cluster* c, bool raw_round, int iterations) {
      benchmark::RegisterBenchmark(
          name, [c, raw_round](benchmark::State& s) { raw_round ? raw(s, *c) : push_pull(s, *c); })
          ->Iterations(iterations)
          ->UseRealTime();
    };
    add("resnet50/raw/1500", g_resnet.get(), true, 8);
    add("resnet50/push_pull/1500", g_resnet.get(), false, 8);
    add("resnet50/shard_cores/1500", g_resnet_cores.get(), false, 8);
    add("vgg16/raw/1500", g_vgg.get(), true, 2);
    add("vgg16/push_pull/1500", g_vgg.get(), false, 2);
    bench::RatioReporter reporter("rounds", "raw");
    benchmark::RunSpecifiedBenchmarks(&reporter);
    g_vgg.reset();
    g_resnet_cores.reset();
    g_resnet.reset();
  });
}
