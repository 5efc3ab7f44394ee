// config/generate: job files written from an allocation (a host list), the
// way `ps-job` writes them (docs/cluster.md, "Job files from an allocation").
//
// Each host of the list runs some servers and some workers, on the NICs it
// is given: a PCI address (a NIC or an SR-IOV virtual function, bound to a
// DPDK driver), `af_packet:IFACE` (a kernel interface through
// net_af_packet), or `memif` (every node on one host, joined by shared
// memory). The nodes are written host by host, each host's servers first, so
// that rank r of a launcher that numbers one host's processes consecutively
// (srun's block distribution, torchrun, mpirun by slot) is the file's r-th
// node (job/identity.h). Per node:
//   * name: s<server rank>, w<worker rank>;
//   * ipv4: Mercury's own address (the DPDK stack's, not the kernel's), the
//     subnet's base + 1 + the node's place in the file;
//   * ports: its NIC (nodes of one host take the host's NICs in turn; a PCI
//     device or an interface serves one node, memif any number): the PCI
//     address, `net_af_packet<k>,iface=IFACE`, or memif ports (one server-role
//     port per worker on each server, the client end on the worker);
//   * mac: none where ARP finds the peers (PCI, af_packet); memif nodes get
//     02:00:00:00:hh:ll (their place in the file + 1);
//   * lcores: consecutive ids from 0 on each host (a server's net core and
//     one per shard, then a worker's one), which EAL maps onto the CPUs the
//     process may use (lcore l on CPU l mod n), so a host's nodes spread
//     over its CPUs; shards per server: the given count, else
//     max(1, (cpus - workers on the host) / servers on the host - 1), at
//     most 64.
// Every other section comes from a template job file (its `nodes` replaced)
// or the loader's defaults, resolved by the loader and written back with
// only the keys that differ from the defaults.
//
// Control path only, pure (no I/O but what the caller passes in); throws
// ConfigError naming the host file's line, the option or the template.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace mercury::config {

/// One host of an allocation. Unset fields take GenerateOptions' defaults.
struct HostSpec {
  std::string name;
  std::vector<std::string> nics;  ///< "0000:03:00.0", "af_packet:eth0", "memif"
  std::optional<uint32_t> servers;
  std::optional<uint32_t> workers;
  std::optional<uint32_t> cpus;
  int line = 0;  ///< in its host file (1-based); 0 when not from one
};

/// A host file: one host per line, `NAME [key=value ...]` with keys `nic`
/// (NICs separated by commas), `servers`, `workers` and `cpus`; `#` starts
/// a comment; blank lines are skipped. Throws ConfigError naming `source`
/// and the line for an unknown key, a bad number, a host given twice or no
/// host at all.
std::vector<HostSpec> parse_hostfile(std::string_view text, std::string_view source);

/// Host names separated by commas ("a,b,c"), as --hosts gives them.
std::vector<HostSpec> parse_host_list(std::string_view text);

/// Slurm's SLURM_JOB_CPUS_PER_NODE ("8(x2),4": two hosts of 8 CPUs, one of
/// 4), one count per host in the allocation's order. Throws ConfigError
/// (source "SLURM_JOB_CPUS_PER_NODE") when malformed.
std::vector<uint32_t> parse_slurm_cpus_per_node(std::string_view text);

struct GenerateOptions {
  /// A job file whose sections other than `nodes` the result takes (its
  /// nodes, if any, are replaced); empty: every section at its defaults.
  std::string template_text;
  std::string template_source;    ///< its path, for messages and relative paths
  std::string name;               ///< job.name; empty: the template's
  std::optional<uint32_t> id;     ///< job.id; unset: the template's, else 1
  std::vector<std::string> nics;  ///< every host's NICs unless it names its own
  uint32_t servers_per_host = 1;
  uint32_t workers_per_host = 1;
  uint32_t cpus = 0;               ///< every host's CPU count unless it gives its own (0: none)
  std::optional<uint32_t> shards;  ///< per server; unset: from the CPUs
  std::string subnet = "10.0.0.0/24";
  std::string memif_dir = "/tmp/mercury";  ///< memif socket names: DIR/<job>-<worker>.sock
  std::string origin;  ///< what the host list came from, for the file's first comment
};

/// The job file for `hosts`, as YAML text. Throws ConfigError for what
/// cannot make a job: no server or no worker, more nodes on a host than it
/// has NICs (PCI, af_packet), memif across hosts, a NIC of no known form, a
/// subnet too small, more than 128 lcores on a host, no CPU count for a
/// host, or a template or result the loader refuses.
std::string generate_job(std::span<const HostSpec> hosts, const GenerateOptions& options);

/// An `srun --multi-prog` file for `job`: the servers' ranks (file order,
/// job/identity.h) run `server_command`, the workers' `worker_command`:
///   0,5 ps-server
///   1-4,6-9 python3 train.py
std::string multi_prog(const JobConfig& job, std::string_view server_command,
                       std::string_view worker_command);

}  // namespace mercury::config
