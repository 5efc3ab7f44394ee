// ps-server: one parameter-server node of a job, on NIC-bound cores.
//
//   ps-server --config FILE [--node NAME] [--seconds N] [--idle-sleep-us N] [--epoch N]
//             [--check] [-- EAL args...]
//
// Reads the job file, starts EAL for this node (its lcores, its ports as
// vdevs or PCI devices), opens its ports and runs a ServerNode: the net core
// (the node's first lcore, EAL's main lcore) polls every port; the node's
// shards run on the following lcores when it has them. The server waits for
// every worker of the job to declare its tensors, computes the placement,
// and then aggregates until SIGINT or SIGTERM (or --seconds).
//
// Operator output: the ports, queues and lcores in use at start; a stats line
// every second (packets in and out, aggregations per second,
// retransmissions, drops by reason); the same counters over rte_telemetry
// (`dpdk-telemetry.py -f <file-prefix>`, command /mercury/stats).
#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../common/args.h"
#include "agg/placement.h"
#include "config/config.h"
#include "job/job.h"
#include "net/eal.h"
#include "net/idle_backoff.h"
#include "net/node.h"
#include "server/server_node.h"
#include "telemetry/net_counters.h"
#include "telemetry/published.h"
#include "telemetry/telemetry.h"

namespace {

using namespace mercury;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

struct Options {
  std::string config;
  std::string node;
  double seconds = 0;  // 0: until a signal
  bool check = false;
  uint32_t idle_sleep_us = 0;  // 0: pure polling
  uint16_t epoch = 0;          // 0: job::fresh_epoch()
  std::vector<std::string> eal_extra;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("ps-server",
                  "--config FILE [--node NAME] [--seconds N] [--idle-sleep-us N] [--epoch N]\n"
                  "                 [--check] [-- EAL args...]");
  args.text("--config", "FILE", &o.config, "the job file (docs/config.md)", apps::Args::kRequired);
  args.text("--node", "NAME", &o.node,
            "which server node of the job this process runs (default: the only one)");
  args.positive("--seconds", "N", &o.seconds,
                "stop after N seconds (default: run until SIGINT or SIGTERM)");
  args.whole("--idle-sleep-us", "N", &o.idle_sleep_us, 0, 100000,
             "after 256 empty polls, sleep N us per empty poll (default 0: poll without\n"
             "                     sleeping, for a dedicated core; use ~20 on shared CPUs)");
  args.whole("--epoch", "N", &o.epoch, 1, 65535,
             "pin this node's transport incarnation (default: from the clock, so a\n"
             "                     restart is told apart); to replay a captured trace");
  args.flag("--check", &o.check, "validate the job file and the node, print what would run, exit");
  args.rest(&o.eal_extra, "passed to EAL after the arguments the job file produces");
  args.parse(argc, argv);
  return o;
}

const config::NodeConfig& pick_node(const config::JobConfig& job, const std::string& name) {
  if (!name.empty()) {
    const config::NodeConfig& n = job.node(name);
    if (n.role != config::Role::kServer) {
      throw config::ConfigError(job.source, "node " + name + " is a worker, not a server");
    }
    return n;
  }
  const auto servers = job.servers();
  if (servers.size() != 1) {
    std::string names;
    for (const auto* s : servers) names += (names.empty() ? "" : ", ") + s->name;
    throw config::ConfigError(job.source, "the job has " + std::to_string(servers.size()) +
                                              " server nodes (" + names +
                                              "): say which with --node NAME");
  }
  return *servers.front();
}

// Which of this server's ports leads to each worker (rank order): a ring
// link's far end names its node; otherwise, with one port per worker, port
// i serves worker i; with a single port, every worker is behind it.
std::vector<size_t> port_of_worker(const config::JobConfig& job, const config::NodeConfig& srv) {
  const auto workers = job.workers();
  std::vector<size_t> out(workers.size());
  for (size_t r = 0; r < workers.size(); ++r) {
    bool found = false;
    for (size_t p = 0; p < srv.ports.size() && !found; ++p) {
      const config::PortSpec& ps = srv.ports[p];
      if (ps.kind == config::PortSpec::kRing && ps.ring_peer == workers[r]->name) {
        out[r] = p;
        found = true;
      }
    }
    if (found) continue;
    if (srv.ports.size() == 1) {
      out[r] = 0;
    } else if (srv.ports.size() == workers.size() && srv.ports[r].kind != config::PortSpec::kRing) {
      out[r] = r;
    } else {
      throw config::ConfigError(
          job.source, "server " + srv.name + ": no port leads to worker " + workers[r]->name +
                          " (give the server one port for all workers, one port per worker in "
                          "rank order, or a ring: link to it)");
    }
  }
  return out;
}

std::string drops_text(const server::ServerCounters& c, const std::vector<net::NodePort*>& ports) {
  std::string s;
  auto add = [&s](std::string_view name, uint64_t n) {
    if (n == 0) return;
    s += ' ';
    s += name;
    s += '=';
    s += std::to_string(n);
  };
  for (size_t i = 0; i < transport::kEndpointDropCount; ++i) {
    add(transport::endpoint_drop_name(static_cast<transport::EndpointDrop>(i)), c.net.drops[i]);
  }
  std::vector<uint64_t> per_reason(net::kDropReasonCount, 0);
  for (const net::NodePort* p : ports) {
    const net::InterfaceCounters& ic = p->interface->counters();
    for (size_t i = 0; i < net::kDropReasonCount; ++i) {
      per_reason[i] += telemetry::read_counter(ic.drops[i]);
    }
  }
  for (size_t i = 0; i < net::kDropReasonCount; ++i) {
    add(net::drop_reason_name(static_cast<net::DropReason>(i)), per_reason[i]);
  }
  for (size_t i = 0; i < server::kServerDropCount; ++i) {
    add(server::server_drop_name(static_cast<server::ServerDrop>(i)), c.drops[i]);
  }
  add("shard_refused", c.shards.refused);
  return s.empty() ? " none" : s;
}

// Flow control (docs/server.md) refuses a packet that would start a chunk's
// set while a port's pool is nearly all held, and admits those that join a
// started set. When workers send a round in different orders, the sets they
// start before meeting can need up to chunks x (workers - 1) held mbufs; if
// the pools are smaller than that, the round can stall. Says so, once.
void warn_if_pools_small(const agg::Placement& placement, uint32_t first_shard, uint32_t shards,
                         uint32_t chunk_bytes, uint32_t workers, uint64_t pool_mbufs) {
  uint64_t chunks = 0;
  for (const agg::Partition& p : placement.partitions()) {
    if (p.shard >= first_shard && p.shard < first_shard + shards) {
      chunks += (p.bytes() + chunk_bytes - 1) / chunk_bytes;
    }
  }
  const uint64_t worst = chunks * (workers - 1);
  if (pool_mbufs < worst + worst / 8) {
    std::printf(
        "ps-server: warning: the RX pools hold %lu mbufs; this node's %lu chunks may need up to "
        "%lu held at once when workers send in different orders (flow control can then stall): "
        "raise mempool.mbufs so the pools hold at least %lu\n",
        static_cast<unsigned long>(pool_mbufs), static_cast<unsigned long>(chunks),
        static_cast<unsigned long>(worst), static_cast<unsigned long>(worst + worst / 8));
  }
}

int run(const Options& o) {
  const config::JobConfig job = config::load_file(o.config);
  const config::NodeConfig& me = pick_node(job, o.node);
  const job::ShardLayout layout = job::shard_layout(job);
  const uint32_t my_rank = job.rank_of(me.name);  // among the servers
  const std::vector<size_t> worker_port = port_of_worker(job, me);
  const auto workers = job.workers();
  if (workers.empty()) throw config::ConfigError(job.source, "the job has no worker nodes");
  if (me.shards == 0) throw config::ConfigError(job.source, "server " + me.name + " has no shards");

  std::string notice;
  config::EalRunOptions eo;
  eo.hugepages = config::resolve_hugepages(job.eal, &notice);
  eo.extra = {"--log-level=lib.eal:warning"};
  eo.extra.insert(eo.extra.end(), o.eal_extra.begin(), o.eal_extra.end());
  const std::vector<std::string> names{me.name};
  const std::vector<std::string> eal_argv = config::eal_args(job, names, eo);
  if (o.check) {
    std::printf("%s: ok: server %s (rank %u of %zu), shards %u..%u of %u, %zu workers, %zu ports\n",
                job.source.c_str(), me.name.c_str(), my_rank, job.servers().size(),
                layout.first[my_rank], layout.first[my_rank] + me.shards - 1, layout.total,
                workers.size(), me.ports.size());
    std::string argv_text;
    for (const auto& a : eal_argv) argv_text += " " + a;
    std::printf("EAL:%s\n", argv_text.c_str());
    return 0;
  }
  if (!notice.empty()) std::printf("%s\n", notice.c_str());

  net::Eal eal(eal_argv);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  net::NodeNetworks nets(job, names);
  const std::vector<net::NodePort*> ports = nets.ports_of(me.name);

  std::printf("ps-server %s: job %s (id %u), %zu workers, %s scheduler, %s\n", me.name.c_str(),
              job.name.c_str(), job.id, workers.size(),
              std::string(config::to_string(job.network.scheduler)).c_str(),
              std::string(config::to_string(job.training.sync)).c_str());
  for (const net::NodePort* p : ports) {
    std::printf("  %s\n", p->port->describe().c_str());
  }
  const uint32_t net_lcore = rte_lcore_id();
  std::printf("  lcore %u (cpu %d): net core, polls every port\n", net_lcore,
              rte_lcore_to_cpu_id(static_cast<int>(net_lcore)));
  const auto shard_lcores = me.shard_lcores();
  for (uint32_t s = 0; s < me.shards; ++s) {
    const uint32_t global = layout.first[my_rank] + s;
    if (s < shard_lcores.size()) {
      std::printf("  lcore %u (cpu %d): shard %u\n", shard_lcores[s],
                  rte_lcore_to_cpu_id(static_cast<int>(shard_lcores[s])), global);
    } else {
      std::printf("  shard %u: inline on the net core\n", global);
    }
  }

  // The node: every worker of the job, reached through the port found above.
  std::vector<net::Interface*> ifaces;
  for (const net::NodePort* p : ports) ifaces.push_back(p->interface.get());
  std::vector<server::JobWorker> job_workers;
  for (size_t r = 0; r < workers.size(); ++r) {
    const config::NodeConfig& w = *workers[r];
    job_workers.push_back(
        {{w.name, w.ipv4.value, w.udp_port}, static_cast<uint32_t>(worker_port[r])});
  }
  server::ServerNodeConfig sc;
  sc.chunk_bytes = job.payload_bytes_per_packet();
  sc.optimizer = job::optimizer_config(job.training);
  for (const config::NodeConfig* s : job.servers()) sc.job_shards.push_back(s->shards);
  sc.server_index = my_rank;
  sc.endpoint = job::endpoint_config(job, static_cast<uint16_t>(me.index),
                                     o.epoch != 0 ? o.epoch : job::fresh_epoch(), rte_get_tsc_hz());
  sc.endpoint.max_messages = 1 << 17;  // a slice per chunk update per worker can be in flight
  sc.endpoint.ingress_capacity = 1 << 17;
  sc.shard_lcores.assign(shard_lcores.begin(),
                         shard_lcores.begin() + std::min<size_t>(shard_lcores.size(), me.shards));
  // A shard core's ring must hold every mbuf the node's RX pools have: an
  // item the net core hands over has been acknowledged already, so the ring
  // may never refuse one.
  uint64_t pool_mbufs = 0;
  for (const net::NodePort* p : ports) pool_mbufs += p->pool->get()->size;
  sc.shard_core.ring_entries = static_cast<uint32_t>(rte_align64pow2(pool_mbufs + 1));
  server::ServerNode node(ifaces, job_workers, sc, rte_rdtsc());
  // The node's state, for the stats thread (the node belongs to the net core).
  std::atomic<int> state{static_cast<int>(node.state_st())};

  // Counters: the net core publishes, the stats thread and telemetry read.
  telemetry::Published<server::ServerCounters> published;
  telemetry::Registry registry;
  registry.add("server", [&published](telemetry::Values& v) {
    const server::ServerCounters c = published.read();
    v.emplace_back("contributions", c.shards.contributions);
    v.emplace_back("aggregations", c.shards.updates);
    v.emplace_back("refused", c.shards.refused);
    v.emplace_back("fanout_refused", c.shards.fanout_refused);
    v.emplace_back("held", c.held);
    v.emplace_back("declares", c.control.declares);
    v.emplace_back("barriers_completed", c.control.barriers_completed);
    for (size_t i = 0; i < server::kServerDropCount; ++i) {
      v.emplace_back(
          "drop_" + std::string(server::server_drop_name(static_cast<server::ServerDrop>(i))),
          c.drops[i]);
    }
    v.emplace_back("rx_packets", c.net.rx_packets);
    v.emplace_back("tx_data", c.net.tx_data);
    v.emplace_back("tx_retransmits", c.net.tx_retransmits);
    v.emplace_back("tx_pure_acks", c.net.tx_pure_acks);
    for (size_t i = 0; i < transport::kEndpointDropCount; ++i) {
      v.emplace_back("drop_" + std::string(transport::endpoint_drop_name(
                                   static_cast<transport::EndpointDrop>(i))),
                     c.net.drops[i]);
    }
  });
  for (const net::NodePort* p : ports) {
    telemetry::add_interface(registry, "port" + std::to_string(p->port->id()), *p->interface);
  }
  registry.expose();
  std::string prefix;
  for (const std::string& a : eal_argv) {
    if (a.rfind("--file-prefix=", 0) == 0) prefix = a.substr(14);
  }
  std::printf("  telemetry: dpdk-telemetry.py -f %s, command /mercury/stats\n", prefix.c_str());
  std::fflush(stdout);

  // The stats line, once a second, from a thread that only reads.
  std::mutex mu;
  std::condition_variable cv;
  std::thread stats([&] {
    server::ServerCounters prev = published.read();
    uint64_t prev_in = 0, prev_out = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto next = t0 + std::chrono::seconds(1);
    std::unique_lock lock(mu);
    while (!g_stop.load(std::memory_order_relaxed)) {
      if (cv.wait_until(lock, next, [] { return g_stop.load(); })) break;
      next += std::chrono::seconds(1);
      const server::ServerCounters c = published.read();
      uint64_t in = 0, out = 0;
      for (const net::NodePort* p : ports) {
        in += telemetry::read_counter(p->interface->counters().rx_frames);
        out += telemetry::read_counter(p->interface->counters().tx_frames);
      }
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf(
          "[%6.1fs] %s  pkts in %lu/s out %lu/s  aggregations %lu/s (total %lu)  "
          "retransmissions %lu  drops:%s\n",
          t,
          std::string(server::node_state_name(static_cast<server::NodeState>(state.load())))
              .c_str(),
          static_cast<unsigned long>(in - prev_in), static_cast<unsigned long>(out - prev_out),
          static_cast<unsigned long>(c.shards.updates - prev.shards.updates),
          static_cast<unsigned long>(c.shards.updates),
          static_cast<unsigned long>(c.net.tx_retransmits), drops_text(c, ports).c_str());
      std::fflush(stdout);
      prev = c;
      prev_in = in;
      prev_out = out;
    }
  });

  // The net core.
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t publish_every = hz / 10;
  const uint64_t start = rte_rdtsc();
  const uint64_t end = o.seconds > 0 ? start + static_cast<uint64_t>(o.seconds * hz) : UINT64_MAX;
  uint64_t last_publish = start;
  net::IdleBackoff backoff({.sleep_us = o.idle_sleep_us});
  server::NodeState last_state = node.state_st();
  while (!g_stop.load(std::memory_order_relaxed)) {
    const uint64_t now = rte_rdtsc();
    backoff.idle(node.poll_st(now));
    if (now - last_publish >= publish_every) {
      published.publish_st(node.counters_st());
      last_publish = now;
      if (node.state_st() != last_state) {
        const bool was_running = last_state == server::NodeState::kRunning;
        last_state = node.state_st();
        state.store(static_cast<int>(last_state));
        if (last_state == server::NodeState::kRefused) {
          std::fprintf(stderr, "ps-server %s: the job %s: %s\n", me.name.c_str(),
                       was_running ? "stopped" : "cannot start", node.refusal_st().c_str());
        } else if (last_state == server::NodeState::kRunning) {
          std::printf("ps-server %s: every worker declared; %zu partitions placed, serving\n",
                      me.name.c_str(), node.placement_st()->partitions().size());
          warn_if_pools_small(*node.placement_st(), layout.first[my_rank], me.shards,
                              sc.chunk_bytes, static_cast<uint32_t>(workers.size()), pool_mbufs);
        }
      }
      if (now >= end) g_stop = true;
    }
  }
  node.stop();
  published.publish_st(node.counters_st());
  {
    std::lock_guard lock(mu);
    cv.notify_all();
  }
  stats.join();
  const server::ServerCounters c = node.counters_st();
  std::printf("ps-server %s: stopped; %lu aggregations, %lu retransmissions, drops:%s\n",
              me.name.c_str(), static_cast<unsigned long>(c.shards.updates),
              static_cast<unsigned long>(c.net.tx_retransmits), drops_text(c, ports).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps-server: %s\n", e.what());
    return 1;
  }
}
