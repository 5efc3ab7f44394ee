// EAL argument generation and the hugepage probe. No DPDK here: lib/net
// hands the argv to rte_eal_init().
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

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

namespace {

uint64_t free_hugepage_bytes(const std::string& sysfs_dir) {
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
  return free_bytes;
}

// Where a hugetlbfs file system is mounted (EAL maps hugepages through one,
// normally /dev/hugepages); "" if none is.
std::string hugetlbfs_mount(const std::string& mounts_path) {
  std::ifstream mounts(mounts_path);
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream fields(line);
    std::string device, mount_point, type;
    if (fields >> device >> mount_point >> type && type == "hugetlbfs") return mount_point;
  }
  return "";
}

// The ledger of hugepages decided on and not yet allocated
// (kHugepageLedger): one line "<pid> <bytes>" per process between its
// resolve_hugepages and its hugepages_settled, read and rewritten under an
// exclusive flock on the file itself. Not the hugetlbfs mount's directory:
// EAL takes that one (exclusively while it sets up, then shared for as long
// as the process runs).
class Ledger {
 public:
  // Opens and locks the ledger, waiting up to kHugepageLockWaitMs; ok()
  // false if it cannot be had (the decision then goes without it).
  Ledger() {
    // No symlink (a sticky, world-writable directory); every user's processes
    // share the ledger, so its creator makes it writable for all whatever the
    // umask (a file others cannot write leaves their processes deciding blind).
    fd_ = ::open(kHugepageLedger, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd_ < 0) return;
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 0666) != 0666)
      (void)::fchmod(fd_, 0666);
    for (uint32_t waited = 0;; waited += 2) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        read();
        return;
      }
      if ((errno != EWOULDBLOCK && errno != EINTR) || waited >= kHugepageLockWaitMs) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::close(fd_);
    fd_ = -1;
  }
  ~Ledger() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  [[nodiscard]] bool ok() const { return fd_ >= 0; }
  // What the other live processes have decided on and not yet allocated.
  [[nodiscard]] uint64_t pending() const {
    uint64_t sum = 0;
    for (const auto& [pid, bytes] : entries_) {
      if (pid != ::getpid()) sum += bytes;
    }
    return sum;
  }
  // Sets this process's entry (0: removes it) and writes the ledger back.
  void set_own(uint64_t bytes) {
    std::erase_if(entries_, [](const auto& e) { return e.first == ::getpid(); });
    if (bytes != 0) entries_.emplace_back(::getpid(), bytes);
    std::string text;
    for (const auto& [pid, b] : entries_)
      text += std::to_string(pid) + " " + std::to_string(b) + "\n";
    if (::ftruncate(fd_, 0) == 0) {
      const ssize_t n = ::pwrite(fd_, text.data(), text.size(), 0);
      (void)n;  // unwritten, it leaves this process out of later decisions
    }
  }

 private:
  // The entries of processes still alive (a process that died before it
  // allocated took nothing).
  void read() {
    std::string text;
    char buf[4096];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, at);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      at += n;
    }
    std::istringstream in(text);
    long long pid = 0;
    unsigned long long bytes = 0;
    while (in >> pid >> bytes) {
      if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) {
        entries_.emplace_back(static_cast<pid_t>(pid), bytes);
      }
    }
  }

  int fd_ = -1;
  std::vector<std::pair<pid_t, uint64_t>> entries_;
};

// This process has an entry in the ledger (resolve_hugepages chose
// hugepages; hugepages_settled removes it).
std::atomic<bool> g_pending{false};

}  // namespace

bool hugepages_available(const std::string& sysfs_dir, const std::string& mounts_path,
                         uint64_t need_bytes) {
  if (free_hugepage_bytes(sysfs_dir) < (need_bytes != 0 ? need_bytes : kMinHugepageBytes)) {
    return false;
  }
  return !hugetlbfs_mount(mounts_path).empty();
}

bool hugepages_available(uint64_t need_bytes) {
  return hugepages_available("/sys/kernel/mm/hugepages", "/proc/mounts", need_bytes);
}

bool resolve_hugepages(const EalConfig& eal, uint64_t need_bytes, std::string* notice) {
  if (notice) notice->clear();
  switch (eal.hugepages) {
    case Hugepages::kOn:
      return true;
    case Hugepages::kOff:
      return false;
    case Hugepages::kAuto:
      break;
  }
  // One decision at a time on this machine, each counting what the others
  // decided on and have not yet allocated: processes starting together would
  // otherwise all see the same free pages and take more than there are.
  hugepages_settled();
  Ledger ledger;
  const uint64_t want = need_bytes != 0 ? need_bytes : kMinHugepageBytes;
  const uint64_t pending = ledger.ok() ? ledger.pending() : 0;
  if (hugepages_available(want > UINT64_MAX - pending ? UINT64_MAX : want + pending)) {
    if (ledger.ok()) {
      ledger.set_own(need_bytes);
      g_pending.store(true);
    }
    return true;
  }
  if (notice) {
    *notice = "eal.hugepages is auto and fewer than " + std::to_string(want >> 20) +
              " MB of hugepages are free in a mounted hugetlbfs" +
              (pending != 0 ? " beside the " + std::to_string(pending >> 20) +
                                  " MB other processes are taking"
                            : std::string()) +
              ": running without hugepages (--no-huge -m " + std::to_string(eal.memory_mb) + ")";
  }
  return false;
}

void hugepages_settled() {
  if (!g_pending.exchange(false)) return;
  Ledger ledger;
  if (ledger.ok()) ledger.set_own(0);
}

}  // namespace mercury::config
