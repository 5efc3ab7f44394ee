// ps-job: writes a job file from an allocation, or checks one.
//
//   ps-job (--hostfile FILE | --hosts H1,H2,... | --slurm) [--template JOB]
//          [--name NAME] [--id N] [--nic NIC[,NIC...]] [--servers-per-host N]
//          [--workers-per-host N] [--cpus N] [--shards N] [--subnet A.B.C.D/P]
//          [--memif-dir DIR] [--output FILE] [--multi-prog FILE --trainer CMD
//          [--server-command CMD]] [--check]
//   ps-job --check FILE
//
// The hosts come from a host file, a list, or Slurm's allocation
// (SLURM_JOB_NODELIST expanded by `scontrol show hostnames`, the CPUs of
// each from SLURM_JOB_CPUS_PER_NODE); the layout rules are
// config/generate.h's (docs/cluster.md). --check loads the result (or FILE)
// and derives what every node would run from it, as the node itself will:
// the EAL arguments of each, the ports and shards of each server, the
// worker settings of each worker; it prints one line per node and exits 1,
// naming file, line and key, on the first refusal.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/args.h"
#include "../common/main.h"
#include "config/config.h"
#include "config/generate.h"
#include "job/job.h"
#include "server/report.h"
#include "worker/attach.h"

namespace {

using namespace mercury;

struct Options {
  std::string hostfile;
  std::string hosts;
  bool slurm = false;
  std::string template_file;
  std::string name;
  uint32_t id = 0;
  std::string nics;
  uint32_t servers_per_host = 1;
  uint32_t workers_per_host = 1;
  uint32_t cpus = 0;
  uint32_t shards = 0;
  std::string subnet = "10.0.0.0/24";
  std::string memif_dir = "/tmp/mercury";
  std::string output;
  std::string multi_prog;
  std::string trainer;
  std::string server_command = "ps-server";
  bool check = false;
  std::vector<std::string> rest;
};

Options parse(int argc, char** argv) {
  Options o;
  apps::Args args("ps-job",
                  "(--hostfile FILE | --hosts H1,H2,... | --slurm) [options] [--check]\n"
                  "       ps-job --check -- FILE");
  args.text("--hostfile", "FILE", &o.hostfile,
            "one host per line: NAME [nic=NIC,...] [servers=N] [workers=N] [cpus=N]");
  args.text("--hosts", "H1,H2", &o.hosts, "the hosts, in order");
  args.flag("--slurm", &o.slurm,
            "the hosts of this Slurm allocation (SLURM_JOB_NODELIST, scontrol show\n"
            "                     hostnames) with their CPUs (SLURM_JOB_CPUS_PER_NODE)");
  args.text("--template", "JOB", &o.template_file,
            "a job file (or its sections without nodes) whose settings the result takes");
  args.text("--name", "NAME", &o.name, "job.name (default: the template's)");
  args.whole("--id", "N", &o.id, 1, UINT32_MAX, "job.id (default: the template's, else 1)");
  args.text("--nic", "NIC,...", &o.nics,
            "every host's NICs unless it names its own: a PCI address (0000:03:00.0),\n"
            "                     af_packet:IFACE, or memif (one host); a host's nodes take them "
            "in turn");
  args.whole("--servers-per-host", "N", &o.servers_per_host, 0, 64, "servers per host (default 1)");
  args.whole("--workers-per-host", "N", &o.workers_per_host, 0, 64, "workers per host (default 1)");
  args.whole("--cpus", "N", &o.cpus, 1, 1u << 20,
             "CPUs per host (default: Slurm's count, else this machine's)");
  args.whole("--shards", "N", &o.shards, 1, 64,
             "shards per server (default: the host's CPUs the workers leave, less one)");
  args.text("--subnet", "A.B.C.D/P", &o.subnet,
            "Mercury's own addresses, one per node (default 10.0.0.0/24)");
  args.text("--memif-dir", "DIR", &o.memif_dir, "memif socket names (default /tmp/mercury)");
  args.text("--output", "FILE", &o.output, "write the job file here (default: standard output)");
  args.text("--multi-prog", "FILE", &o.multi_prog,
            "also write an srun --multi-prog file: the servers' ranks run --server-command,\n"
            "                     the workers' --trainer");
  args.text("--trainer", "CMD", &o.trainer, "the trainer's command line (with --multi-prog)");
  args.text("--server-command", "CMD", &o.server_command,
            "the server's command line (with --multi-prog; default ps-server)");
  args.flag("--check", &o.check,
            "load the result and derive every node's settings from it; with no hosts,\n"
            "                     check the job file after --");
  args.rest(&o.rest, "with --check and no hosts: the job file to check");
  args.parse(argc, argv);
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(path + ": cannot write");
}

std::string run_command(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("cannot run " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (status != 0)
    throw std::runtime_error(command + " failed (status " + std::to_string(status) + ")");
  return out;
}

// Slurm's allocation: its hosts in order, each with its CPU count.
std::vector<config::HostSpec> slurm_hosts() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (list == nullptr || *list == '\0') {
    throw std::runtime_error(
        "--slurm: SLURM_JOB_NODELIST is not set (run inside an allocation: "
        "sbatch, salloc or srun)");
  }
  for (const char* c = list; *c; ++c) {
    if (std::string_view("'\"\\$`;&|<> ").find(*c) != std::string_view::npos) {
      throw std::runtime_error(std::string("--slurm: SLURM_JOB_NODELIST '") + list +
                               "' is not a Slurm host list");
    }
  }
  std::string names;
  for (std::istringstream in(run_command(std::string("scontrol show hostnames '") + list + "'"));
       in;) {
    std::string h;
    if (in >> h) names += (names.empty() ? "" : ",") + h;
  }
  std::vector<config::HostSpec> hosts = config::parse_host_list(names);
  if (const char* cpus = std::getenv("SLURM_JOB_CPUS_PER_NODE"); cpus != nullptr && *cpus) {
    const std::vector<uint32_t> counts = config::parse_slurm_cpus_per_node(cpus);
    if (counts.size() != hosts.size()) {
      throw std::runtime_error("--slurm: SLURM_JOB_CPUS_PER_NODE=" + std::string(cpus) + " gives " +
                               std::to_string(counts.size()) + " counts for " +
                               std::to_string(hosts.size()) + " hosts (" + names + ")");
    }
    for (size_t i = 0; i < hosts.size(); ++i) hosts[i].cpus = counts[i];
  }
  return hosts;
}

// What every node of `job` derives from it, as each node will at start: a
// line per node, or the first refusal thrown.
void check(const config::JobConfig& job, FILE* out) {
  job::shard_layout(job);
  config::EalRunOptions eo;
  eo.cpus = {0};  // the mapping onto CPUs is each process's own
  for (const config::NodeConfig& n : job.nodes) {
    config::eal_args(job, std::vector<std::string>{n.name}, eo);
    if (n.role != config::Role::kWorker) {
      std::fprintf(out, "%s\n", server::check_line(job, n).c_str());
    } else {
      const worker::NetCoreConfig c = worker::net_core_config(job, n.name);
      std::fprintf(out, "%s: ok: worker %s (rank %u of %u), port %s, lcore %u\n",
                   job.source.c_str(), n.name.c_str(), c.rank, c.workers,
                   n.ports.front().text.c_str(), n.lcores.front());
    }
  }
}

int run(const Options& o) {
  const int sources = !o.hostfile.empty() + !o.hosts.empty() + o.slurm;
  if (sources == 0) {
    if (!o.check || o.rest.size() != 1) {
      throw std::runtime_error(
          "give the hosts (--hostfile, --hosts or --slurm), or --check -- FILE");
    }
    const config::JobConfig job = config::load_file(o.rest[0]);
    check(job, stdout);
    std::printf("ps-job: %s: every node checks\n", o.rest[0].c_str());
    return 0;
  }
  if (sources > 1) throw std::runtime_error("give one of --hostfile, --hosts and --slurm");
  if (!o.rest.empty()) throw std::runtime_error("a job file to check goes without hosts");
  if (o.multi_prog.empty() != o.trainer.empty()) {
    throw std::runtime_error("--multi-prog and --trainer go together");
  }

  config::GenerateOptions g;
  std::vector<config::HostSpec> hosts;
  if (!o.hostfile.empty()) {
    hosts = config::parse_hostfile(read_file(o.hostfile), o.hostfile);
    g.origin = o.hostfile;
  } else if (!o.hosts.empty()) {
    hosts = config::parse_host_list(o.hosts);
    g.origin = "--hosts";
  } else {
    hosts = slurm_hosts();
    g.origin = "SLURM_JOB_NODELIST";
  }
  if (!o.template_file.empty()) {
    g.template_text = read_file(o.template_file);
    g.template_source = o.template_file;
  }
  g.name = o.name;
  if (o.id != 0) g.id = o.id;
  if (!o.nics.empty()) {
    std::string rest = o.nics;
    for (size_t c; (c = rest.find(',')) != std::string::npos; rest = rest.substr(c + 1)) {
      g.nics.push_back(rest.substr(0, c));
    }
    g.nics.push_back(rest);
  }
  g.servers_per_host = o.servers_per_host;
  g.workers_per_host = o.workers_per_host;
  g.cpus = o.cpus != 0 ? o.cpus : static_cast<uint32_t>(config::allowed_cpus().size());
  if (o.shards != 0) g.shards = o.shards;
  g.subnet = o.subnet;
  g.memif_dir = o.memif_dir;

  const std::string text = config::generate_job(hosts, g);
  if (o.output.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    write_file(o.output, text);
  }
  const std::string name = o.output.empty() ? "the generated job file" : o.output;
  const config::JobConfig job = config::load_string(text, name);
  if (!o.multi_prog.empty()) {
    write_file(o.multi_prog, config::multi_prog(job, o.server_command, o.trainer));
  }
  if (o.check) {
    // On stderr when the job file goes to stdout.
    FILE* out = o.output.empty() ? stderr : stdout;
    std::fflush(stdout);
    check(job, out);
    std::fprintf(out,
                 "ps-job: %s: %zu server(s), %zu worker(s) on %zu host(s); every node checks\n",
                 name.c_str(), job.servers().size(), job.workers().size(), hosts.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mercury::apps::guarded_main("ps-job", [&] { return run(parse(argc, argv)); });
}
