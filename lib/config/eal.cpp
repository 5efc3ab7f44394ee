// EAL argument generation and the hugepage probe. No DPDK here: lib/net
// hands the argv to rte_eal_init().
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "config/config.h"

namespace mercury::config {

std::vector<std::string> eal_args(const JobConfig& job, std::span<const std::string> node_names,
                                  const EalRunOptions& options) {
  if (node_names.empty()) throw ConfigError(job.source, "eal_args: no node names given");
  std::vector<const NodeConfig*> nodes;
  for (const std::string& name : node_names) {
    const NodeConfig* n = &job.node(name);
    if (std::find(nodes.begin(), nodes.end(), n) != nodes.end()) {
      throw ConfigError(job.source, "eal_args: node \"" + name + "\" is named twice");
    }
    nodes.push_back(n);
  }

  std::vector<std::string> argv;
  argv.emplace_back("mercury");
  // One prefix per process: its runtime directory and hugepage files are
  // named after it, so processes of one machine never collide.
  argv.push_back("--file-prefix=" + job.name + "-" + nodes.front()->name +
                 options.file_prefix_suffix);

  // More lcores than CPUs is normal here (2-core machines): lcore i shares
  // CPU cpus[i % n]. Ascending order makes the lowest lcore DPDK's main,
  // unless --main-lcore names the node's first lcore (its net core) in a
  // process of one node; a process of several launches every node's loop
  // from the main lcore itself.
  std::set<uint32_t> lcores;
  for (const NodeConfig* n : nodes) lcores.insert(n->lcores.begin(), n->lcores.end());
  std::vector<uint32_t> cpus = options.cpus.empty() ? allowed_cpus() : options.cpus;
  std::string lcore_map;
  for (uint32_t l : lcores) {
    if (!lcore_map.empty()) lcore_map += ',';
    lcore_map += std::to_string(l) + "@" + std::to_string(cpu_of_lcore(l, cpus));
  }
  argv.push_back("--lcores=" + lcore_map);
  const uint32_t net_lcore = nodes.front()->lcores.front();
  if (nodes.size() == 1 && net_lcore != *lcores.begin())
    argv.push_back("--main-lcore=" + std::to_string(net_lcore));

  if (options.hugepages) {
    // Without it, hugepage files outlive the process and eat the pool.
    argv.emplace_back("--huge-unlink");
  } else {
    argv.emplace_back("--no-huge");
    argv.emplace_back("-m");
    argv.push_back(std::to_string(job.eal.memory_mb));
  }

  std::vector<std::pair<std::string, const NodeConfig*>> pci;
  for (const NodeConfig* n : nodes) {
    for (const PortSpec& p : n->ports) {
      if (p.kind != PortSpec::kPci) continue;
      for (const auto& [addr, owner] : pci) {
        if (addr == p.text) {
          throw ConfigError(job.source, "eal_args: PCI device " + p.text + " belongs to both " +
                                            owner->name + " and " + n->name +
                                            ", which cannot share one process");
        }
      }
      pci.emplace_back(p.text, n);
    }
  }
  if (pci.empty()) {
    argv.emplace_back("--no-pci");
  } else {
    for (const auto& [addr, owner] : pci) {
      argv.emplace_back("-a");
      argv.push_back(addr);
    }
  }
  bool zero_copy = false;
  for (const NodeConfig* n : nodes) {
    for (const PortSpec& p : n->ports) {
      if (p.kind != PortSpec::kVdev) continue;
      argv.push_back("--vdev=" + p.text);
      zero_copy =
          zero_copy || (p.vdev_name().starts_with("net_memif") && p.vdev_arg("zero-copy") == "yes");
    }
  }
  // A zero-copy memif client shares EAL's memory with its peer by file
  // descriptor, one per memseg list: EAL must keep each list in one file.
  if (zero_copy) argv.emplace_back("--single-file-segments");
  // Without hugepages there is nothing to share with secondary processes,
  // and the shared config file would only be litter in the runtime dir.
  if (!options.hugepages) argv.emplace_back("--no-shconf");
  argv.insert(argv.end(), job.eal.extra.begin(), job.eal.extra.end());
  argv.insert(argv.end(), options.extra.begin(), options.extra.end());
  return argv;
}

std::vector<uint32_t> allowed_cpus() {
  std::vector<uint32_t> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (uint32_t c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    // No affinity mask to be had (more CPUs than cpu_set_t holds): assume 0..n-1.
    uint32_t n = std::max(1u, std::thread::hardware_concurrency());
    for (uint32_t c = 0; c < n; ++c) cpus.push_back(c);
  }
  return cpus;
}

bool hugepages_available(const std::string& sysfs_dir, const std::string& mounts_path) {
  namespace fs = std::filesystem;
  uint64_t free_bytes = 0;
  std::error_code ec;
  for (fs::directory_iterator it(sysfs_dir, ec), end; !ec && it != end; it.increment(ec)) {
    // Directories are named hugepages-<size>kB.
    unsigned long long kb = 0;
    std::string name = it->path().filename().string();
    if (std::sscanf(name.c_str(), "hugepages-%llukB", &kb) != 1) continue;
    std::ifstream in(it->path() / "free_hugepages");
    unsigned long long pages = 0;
    if (in >> pages) free_bytes += pages * kb * 1024;
  }
  if (free_bytes < kMinHugepageBytes) return false;

  // EAL maps hugepages through a hugetlbfs mount (normally /dev/hugepages).
  std::ifstream mounts(mounts_path);
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream fields(line);
    std::string device, mount_point, type;
    if (fields >> device >> mount_point >> type && type == "hugetlbfs") return true;
  }
  return false;
}

bool hugepages_available() {
  return hugepages_available("/sys/kernel/mm/hugepages", "/proc/mounts");
}

bool resolve_hugepages(const EalConfig& eal, std::string* notice) {
  if (notice) notice->clear();
  switch (eal.hugepages) {
    case Hugepages::kOn:
      return true;
    case Hugepages::kOff:
      return false;
    case Hugepages::kAuto:
      break;
  }
  if (hugepages_available()) return true;
  if (notice) {
    *notice = "eal.hugepages is auto and fewer than " + std::to_string(kMinHugepageBytes >> 20) +
              " MB of hugepages are free in a mounted hugetlbfs: running without hugepages "
              "(--no-huge -m " +
              std::to_string(eal.memory_mb) + ")";
  }
  return false;
}

}  // namespace mercury::config
