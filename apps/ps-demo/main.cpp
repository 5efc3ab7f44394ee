// ps-demo: a parameter server with its workers on this machine, over virtual
// ports, running rounds of push + pull over a real model's tensors and
// checking every aggregate against a reference.
//
//   ps-demo [--config FILE] [--model FILE] [--rounds N] [--check]
//
// Two ways to run, chosen by the job's ports:
//  * vdev ports (config/memif.yaml, the default): the job as on a cluster.
//    One ps-server process per server node (shards on their own lcores) and
//    one ps-worker process per worker node, which trains through the public
//    worker API, declares the model, starts from rank 0's parameters and
//    checks every aggregate itself (processes.cpp).
//  * ring: ports (config/ring-demo.yaml): every node in this process and one
//    lcore polling them all, driving the server node and the workers'
//    network sides directly, with the reference computed here. The fastest
//    way to see the data flow on a small machine.
#include <rte_cycles.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/args.h"
#include "../common/synthetic.h"
#include "agg/placement.h"
#include "config/config.h"
#include "job/job.h"
#include "net/eal.h"
#include "net/node.h"
#include "processes.h"
#include "server/server_node.h"
#include "worker/tensor_table.h"
#include "worker/worker_node.h"

namespace {

using namespace mercury;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct Options {
  std::string config = "config/memif.yaml";
  std::string model = "config/models/resnet50.txt";
  uint32_t rounds = 10;
  bool check = false;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("ps-demo", "[--config FILE] [--model FILE] [--rounds N] [--check]");
  args.text("--config", "FILE", &o.config,
            "job file (default config/memif.yaml). Ports over net_memif (or any\n"
            "                     vdev): one ps-server and one ps-worker process per node. Ports\n"
            "                     that are ring: links (config/ring-demo.yaml): every node in\n"
            "                     this process, one lcore polling them all");
  args.text("--model", "FILE", &o.model, "tensor shapes (default config/models/resnet50.txt)");
  args.whole("--rounds", "N", &o.rounds, 1, UINT32_MAX, "push + pull rounds (default 10)");
  args.flag("--check", &o.check, "validate the job file and exit");
  args.parse(argc, argv);
  return o;
}

using apps::Noise;
using apps::read_file;

// The job's endpoint settings (lib/job), sized for a slice per chunk update
// per worker in flight.
transport::EndpointConfig endpoint_config(const config::JobConfig& job, uint16_t epoch,
                                          uint16_t sender, transport::PeerSpec peer) {
  transport::EndpointConfig c = job::endpoint_config(job, sender, epoch, rte_get_tsc_hz());
  if (c.transport.window_packets == 0) c.transport.window_packets = 128;
  c.max_messages = 1 << 17;
  c.ingress_capacity = 1 << 17;
  c.peers = {std::move(peer)};
  return c;
}

int run(const Options& o) {
  const config::JobConfig job = config::load_file(o.config);
  if (o.check) {
    std::printf("%s: ok (job %s, %zu nodes)\n", o.config.c_str(), job.name.c_str(),
                job.nodes.size());
    return 0;
  }
  bool rings = false;
  for (const auto& n : job.nodes) {
    for (const auto& p : n.ports) rings = rings || p.kind == config::PortSpec::kRing;
  }
  if (!rings) {
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    return demo::run_processes(o.config, job, o.model, o.rounds, g_stop);
  }
  const auto servers = job.servers();
  const auto workers = job.workers();
  if (servers.size() != 1) throw std::runtime_error(job.source + ": ps-demo runs one server");
  const config::NodeConfig& srv = *servers.front();
  if (job.training.sync != config::Sync::kBsp) {
    throw std::runtime_error(job.source + ": ps-demo runs BSP (training.sync: bsp)");
  }
  const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(read_file(o.model));

  std::string notice;
  config::EalRunOptions eo;
  eo.hugepages = config::resolve_hugepages(job.eal, &notice);
  if (!notice.empty()) std::printf("%s\n", notice.c_str());
  eo.extra = {"--log-level=lib.eal:warning"};
  std::vector<std::string> names;
  for (const auto& n : job.nodes) names.push_back(n.name);
  net::Eal eal(config::eal_args(job, names, eo));
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  net::NodeNetworks nets(job, names);

  // Workers declare the model into their own buffers and freeze the placement.
  const uint32_t chunk = job.payload_bytes_per_packet();
  const uint32_t n = static_cast<uint32_t>(workers.size());
  struct Trainer {
    std::vector<std::vector<float>> params, grads;
    worker::TensorTable table;
    std::unique_ptr<worker::WorkerNode> node;
    std::vector<worker::Handle> pulls;
  };
  std::vector<std::unique_ptr<Trainer>> trainers;
  uint64_t elements = 0;
  for (const auto& d : decls) elements += d.elements;
  for (uint32_t r = 0; r < n; ++r) {
    auto t = std::make_unique<Trainer>();
    t->params.resize(decls.size());
    t->grads.resize(decls.size());
    for (size_t k = 0; k < decls.size(); ++k) {
      t->params[k].assign(decls[k].elements, 0.0f);
      t->grads[k].resize(decls[k].elements);
      t->table.declare(decls[k].name, t->params[k], decls[k].priority);
    }
    t->table.freeze(srv.shards, chunk);
    trainers.push_back(std::move(t));
  }
  const agg::Placement placement =
      agg::Placement::compute(trainers[0]->table.declarations(), srv.shards);
  if (placement.fingerprint() != trainers[0]->table.fingerprint()) {
    throw std::logic_error("server and workers disagree on the placement");
  }

  // The server: one endpoint per worker link, its shards inline.
  const uint64_t now0 = rte_rdtsc();
  std::vector<server::WorkerLink> links;
  for (uint32_t r = 0; r < n; ++r) {
    const config::NodeConfig& w = *workers[r];
    net::NodePort* server_end = nullptr;
    for (net::NodePort* p : nets.ports_of(srv.name)) {
      if (p->spec == w.ports.front().text) server_end = p;
    }
    if (server_end == nullptr) {
      throw std::runtime_error(job.source + ": worker " + w.name + "'s first port " +
                               w.ports.front().text + " does not lead to " + srv.name);
    }
    links.push_back({server_end->interface.get(), {w.name, w.ipv4.value, w.udp_port}});
  }
  server::ServerNodeConfig sc;
  sc.chunk_bytes = chunk;
  sc.optimizer = job::optimizer_config(job.training);
  if (sc.optimizer.kind != agg::OptimizerKind::kSumOnly &&
      sc.optimizer.kind != agg::OptimizerKind::kSgd) {
    throw std::runtime_error(job.source +
                             ": ps-demo's reference covers sum and sgd; the job asks for " +
                             std::string(config::to_string(job.training.optimizer)));
  }
  for (uint32_t s = 0; s < srv.shards; ++s) sc.shard_ids.push_back(s);
  sc.endpoint = endpoint_config(job, 3, 0, {});
  server::ServerNode server(placement, links, sc, now0);
  for (uint32_t r = 0; r < n; ++r) {
    worker::WorkerNodeConfig wc;
    wc.endpoint = endpoint_config(job, 5, static_cast<uint16_t>(r + 1),
                                  {srv.name, srv.ipv4.value, srv.udp_port});
    wc.pulls.first_version = 1;  // parameters start at zero on every node: no initial push
    trainers[r]->node = std::make_unique<worker::WorkerNode>(
        trainers[r]->table, *nets.ports_of(workers[r]->name).front()->interface, wc, now0);
  }
  std::printf(
      "%s: 1 server (%u shards), %u workers, %zu tensors / %zu partitions / %.1f MB "
      "of float32, %u-byte chunks, %s; one lcore polls every node\n",
      job.name.c_str(), srv.shards, n, decls.size(), placement.partitions().size(),
      static_cast<double>(elements) * 4 / 1e6, chunk,
      std::string(config::to_string(job.training.optimizer)).c_str());

  // Reference parameters (what every worker must hold after each round).
  std::vector<std::vector<float>> reference(decls.size());
  for (size_t k = 0; k < decls.size(); ++k) reference[k].assign(decls[k].elements, 0.0f);
  const float lr = sc.optimizer.learning_rate;
  const bool sum_only = sc.optimizer.kind == agg::OptimizerKind::kSumOnly;
  const uint64_t hz = rte_get_tsc_hz();
  double total_s = 0;
  for (uint32_t round = 0; round < o.rounds && !g_stop; ++round) {
    for (uint32_t r = 0; r < n; ++r) {
      Noise noise{0x9e3779b97f4a7c15ull * (round * 131 + r + 1)};
      for (auto& g : trainers[r]->grads) {
        for (float& x : g) x = noise.next();
      }
    }
    for (size_t k = 0; k < decls.size(); ++k) {
      for (uint64_t i = 0; i < decls[k].elements; ++i) {
        float s = trainers[0]->grads[k][i];
        for (uint32_t r = 1; r < n; ++r) s = s + trainers[r]->grads[k][i];
        const float g = s * (1.0f / static_cast<float>(n));  // lib/agg's rank-order average
        reference[k][i] = sum_only ? g : reference[k][i] - lr * g;
      }
    }
    const uint64_t start = rte_rdtsc();
    for (auto& t : trainers) {
      t->pulls.clear();
      for (size_t k = 0; k < decls.size(); ++k) {
        t->pulls.emplace_back();
        t->node->tracker().expect_st(static_cast<worker::TensorId>(k), round + 1, t->pulls[k]);
      }
      for (size_t k = 0; k < decls.size(); ++k) {
        if (t->node->push(static_cast<worker::TensorId>(k), t->grads[k], round) != 0) {
          throw std::runtime_error("a push was refused: the endpoint's queues are too small");
        }
      }
    }
    const uint64_t deadline = start + 120 * hz;
    bool done = false;
    while (!done && !g_stop) {
      const uint64_t now = rte_rdtsc();
      server.poll_st(now);
      for (auto& t : trainers) t->node->poll_st(now);
      done = true;
      for (auto& t : trainers) {
        for (const worker::Handle& h : t->pulls) done = done && h.ready();
      }
      if (now > deadline) throw std::runtime_error("round " + std::to_string(round) + " timed out");
    }
    if (!done) break;
    const double secs = static_cast<double>(rte_rdtsc() - start) / static_cast<double>(hz);
    total_s += secs;
    // Every worker must hold exactly the reference.
    uint64_t wrong = 0;
    for (auto& t : trainers) {
      for (size_t k = 0; k < decls.size(); ++k) {
        if (!t->pulls[k].ok())
          throw std::runtime_error("pull failed: " + std::string(t->pulls[k].error()));
        if (std::memcmp(t->params[k].data(), reference[k].data(), reference[k].size() * 4) != 0) {
          ++wrong;
        }
      }
    }
    const server::ServerCounters c = server.counters_st();
    const double bytes = static_cast<double>(elements) * 4 * n * 2;  // pushed + pulled
    std::printf(
        "round %3u: %6.3f s  %6.2f Gbit/s push+pull  %s  chunk updates %lu  "
        "retransmissions %lu\n",
        round + 1, secs, bytes * 8 / secs / 1e9, wrong == 0 ? "every aggregate exact" : "MISMATCH",
        static_cast<unsigned long>(c.shards.updates),
        static_cast<unsigned long>(c.net.tx_retransmits));
    std::fflush(stdout);
    if (wrong != 0) {
      std::fprintf(stderr, "ps-demo: %lu tensors differ from the reference\n",
                   static_cast<unsigned long>(wrong));
      return 1;
    }
  }
  std::printf("done: %.2f s over the rounds, every aggregate exact\n", total_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps-demo: %s\n", e.what());
    return 1;
  }
}
