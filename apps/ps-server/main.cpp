// ps-server: one parameter-server node of a job, on NIC-bound cores.
//
//   ps-server [--config FILE] [--node NAME] [--seconds N] [--stay] [--epoch N]
//             [--resume DIR] [--check] [-- EAL args...]
//
// The job file is --config's, else $MERCURY_JOB; the node --node's, else
// $MERCURY_NODE's, else the one the launcher's rank maps to (srun, torchrun,
// mpirun: job/identity.h), else the job's only server.
//
// A thin main over lib/server: reads the job file, starts EAL for this node
// (its lcores, its ports as vdevs or PCI devices), opens its ports, builds
// the ServerNode the job file describes (server::node_config) and runs
// server::Runner on it until the job ends (every worker left: exit status
// 0; the job refused or failed: 2, a second later, the reason printed),
// SIGINT or SIGTERM (0), or --seconds; with --stay, only a signal or
// --seconds stop it (the job's end is printed and it goes on): the net core
// (the node's first lcore, EAL's main lcore) polls every port; the node's
// shards run on the following lcores when it has them.
//
// Operator output (lib/server/report.h, runner.h; docs/ps-server.md): the
// ports, queues and lcores in use at start; a stats line every second; the
// same counters over rte_telemetry (`dpdk-telemetry.py -f <file-prefix>`,
// command /mercury/stats).
#include <rte_cycles.h>
#include <rte_mempool.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/args.h"
#include "../common/main.h"
#include "config/config.h"
#include "job/identity.h"
#include "job/job.h"
#include "net/eal.h"
#include "net/net_telemetry.h"
#include "net/node.h"
#include "server/checkpoint.h"
#include "server/node_config.h"
#include "server/report.h"
#include "server/runner.h"
#include "telemetry/telemetry.h"

namespace {

using namespace mercury;

using apps::g_stop;

struct Options {
  std::string config;
  std::string node;
  double seconds = 0;  // 0: until a signal
  bool check = false;
  bool stay = false;
  uint32_t epoch = 0;  // 0: job::fresh_epoch()
  std::string resume;  // a checkpoint directory
  std::vector<std::string> eal_extra;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("ps-server",
                  "[--config FILE] [--node NAME] [--seconds N] [--stay] [--epoch N]\n"
                  "                 [--resume DIR] [--check] [-- EAL args...]");
  args.text("--config", "FILE", &o.config, "the job file (docs/config.md; default: $MERCURY_JOB)");
  args.text("--node", "NAME", &o.node,
            "which server node of the job this process runs (default: $MERCURY_NODE,\n"
            "                     the launcher's rank, or the job's only server;\n"
            "                     docs/cluster.md)");
  args.positive("--seconds", "N", &o.seconds,
                "stop after N seconds (default: when the job ends, or on SIGINT or SIGTERM)");
  args.flag("--stay", &o.stay,
            "keep running after the job ended (every worker left, or the job was refused)\n"
            "                     until a signal or --seconds; default: exit, status 0 when\n"
            "                     every worker left, 2 when the job was refused or failed");
  args.whole("--epoch", "N", &o.epoch, 1, UINT32_MAX,
             "pin this node's transport incarnation (default: from the clock, so a\n"
             "                     restart is told apart); to replay a captured trace");
  args.text("--resume", "DIR", &o.resume,
            "serve from this node's newest checkpoint in DIR (checkpoint.dir of the job\n"
            "                     that wrote it; docs/server.md, \"Durability\")");
  args.flag("--check", &o.check, "validate the job file and the node, print what would run, exit");
  args.rest(&o.eal_extra, "passed to EAL after the arguments the job file produces");
  args.parse(argc, argv);
  return o;
}

int run(const Options& o) {
  // The job and the node: the command line's, else the launcher's (job/identity.h).
  const job::Environment env = job::process_environment();
  const config::JobConfig job = config::load_file(job::job_file(o.config, env));
  const job::NodeChoice choice =
      job::choose_node(job, config::Role::kServer, o.node, "--node", env);
  const config::NodeConfig& me = *choice.node;
  // Everything the node derives from the job, checked before EAL starts.
  const std::vector<server::JobWorker> workers = server::job_workers(job, me);
  const server::ServerNodeConfig checked = server::node_config(job, me, {});
  // --resume: the checkpoint is read and checked before EAL starts.
  std::shared_ptr<const server::CheckpointFile> resume;
  if (!o.resume.empty()) {
    auto f = std::make_shared<server::CheckpointFile>(server::load_checkpoint(o.resume, me.name));
    if (const std::string why = server::checkpoint_fits(*f, checked.optimizer, checked.chunk_bytes);
        !why.empty()) {
      throw std::runtime_error(why);
    }
    resume = std::move(f);
  }

  std::string notice;
  config::EalRunOptions eo;
  const std::vector<std::string> names{me.name};
  eo.hugepages = config::resolve_hugepages(job.eal, net::hugepage_need_bytes(job, names), &notice);
  eo.extra = {"--log-level=lib.eal:warning"};
  eo.extra.insert(eo.extra.end(), o.eal_extra.begin(), o.eal_extra.end());
  const std::vector<std::string> eal_argv = config::eal_args(job, names, eo);
  std::string argv_text, prefix;
  for (const std::string& a : eal_argv) {
    argv_text += " " + a;
    if (a.rfind("--file-prefix=", 0) == 0) prefix = a.substr(14);
  }
  const std::string chosen = "node " + me.name + " of " + job.source + " (" + choice.how + ")";
  if (o.check) {
    std::printf("%s\n%s\nEAL:%s\n", server::check_line(job, me).c_str(), chosen.c_str(),
                argv_text.c_str());
    return 0;
  }
  std::printf("%s\n", chosen.c_str());
  if (resume) {
    std::printf("resuming from %s: version %u, %llu chunks\n", resume->path.c_str(),
                resume->version, static_cast<unsigned long long>(resume->chunks));
  }
  if (!notice.empty()) std::printf("%s\n", notice.c_str());

  if (job.checkpoint.enabled()) {
    // Where the checkpoints go exists before the job does anything.
    std::error_code ec;
    std::filesystem::create_directories(job.checkpoint.path, ec);
    if (ec) {
      throw std::runtime_error("cannot create checkpoint.dir " + job.checkpoint.path + ": " +
                               ec.message());
    }
  }
  net::Eal eal(eal_argv);
  apps::stop_on_signals();
  net::NodeNetworks nets(job, names);
  const std::vector<net::NodePort*> ports = nets.ports_of(me.name);
  for (const std::string& line : server::start_lines(job, me, ports)) {
    std::printf("%s\n", line.c_str());
  }

  std::vector<net::PacketPort*> node_ports;
  uint64_t pool_mbufs = 0;
  for (const net::NodePort* p : ports) {
    node_ports.push_back(p->interface.get());
    pool_mbufs += p->pool->get()->size;
  }
  server::ServerNodeConfig sc =
      server::node_config(job, me,
                          {.epoch = o.epoch != 0 ? o.epoch : job::fresh_epoch(),
                           .tsc_hz = rte_get_tsc_hz(),
                           .rx_pool_mbufs = pool_mbufs,
                           .cpu_of_lcore = server::eal_cpu_of_lcore});
  sc.resume = resume;
  server::ServerNode node(node_ports, workers, sc, rte_rdtsc());
  server::Runner runner(node, {.node = me.name,
                               .idle = {.mode = me.poll},
                               .seconds = o.seconds,
                               .end_with_job = !o.stay,
                               .checkpoint = {.dir = job.checkpoint.path,
                                              .node = me.name,
                                              .keep = job.checkpoint.keep,
                                              .every_s = job.checkpoint.every_s}});
  telemetry::Registry registry;
  runner.add_telemetry(registry);
  for (const net::NodePort* p : ports) {
    net::add_telemetry(registry, "port" + std::to_string(p->port->id()), *p->interface);
  }
  registry.expose();
  std::printf("  telemetry: dpdk-telemetry.py -f %s, command /mercury/stats\n", prefix.c_str());
  std::fflush(stdout);
  // A job refused or failed (its reason printed) ends the process with 2.
  return runner.run(g_stop) == server::NodeState::kRefused && !o.stay ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mercury::apps::guarded_main("ps-server", [&] { return run(parse(argc, argv)); });
}
