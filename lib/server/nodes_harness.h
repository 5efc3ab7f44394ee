// The harness of the node-layer tests (nodes_test.cpp, nodes_state_test.cpp):
// one ServerNode and 2-4 workers (the library's Worker, its NetCore a poller
// of the same node::Loop), every link a pair of net::MemoryPorts, one
// thread, a fake clock.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "job/job.h"
#include "net/memory_port.h"
#include "node/loop.h"
#include "server/server_node.h"
#include "transport/test_util.h"
#include "worker/attach.h"

namespace mercury::nodes_test {

constexpr uint64_t kHz = transport::test::kHz;  // 1 tick = 1 ns
constexpr uint64_t kUs = transport::test::kUs;
constexpr uint64_t kMs = transport::test::kMs;
constexpr uint32_t kMtu = 1500;
constexpr uint32_t kShards = 2;
constexpr float kLr = 0.25f;

// The fake clock: every read moves it on by a microsecond, so a loop that
// only polls (a worker's shutdown) still sees time pass.
inline std::atomic<uint64_t> g_now{kMs};
inline node::Tick tick() { return g_now.fetch_add(kUs) + kUs; }

inline net::LocalAddr address(uint32_t r, uint8_t host) {
  return net::LocalAddr{net::MacAddr{{0x02, 0, 0, 0, static_cast<uint8_t>(r), host}},
                        0x0a000000u | r << 8 | host, static_cast<uint16_t>(47100 + host)};
}

inline transport::EndpointConfig endpoint(uint32_t epoch, uint16_t id) {
  transport::EndpointConfig c;
  c.transport = transport::test::test_config(64);
  c.local_epoch = epoch;
  c.sender_id = id;
  c.max_messages = 4096;
  c.ingress_capacity = 4096;
  return c;
}

inline const std::vector<agg::TensorDecl> kModel = {
    {"conv1.weight", 1728, 0}, {"conv1.bias", 64, 1}, {"fc.weight", 5000, 2}, {"fc.bias", 10, 3}};

struct Options {
  uint32_t workers = 4;
  config::Sync sync = config::Sync::kBsp;
  uint32_t staleness_bound = 0;  // ssp
  bool shrink = false;           // training.on_worker_loss shrink (bsp)
  double wait_s = 0;             // > 0: training.on_worker_loss wait, worker_wait_s (bsp)
  net::MemoryLinkParams impair;  // every link, both ways (seeds differ per link)
  std::vector<agg::TensorDecl> model = kModel;
  uint32_t odd_rank = UINT32_MAX;  // declares a different fc.weight
  uint32_t start_timeout_ms = 2'000;
  // The servers' optimizer, which the workers know too (round() checks SGD at kLr).
  agg::OptimizerConfig optimizer{.kind = agg::OptimizerKind::kSgd, .learning_rate = kLr};
};

// One rank: its buffers, declared to the library's worker.
struct Rank {
  std::vector<std::vector<float>> params, grads;
  std::unique_ptr<worker::PolledWorker> polled;
  worker::Worker& api() { return polled->worker(); }
};

class Nodes {
 public:
  explicit Nodes(const Options& o) : o_(o) {
    const uint32_t n = o.workers;
    std::vector<net::PacketPort*> server_ports;
    std::vector<server::JobWorker> workers;
    for (uint32_t r = 0; r < n; ++r) {
      server_side_.push_back(std::make_unique<net::MemoryPort>(
          address(r, 1), net::MemoryPortOptions{.mtu = kMtu, .buffers = 4096}));
      worker_side_.push_back(std::make_unique<net::MemoryPort>(
          address(r, 2), net::MemoryPortOptions{.mtu = kMtu, .buffers = 4096}));
      net::MemoryPort::connect(*server_side_[r], *worker_side_[r]);
      impair(r, o.impair);
      server_ports.push_back(server_side_[r].get());
      const net::LocalAddr w = address(r, 2);
      workers.push_back(
          {{"w" + std::to_string(r), w.ip, w.udp_port, 0, static_cast<uint16_t>(1 + r)}, r});
    }
    server::ServerNodeConfig sc;
    sc.chunk_bytes = net::payload_per_packet(kMtu);
    sc.optimizer = o.optimizer;
    config::TrainingConfig training;
    training.sync = o.sync;
    sc.sync_policy = [training] { return job::sync_policy(training); };
    sc.fanout = o.sync == config::Sync::kBsp      ? server::Fanout::kEvery
                : o.sync == config::Sync::kPsPlus ? server::Fanout::kEveryVersion
                : o.sync == config::Sync::kSsp    ? server::Fanout::kSlowest
                                                  : server::Fanout::kContributor;
    sc.staleness_bound = o.staleness_bound;
    sc.shrink = o.shrink;
    sc.wait_for_workers = o.wait_s > 0;
    if (o.wait_s > 0) sc.worker_wait_s = o.wait_s;
    sc.layout = job::ShardLayout::of({kShards});
    sc.endpoint = endpoint(7, 0);
    server_ = std::make_unique<server::ServerNode>(server_ports, workers, sc, g_now.load());
    server_->attach(loop_);
    for (uint32_t r = 0; r < n; ++r) add_rank(r, 100 + r);
  }
  ~Nodes() {
    ranks_.clear();  // each shutdown runs the loop until its leave is answered
    server_.reset();
  }

  void impair(uint32_t r, net::MemoryLinkParams p) {
    p.seed = 17 + r * 31;
    server_side_[r]->set_link(p);
    p.seed = 23 + r * 37;
    worker_side_[r]->set_link(p);
  }

  // Rank r's worker process, with transport incarnation `epoch`.
  void add_rank(uint32_t r, uint32_t epoch) {
    worker::NetCoreConfig c;
    c.rank = r;
    c.workers = o_.workers;
    const net::LocalAddr s = address(r, 1);
    c.servers = {worker::ServerSpec{{"server0", s.ip, s.udp_port, 0, 0}, kShards, std::nullopt}};
    c.chunk_bytes = net::payload_per_packet(kMtu);
    c.endpoint = endpoint(epoch, static_cast<uint16_t>(1 + r));
    c.start_timeout_ms = o_.start_timeout_ms;
    c.sync = o_.sync;
    c.staleness_bound = o_.staleness_bound;
    c.pulls.async = o_.sync != config::Sync::kBsp;
    c.optimizer_config = o_.optimizer;
    auto rank = std::make_unique<Rank>();
    rank->polled = std::make_unique<worker::PolledWorker>(*worker_side_[r], c);
    rank->polled->attach(loop_, &tick);
    std::vector<agg::TensorDecl> model = o_.model;
    if (r == o_.odd_rank) model[2].elements += 1;
    rank->params.resize(model.size());
    rank->grads.resize(model.size());
    for (size_t t = 0; t < model.size(); ++t) {
      rank->params[t].assign(model[t].elements, 0.0f);
      rank->grads[t].assign(model[t].elements, 0.0f);
      rank->api().declare(model[t].name, rank->params[t], model[t].priority,
                          static_cast<worker::Update>(model[t].update));
    }
    if (ranks_.size() <= r) ranks_.resize(r + 1);
    ranks_[r] = std::move(rank);
  }

  // Passes of the whole loop, a fake microsecond each, until `done` or
  // `limit` of fake time; false on time out.
  template <class Done>
  bool run(Done done, uint64_t limit = 5'000 * kMs) {
    const uint64_t end = g_now.load() + limit;
    while (g_now.load() < end) {
      loop_.pass_st(tick());
      if (done()) return true;
    }
    return false;
  }
  bool wait(const std::vector<worker::Handle>& hs, uint64_t limit = 5'000 * kMs) {
    return run(
        [&] {
          for (const worker::Handle& h : hs) {
            if (!h.ready()) return false;
          }
          return true;
        },
        limit);
  }

  // Every rank starts; rank 0's parameters (random) become version 0.
  std::string start(std::vector<std::vector<float>>& reference) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& p : ranks_[0]->params) {
      for (float& x : p) x = dist(rng);
    }
    reference = ranks_[0]->params;
    std::vector<worker::Handle> hs;
    for (auto& r : ranks_) hs.push_back(r->api().start_async());
    if (!wait(hs)) return "the start timed out";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return std::string(h.error());
    }
    return compare(reference, "version 0");
  }

  // Every rank's push_pull of every tensor with gradients drawn from `rng`
  // (rank-major, then tensor), waited for.
  std::string push_round(std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<worker::Handle> hs;
    for (auto& r : ranks_) {
      for (uint32_t t = 0; t < r->params.size(); ++t) {
        for (float& g : r->grads[t]) g = dist(rng);
        hs.push_back(r->api().push_pull(t, r->grads[t], r->params[t]));
      }
    }
    if (!wait(hs)) return "the round timed out";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return std::string(h.error());
    }
    return "";
  }

  // One BSP round: random gradients, every rank's push_pull of every tensor,
  // the reference moved on (rank-order sum, x 1/n, SGD) and compared.
  std::string round(std::vector<std::vector<float>>& reference, std::mt19937& rng, float lr = kLr) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float inv_n = 1.0f / static_cast<float>(ranks_.size());
    for (size_t t = 0; t < reference.size(); ++t) {
      for (auto& r : ranks_) {
        for (float& g : r->grads[t]) g = dist(rng);
      }
      for (size_t i = 0; i < reference[t].size(); ++i) {
        float s = ranks_[0]->grads[t][i];
        for (size_t k = 1; k < ranks_.size(); ++k) s = s + ranks_[k]->grads[t][i];
        reference[t][i] = reference[t][i] - lr * (s * inv_n);
      }
    }
    std::vector<worker::Handle> hs;
    for (auto& r : ranks_) {
      for (uint32_t t = 0; t < r->params.size(); ++t) {
        hs.push_back(r->api().push_pull(t, r->grads[t], r->params[t]));
      }
    }
    if (!wait(hs)) return "the round timed out";
    for (const worker::Handle& h : hs) {
      if (!h.ok()) return std::string(h.error());
    }
    return compare(reference, "the round");
  }

  std::string compare(const std::vector<std::vector<float>>& want, const std::string& what) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t t = 0; t < want.size(); ++t) {
        if (std::memcmp(ranks_[r]->params[t].data(), want[t].data(), want[t].size() * 4) != 0) {
          return what + ": rank " + std::to_string(r) + " tensor " + std::to_string(t) +
                 " differs from the reference";
        }
      }
    }
    return "";
  }

  server::ServerNode& server() { return *server_; }
  Rank& rank(uint32_t r) { return *ranks_[r]; }
  node::Loop& loop() { return loop_; }
  net::MemoryPort& server_side(uint32_t r) { return *server_side_[r]; }
  net::MemoryPort& worker_side(uint32_t r) { return *worker_side_[r]; }
  // Rank r's process stops (nothing polls it again) and a new one takes
  // its place: transport incarnation `epoch`, its tensors declared (the
  // job's model, or with `odd` a different fc.weight), not started.
  void restart(uint32_t r, uint32_t epoch, bool odd = false) {
    loop_.remove(*ranks_[r]->polled->net_core());
    dead_.push_back(std::move(ranks_[r]));
    const uint32_t was = o_.odd_rank;
    if (odd) o_.odd_rank = r;
    add_rank(r, epoch);
    o_.odd_rank = was;
  }
  // A new process of rank r, the last rank, after kill(r): its link
  // carries again, transport incarnation `epoch`, declared, not started.
  void revive(uint32_t r, uint32_t epoch) {
    impair(r, {});
    add_rank(r, epoch);
  }
  // Rank r's process is gone: nothing polls it, nothing reaches it.
  void kill(uint32_t r) {
    loop_.remove(*ranks_[r]->polled->net_core());
    impair(r, {.cut = true});
    dead_.push_back(std::move(ranks_[r]));
    ranks_.erase(ranks_.begin() + r);
  }

 private:
  Options o_;
  node::Loop loop_{{.tick_hz = kHz}};
  std::vector<std::unique_ptr<net::MemoryPort>> server_side_, worker_side_;
  std::unique_ptr<server::ServerNode> server_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Killed ranks: never polled again; their net cores are dropped with them
  // (a PolledWorker whose loop no longer runs it stops at once).
  std::vector<std::unique_ptr<Rank>> dead_;
};

}  // namespace mercury::nodes_test
