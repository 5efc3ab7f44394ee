#include "net/eal.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace mercury::net {

namespace {
std::atomic<bool> g_eal_up{false};

// EAL leaves its runtime directory (/var/run/dpdk/<file-prefix>) behind,
// empty, even when nothing in it outlives the process (--no-shconf): one per
// test binary run piles up. It is removed when empty, at the latest at
// exit: the telemetry socket in it is unlinked by an exit handler that EAL
// registers in rte_eal_init, and handlers run in reverse order, so ours is
// registered before it. A directory that is not empty (a shared
// configuration, another process's files) stays. A plain array, not a
// std::string: it is read after static destructors may have run.
char g_runtime_dir[4096];

void remove_empty_runtime_dir() {
  if (g_runtime_dir[0] != '\0') ::rmdir(g_runtime_dir);
}
}  // namespace

Eal::Eal(const std::vector<std::string>& args) {
  if (g_eal_up.exchange(true)) {
    throw std::runtime_error("EAL is already initialised in this process (one Eal per process)");
  }
  static const bool at_exit = std::atexit(remove_empty_runtime_dir) == 0;
  (void)at_exit;
  std::vector<std::string> copy = args;  // rte_eal_init may permute argv
  std::vector<char*> argv;
  argv.reserve(copy.size() + 1);
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int n = rte_eal_init(static_cast<int>(copy.size()), argv.data());
  if (n < 0) {
    g_eal_up = false;
    std::string joined;
    for (const auto& a : args) joined += " " + a;
    throw std::runtime_error("rte_eal_init failed: " + std::string(rte_strerror(rte_errno)) +
                             " (arguments:" + joined + ")");
  }
  consumed_ = n + 1;
  std::snprintf(g_runtime_dir, sizeof g_runtime_dir, "%s", rte_eal_get_runtime_dir());
}

Eal::~Eal() {
  rte_eal_cleanup();
  remove_empty_runtime_dir();  // now if it is empty already; otherwise at exit
  g_eal_up = false;
}

uint64_t Eal::tsc_hz() { return rte_get_tsc_hz(); }

uint64_t tsc_now() { return rte_rdtsc(); }

}  // namespace mercury::net
