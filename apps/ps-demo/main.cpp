// ps-demo: a parameter server with its workers on this machine, over virtual
// ports, running rounds of push + pull over a real model's tensors and
// checking every aggregate against a reference.
//
//   ps-demo [--config FILE] [--model FILE] [--rounds N] [--check]
//           [--trace FILE [--compute-scale F] [--comm-rounds N]]
//
// Two ways to run, chosen by the job's ports:
//  * vdev ports (config/memif.yaml, the default): the job as on a cluster.
//    One ps-server process per server node (shards on their own lcores) and
//    one ps-worker process per worker node, which trains through the public
//    worker API, declares the model, starts from rank 0's parameters and
//    checks every aggregate itself (processes.cpp). With --trace, every
//    ps-worker is a trace-driven trainer (ps-worker --trace) and the demo
//    ends with the job's iteration time beside its lower bound.
//  * ring: ports (config/ring-demo.yaml): every node in this process and one
//    lcore polling them all: the server node as ps-server builds it, and
//    the workers as ps-worker runs them (the public worker API, their net
//    cores polled by this lcore instead of threads of their own:
//    worker::PolledWorker). The same start (declare, ready, rank 0's
//    initial parameters as version 0) and rounds of push_pull, with the
//    reference computed here. The fastest way to see the data flow on a
//    small machine.
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
#include "../common/main.h"
#include "../common/synthetic.h"
#include "../common/trace.h"
#include "agg/placement.h"
#include "config/config.h"
#include "job/job.h"
#include "mercury/worker.h"
#include "net/eal.h"
#include "net/node.h"
#include "node/loop.h"
#include "processes.h"
#include "server/node_config.h"
#include "server/server_node.h"
#include "worker/attach.h"

namespace {

using namespace mercury;

using apps::g_stop;

struct Options {
  std::string config = "config/memif.yaml";
  std::string model = "config/models/resnet50.txt";
  uint32_t rounds = 10;
  bool check = false;
  std::string verify;  // passed to ps-worker (process mode)
  bool timestamps = false;
  std::string trace;          // passed to ps-worker (process mode), with the two below
  std::string compute_scale;  // as given
  std::string comm_rounds;    // as given
  std::string compute_ms;     // passed to ps-worker (process mode), with the one below
  std::string straggler;
  std::string dtype;  // passed to ps-worker (process mode)
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
  args.text("--verify", "WHEN", &o.verify,
            "process mode: every ps-worker's --verify (every, the default, last, or none\n"
            "                     with --trace)");
  args.flag("--timestamps", &o.timestamps,
            "process mode: every ps-worker's round lines carry their start and end");
  args.text("--trace", "FILE", &o.trace,
            "process mode: every ps-worker trains on this compute trace\n"
            "                     (config/traces/*.txt, matching --model; ps-worker --trace)");
  args.text("--compute-scale", "F", &o.compute_scale, "with --trace: ps-worker's --compute-scale");
  args.text("--comm-rounds", "N", &o.comm_rounds, "with --trace: ps-worker's --comm-rounds");
  args.text("--compute-ms", "MS", &o.compute_ms,
            "process mode: every ps-worker runs free-running rounds with this compute\n"
            "                     (ps-worker --compute-ms; what the sync modes are compared on)");
  args.text("--straggler", "RANK,F", &o.straggler,
            "with --compute-ms or --trace: ps-worker's --straggler (rank RANK computes F\n"
            "                     times longer)");
  args.text("--dtype", "TYPE", &o.dtype,
            "process mode: every ps-worker's --dtype (float32, bfloat16, float16, mixed)");
  args.parse(argc, argv);
  if (o.compute_ms.empty() && o.trace.empty() && !o.straggler.empty()) {
    throw std::runtime_error("--straggler needs --compute-ms or --trace");
  }
  if (o.trace.empty() && (!o.compute_scale.empty() || !o.comm_rounds.empty())) {
    throw std::runtime_error(
        std::string(!o.compute_scale.empty() ? "--compute-scale" : "--comm-rounds") +
        " needs --trace");
  }
  return o;
}

using apps::Noise;
using apps::read_file;

// The job's endpoint settings as every node derives them (lib/job), sized
// for a slice per chunk update per worker in flight, with a fixed window on
// the rings when the job derives none.
void size_for_rings(transport::EndpointConfig& c) {
  if (c.transport.window_packets == 0) c.transport.window_packets = 128;
  c.max_messages = 1 << 17;
  c.ingress_capacity = 1 << 17;
}

struct Trainer {
  std::vector<std::vector<float>> params, grads;  // before `worker`, which writes into them
  std::unique_ptr<worker::PolledWorker> worker;
  std::vector<worker::Handle> pending;
};

int run(const Options& o) {
  const config::JobConfig job = config::load_file(o.config);
  for (const config::NodeConfig& n : job.nodes) {
    if (n.role != config::Role::kStandby) continue;
    // A standby needs a port every node reaches (a bridge, a NIC), which
    // neither mode's links are.
    throw std::runtime_error(job.source + ": ps-demo does not run a standby (" + n.name +
                             "): start each node with ps-server or ps-worker --node NAME "
                             "(docs/durability.md, \"A hot standby\")");
  }
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
    apps::stop_on_signals();
    std::vector<std::string> worker_args;
    if (!o.verify.empty()) worker_args = {"--verify", o.verify};
    if (o.timestamps) worker_args.push_back("--timestamps");
    if (!o.dtype.empty()) worker_args.insert(worker_args.end(), {"--dtype", o.dtype});
    // Rounds of push_pull take seconds each on this machine; trace rounds
    // add their compute.
    double timeout_s = 60.0 + 30.0 * o.rounds;
    // Rounds add their compute, the straggler's at the most (ps-worker checks
    // both numbers).
    double factor = 1.0;
    if (!o.straggler.empty()) {
      worker_args.insert(worker_args.end(), {"--straggler", o.straggler});
      if (const size_t comma = o.straggler.find(','); comma != std::string::npos) {
        factor = std::max(1.0, std::strtod(o.straggler.c_str() + comma + 1, nullptr));
      }
    }
    if (!o.compute_ms.empty()) {
      worker_args.insert(worker_args.end(), {"--compute-ms", o.compute_ms});
      timeout_s += 2.0 * o.rounds * std::strtod(o.compute_ms.c_str(), nullptr) / 1e3 * factor;
    }
    if (!o.trace.empty()) {
      // Refused here, once, rather than by every worker.
      const std::string model_text = read_file(o.model);
      const trace::Trace t =
          trace::parse_trace({o.trace, read_file(o.trace)}, {o.model, model_text},
                             agg::parse_model_shapes(model_text));
      worker_args.insert(worker_args.end(), {"--trace", o.trace});
      double scale = 1.0;
      if (!o.compute_scale.empty()) {
        worker_args.insert(worker_args.end(), {"--compute-scale", o.compute_scale});
        scale = std::strtod(o.compute_scale.c_str(), nullptr);  // ps-worker checks it
      }
      uint32_t comm_rounds = 5;
      if (!o.comm_rounds.empty()) {
        worker_args.insert(worker_args.end(), {"--comm-rounds", o.comm_rounds});
        comm_rounds = static_cast<uint32_t>(std::strtoul(o.comm_rounds.c_str(), nullptr, 10));
      }
      timeout_s += 30.0 * comm_rounds + 2.0 * o.rounds * t.compute_us() * scale * factor / 1e6;
    }
    return demo::run_processes(o.config, job, o.model, o.rounds, worker_args, timeout_s, g_stop);
  }
  if (!o.verify.empty() || o.timestamps || !o.trace.empty() || !o.compute_ms.empty()) {
    throw std::runtime_error(
        "--verify, --timestamps, --trace and --compute-ms are ps-worker's, for process mode; "
        "ring mode (" +
        job.source + ") checks every round itself");
  }
  const auto servers = job.servers();
  const auto workers = job.workers();
  if (servers.size() != 1) throw std::runtime_error(job.source + ": ps-demo runs one server");
  const config::NodeConfig& srv = *servers.front();
  if (job.training.sync != config::Sync::kBsp) {
    throw std::runtime_error(job.source + ": ps-demo's ring mode runs bsp (training.sync: " +
                             std::string(config::to_string(job.training.sync)) +
                             "); the other modes run in process mode (e.g. over memif)");
  }
  const std::vector<agg::TensorDecl> decls = agg::parse_model_shapes(read_file(o.model));

  std::string notice;
  config::EalRunOptions eo;
  std::vector<std::string> names;
  for (const auto& n : job.nodes) names.push_back(n.name);
  eo.hugepages = config::resolve_hugepages(job.eal, net::hugepage_need_bytes(job, names), &notice);
  if (!notice.empty()) std::printf("%s\n", notice.c_str());
  eo.extra = {"--log-level=lib.eal:warning"};
  net::Eal eal(config::eal_args(job, names, eo));
  apps::stop_on_signals();
  net::NodeNetworks nets(job, names);

  // The server: one port per worker link, its shards inline, waiting for
  // every rank's declare (as ps-server builds it).
  const uint32_t chunk = job.payload_bytes_per_packet();
  const uint32_t n = static_cast<uint32_t>(workers.size());
  const std::vector<net::NodePort*> server_ports = nets.ports_of(srv.name);
  std::vector<net::PacketPort*> ports;
  for (net::NodePort* p : server_ports) ports.push_back(p->interface.get());
  uint64_t pool_mbufs = 0;
  for (net::NodePort* p : server_ports) pool_mbufs += p->pool->get()->size;
  // As ps-server configures it (lib/server), but every shard inline: one
  // lcore polls every node here.
  server::ServerNodeConfig sc = server::node_config(
      job, srv,
      {.epoch = job::fresh_epoch(), .tsc_hz = rte_get_tsc_hz(), .rx_pool_mbufs = pool_mbufs});
  sc.shard_lcores.clear();
  if (sc.optimizer.kind != agg::OptimizerKind::kSumOnly &&
      sc.optimizer.kind != agg::OptimizerKind::kSgd) {
    throw std::runtime_error(job.source +
                             ": ps-demo's reference covers sum and sgd; the job asks for " +
                             std::string(config::to_string(job.training.optimizer)));
  }
  size_for_rings(sc.endpoint);
  // One loop polls every node (no idle policy: wait() below runs its passes).
  node::Loop loop({.tick_hz = rte_get_tsc_hz()});
  server::ServerNode server(ports, server::job_workers(job, srv), sc, rte_rdtsc());
  server.attach(loop);

  // The workers: each the library's, over its own buffers. Rank 0's hold
  // the initial model, which becomes version 0 on every rank; the others
  // start from garbage it must overwrite.
  std::vector<std::vector<float>> reference(decls.size());
  uint64_t elements = 0;
  for (size_t k = 0; k < decls.size(); ++k) {
    reference[k].resize(decls[k].elements);
    Noise noise{0x5eed0000ull + k};
    for (float& x : reference[k]) x = noise.next();
    elements += decls[k].elements;
  }
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (uint32_t r = 0; r < n; ++r) {
    worker::NetCoreConfig c = worker::net_core_config(job, workers[r]->name);
    size_for_rings(c.endpoint);
    auto t = std::make_unique<Trainer>();
    t->worker = std::make_unique<worker::PolledWorker>(
        *nets.ports_of(workers[r]->name).front()->interface, c);
    t->worker->attach(loop);
    t->params.resize(decls.size());
    t->grads.resize(decls.size());
    for (size_t k = 0; k < decls.size(); ++k) {
      t->params[k] = r == 0 ? reference[k] : std::vector<float>(decls[k].elements, -1.0e30f);
      t->grads[k].resize(decls[k].elements);
      t->worker->worker().declare(decls[k].name, t->params[k], static_cast<int>(decls[k].priority));
    }
    trainers.push_back(std::move(t));
  }
  // At the end the workers leave one at a time while the server and the
  // others run on (each runs the loop until the server acknowledged its
  // leave, and then leaves the loop), before the server goes.
  struct LeaveInTurn {
    std::vector<std::unique_ptr<Trainer>>& trainers;
    ~LeaveInTurn() {
      for (auto& t : trainers) t.reset();
    }
  } leave_in_turn{trainers};

  // Polls every node until every handle is complete (or a signal, or the
  // time runs out); throws on a failed handle.
  const uint64_t hz = rte_get_tsc_hz();
  auto wait = [&](const char* what) {
    const uint64_t deadline = rte_rdtsc() + 120 * hz;
    for (bool done = false; !done && !g_stop;) {
      const uint64_t now = rte_rdtsc();
      loop.pass_st(now);
      done = true;
      for (auto& t : trainers) {
        for (const worker::Handle& h : t->pending) done = done && h.ready();
      }
      if (now > deadline) throw std::runtime_error(std::string(what) + " timed out");
    }
    for (auto& t : trainers) {
      for (const worker::Handle& h : t->pending) {
        if (h.ready() && !h.ok()) {
          throw std::runtime_error(std::string(what) + ": " + std::string(h.error()));
        }
      }
    }
    return !g_stop;
  };
  // Every worker must hold exactly the reference: returns the tensors that differ.
  auto mismatches = [&] {
    uint64_t wrong = 0;
    for (auto& t : trainers) {
      for (size_t k = 0; k < decls.size(); ++k) {
        wrong +=
            std::memcmp(t->params[k].data(), reference[k].data(), reference[k].size() * 4) != 0;
      }
    }
    return wrong;
  };

  const uint64_t start = rte_rdtsc();
  for (auto& t : trainers) t->pending = {t->worker->worker().start_async()};
  if (!wait("the start")) return 1;
  std::printf(
      "%s: 1 server (%u shards), %u workers, %zu tensors / %zu blocks / %.1f MB "
      "of float32, %u-byte chunks, %s; one lcore polls every node\n"
      "started in %.2f s: initial parameters %s\n",
      job.name.c_str(), srv.shards, n, decls.size(), server.placement_st()->blocks().size(),
      static_cast<double>(elements) * 4 / 1e6, chunk,
      std::string(config::to_string(job.training.optimizer)).c_str(),
      static_cast<double>(rte_rdtsc() - start) / static_cast<double>(hz),
      mismatches() == 0 ? "exact" : "MISMATCH");
  if (mismatches() != 0) return 1;

  const float lr = sc.optimizer.learning_rate;
  const bool sum_only = sc.optimizer.kind == agg::OptimizerKind::kSumOnly;
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
    const uint64_t t0 = rte_rdtsc();
    for (auto& t : trainers) {
      // The backward pass emits the last layer first.
      t->pending.clear();
      for (size_t k = decls.size(); k-- > 0;) {
        t->pending.push_back(
            t->worker->worker().push_pull(static_cast<worker::Key>(k), t->grads[k], t->params[k]));
      }
    }
    if (!wait(("round " + std::to_string(round + 1)).c_str())) break;
    const double secs = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(hz);
    total_s += secs;
    const uint64_t wrong = mismatches();
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
  if (g_stop) {
    std::fprintf(stderr, "ps-demo: interrupted\n");
    return 1;
  }
  // Nobody leaves before every rank has its last aggregate.
  for (auto& t : trainers) t->pending = {t->worker->worker().barrier_async()};
  if (!wait("the barrier")) return 1;
  std::printf("done: %.2f s over the rounds, every aggregate exact\n", total_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mercury::apps::guarded_main("ps-demo", [&] { return run(parse(argc, argv)); });
}
