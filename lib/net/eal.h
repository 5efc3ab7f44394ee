// RAII for the DPDK Environment Abstraction Layer (EAL).
//
// One Eal object per process: constructing it runs rte_eal_init with the given
// arguments, destroying it runs rte_eal_cleanup. Every other DPDK resource
// (ports, mempools, rings) must be destroyed before it. Control path only:
// the constructor throws std::runtime_error with DPDK's reason on failure and
// if an Eal already exists in the process (DPDK cannot init twice).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mercury::net {

class Eal {
 public:
  /// `args` is a full argv: args[0] is the program name.
  explicit Eal(const std::vector<std::string>& args);
  ~Eal();
  Eal(const Eal&) = delete;
  Eal& operator=(const Eal&) = delete;

  /// TSC ticks per second, measured by EAL at start.
  [[nodiscard]] static uint64_t tsc_hz();
  /// Number of arguments EAL consumed (argv[0] included).
  [[nodiscard]] int consumed() const { return consumed_; }

 private:
  int consumed_ = 0;
};

/// The TSC now (rte_rdtsc); the one clock of the datapath.
uint64_t tsc_now();

}  // namespace mercury::net
