#include "net/eal.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>

#include <atomic>
#include <stdexcept>

namespace mercury::net {

namespace {
std::atomic<bool> g_eal_up{false};
}

Eal::Eal(const std::vector<std::string>& args) {
  if (g_eal_up.exchange(true)) {
    throw std::runtime_error("EAL is already initialised in this process (one Eal per process)");
  }
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
}

Eal::~Eal() {
  rte_eal_cleanup();
  g_eal_up = false;
}

uint64_t Eal::tsc_hz() { return rte_get_tsc_hz(); }

uint64_t tsc_now() { return rte_rdtsc(); }

}  // namespace mercury::net
