// End-to-end push + pull of a real model's gradients through the parameter
// server, beside the raw PMD moving the same frames on the same links, in
// the same run.
//
//   <model>/raw/1500        the frames of one round (every worker's push and
//                           every worker's pull, payload-sized frames copied
//                           from the model's buffers) through the same four
//                           net_ring links with a raw rx/tx loop: the
//                           iteration-time lower bound of this vdev on one core.
//   <model>/push_pull/1500  one BSP round: 4 of the library's workers (the
//                           public Worker with its net core polled here,
//                           worker::PolledWorker) push_pull every tensor, the
//                           server (ServerNode built from the job's declares,
//                           2 shards inline) aggregates each chunk and sends
//                           it back to every worker, whose net core places it
//                           in the trainer's buffer; the round ends when every
//                           push_pull handle has completed.
//
// Counter "rounds": rounds per second; the ratio push_pull / raw is the
// fraction of the PMD's raw rate the whole parameter server achieves. One
// lcore polls everything (like ps-demo's ring mode), so both variants are
// CPU-bound on that core: the raw variant does one copy per frame, the
// server and workers do the push copy, the pull copy, the per-packet
// transport work, the reduction and the workers' request and handle work.
// The job starts (declare, ready, rank 0's initial parameters) once, before
// the measured rounds.
// Run (see benchmarks/README.md):
//   build/benchmarks/ps/ps_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "agg/placement.h"
#include "bench_eal.h"
#include "job/job.h"
#include "mercury/worker.h"
#include "net/eal.h"
#include "net/frame.h"
#include "net/interface.h"
#include "net/mempool.h"
#include "net/port.h"
#include "ratio_reporter.h"
#include "server/server_node.h"
#include "worker/attach.h"

namespace mercury {
namespace {

constexpr uint32_t kWorkers = 4;
constexpr uint32_t kShards = 2;
constexpr uint32_t kMtu = 1500;
constexpr uint16_t kBurst = 32;

uint32_t ip_server(uint32_t w) { return 0x0a000001u | (100 + w) << 8; }
uint32_t ip_worker(uint32_t w) { return 0x0a000002u | (100 + w) << 8; }

// One ring link between the server and worker w, with static ARP both ways.
struct Link {
  net::Mempool pool_s, pool_w;
  std::pair<net::Port, net::Port> ports;
  net::Interface server, worker;
  Link(const std::string& name, uint32_t w)
      : pool_s("s_" + name, 8191, 256, net::frame_bytes_for_mtu(kMtu)),
        pool_w("w_" + name, 8191, 256, net::frame_bytes_for_mtu(kMtu)),
        ports(net::Port::ring_link(name, pool_s, pool_w, net::PortOptions{.mtu = kMtu})),
        server(ports.first, pool_s, net::LocalAddr{ports.first.mac(), ip_server(w), 47100}, {}),
        worker(ports.second, pool_w, net::LocalAddr{ports.second.mac(), ip_worker(w), 47101}, {}) {
    server.add_static_arp(ip_worker(w), ports.second.mac());
    worker.add_static_arp(ip_server(w), ports.first.mac());
  }
};

transport::EndpointConfig endpoint_config(uint16_t epoch, uint16_t sender) {
  transport::EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 30'000'000;
  c.local_epoch = epoch;
  c.sender_id = sender;
  c.max_messages = 1 << 17;
  c.ingress_capacity = 1 << 17;
  return c;
}

struct Trainer {
  std::vector<std::vector<float>> params, grads;  // before `worker`, which writes into them
  std::unique_ptr<worker::PolledWorker> worker;
};

// One model's cluster: links, workers, server; rounds run on this thread.
class Cluster {
 public:
  explicit Cluster(const std::string& model_file) {
    std::ifstream in(model_file);
    if (!in) throw std::runtime_error("cannot read " + model_file);
    std::stringstream s;
    s << in.rdbuf();
    const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(s.str());
    static int instance = 0;
    const std::string tag = "e2e" + std::to_string(instance++);
    for (uint32_t w = 0; w < kWorkers; ++w) {
      links_.push_back(std::make_unique<Link>(tag + "_" + std::to_string(w), w));
    }
    chunk_ = net::payload_per_packet(kMtu);
    std::vector<net::Interface*> ports;
    std::vector<server::JobWorker> jw;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      ports.push_back(&links_[w]->server);
      jw.push_back({{"w" + std::to_string(w), ip_worker(w), 47101}, w});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = chunk_;
    sc.optimizer.kind = agg::OptimizerKind::kSumOnly;  // stable values over any number of rounds
    sc.layout = job::ShardLayout::of({kShards});
    sc.endpoint = endpoint_config(3, 0);
    server_ = std::make_unique<server::ServerNode>(ports, jw, sc, rte_rdtsc());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      worker::NetCoreConfig c;
      c.rank = w;
      c.workers = kWorkers;
      c.servers = {{{"ps", ip_server(w), 47100}, kShards}};
      c.chunk_bytes = chunk_;
      c.endpoint = endpoint_config(static_cast<uint16_t>(5 + w), static_cast<uint16_t>(1 + w));
      auto t = std::make_unique<Trainer>();
      t->worker = std::make_unique<worker::PolledWorker>(links_[w]->worker, c);
      t->params.resize(decls.size());
      t->grads.resize(decls.size());
      for (size_t k = 0; k < decls.size(); ++k) {
        t->params[k].assign(decls[k].elements, 0.0f);
        t->grads[k].assign(decls[k].elements, 1.0f / static_cast<float>(w + 1));
        t->worker->worker().declare(decls[k].name, t->params[k],
                                    static_cast<int>(decls[k].priority));
        if (w == 0) bytes_ += decls[k].elements * 4;
      }
      trainers_.push_back(std::move(t));
    }
    // The start: declare, ready, rank 0's (zero) parameters as version 0.
    std::vector<worker::Handle> started;
    for (auto& t : trainers_) started.push_back(t->worker->worker().start_async());
    std::string why;
    if (!wait(started, why)) throw std::runtime_error("the job did not start: " + why);
    for (const agg::Block& p : server_->placement_st()->blocks()) {
      packets_per_worker_ += (p.bytes() + chunk_ - 1) / chunk_;
    }
  }
  // One BSP round; false (with `why`) if it did not finish in time.
  bool round(std::string& why) {
    pending_.clear();
    for (auto& t : trainers_) {
      for (size_t k = 0; k < t->grads.size(); ++k) {
        pending_.push_back(
            t->worker->worker().push_pull(static_cast<worker::Key>(k), t->grads[k], t->params[k]));
      }
    }
    return wait(pending_, why);
  }

  // The same frames through the same links, raw: each worker's push frames
  // worker -> server, then each worker's pull frames server -> worker.
  void raw_round() {
    for (int dir = 0; dir < 2; ++dir) {
      for (uint32_t w = 0; w < kWorkers; ++w) {
        Link& l = *links_[w];
        net::Port& tx_port = dir == 0 ? l.ports.second : l.ports.first;
        net::Port& rx_port = dir == 0 ? l.ports.first : l.ports.second;
        net::Mempool& pool = dir == 0 ? l.pool_w : l.pool_s;
        const auto& src = trainers_[w]->grads;
        size_t tensor = 0, offset = 0;
        uint64_t left = packets_per_worker_, received = 0;
        rte_mbuf* tx[kBurst];
        rte_mbuf* rx[kBurst];
        while (received < packets_per_worker_) {
          const uint16_t n = static_cast<uint16_t>(std::min<uint64_t>(left, kBurst));
          if (n > 0 && rte_pktmbuf_alloc_bulk(pool.get(), tx, n) == 0) {
            for (uint16_t i = 0; i < n; ++i) {
              const auto* bytes = reinterpret_cast<const std::byte*>(src[tensor].data());
              const size_t len = std::min<size_t>(chunk_, src[tensor].size() * 4 - offset);
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
  // Polls every node until every handle of `hs` is complete; false (with
  // `why`) on a failure or after 120 s.
  bool wait(const std::vector<worker::Handle>& hs, std::string& why) {
    const uint64_t deadline = rte_rdtsc() + 120 * rte_get_tsc_hz();
    for (;;) {
      const uint64_t now = rte_rdtsc();
      server_->poll_st(now);
      for (auto& t : trainers_) t->worker->poll_st(now);
      bool done = true;
      for (const worker::Handle& h : hs) done = done && h.ready();
      if (done) break;
      if (now > deadline) {
        why = "round timed out";
        return false;
      }
    }
    for (const worker::Handle& h : hs) {
      if (!h.ok()) {
        why = std::string(h.error());
        return false;
      }
    }
    return true;
  }

  // Destroyed bottom up: the workers (their shutdown polls their net
  // cores), the server, then the links.
  std::vector<std::unique_ptr<Link>> links_;
  std::unique_ptr<server::ServerNode> server_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
  std::vector<worker::Handle> pending_;
  uint32_t chunk_ = 0;
  uint64_t bytes_ = 0;
  uint64_t packets_per_worker_ = 0;
};

std::unique_ptr<Cluster> g_resnet, g_vgg;

void finish(benchmark::State& state, const Cluster& c) {
  state.counters["rounds"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // Gradient pushed plus parameters pulled, by every worker.
  state.counters["Gbps"] = benchmark::Counter(
      static_cast<double>(state.iterations() * c.bytes() * kWorkers * 2 * 8) / 1e9,
      benchmark::Counter::kIsRate);
}

void push_pull(benchmark::State& state, Cluster& c) {
  std::string why;
  for (auto _ : state) {
    if (!c.round(why)) {
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
  benchmark::Initialize(&argc, argv);
  net::Eal eal(bench::eal_args("ps_bench", {}));
  try {
    const std::string dir = MERCURY_MODELS_DIR;
    g_resnet = std::make_unique<Cluster>(dir + "/resnet50.txt");
    g_vgg = std::make_unique<Cluster>(dir + "/vgg16.txt");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_bench: %s\n", e.what());
    return 1;
  }
  std::printf("resnet50: %.1f MB, %lu packets per worker per direction; vgg16: %.1f MB, %lu\n",
              static_cast<double>(g_resnet->bytes()) / 1e6,
              static_cast<unsigned long>(g_resnet->packets_per_worker()),
              static_cast<double>(g_vgg->bytes()) / 1e6,
              static_cast<unsigned long>(g_vgg->packets_per_worker()));
  benchmark::RegisterBenchmark("resnet50/raw/1500", [](benchmark::State& s) { raw(s, *g_resnet); })
      ->Iterations(8)
      ->UseRealTime();
  benchmark::RegisterBenchmark("resnet50/push_pull/1500",
                               [](benchmark::State& s) { push_pull(s, *g_resnet); })
      ->Iterations(8)
      ->UseRealTime();
  benchmark::RegisterBenchmark("vgg16/raw/1500", [](benchmark::State& s) { raw(s, *g_vgg); })
      ->Iterations(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("vgg16/push_pull/1500",
                               [](benchmark::State& s) { push_pull(s, *g_vgg); })
      ->Iterations(2)
      ->UseRealTime();
  bench::RatioReporter reporter("rounds", "raw");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  g_vgg.reset();
  g_resnet.reset();
  benchmark::Shutdown();
  return 0;
}
