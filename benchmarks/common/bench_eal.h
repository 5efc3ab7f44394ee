// Starting EAL for a benchmark binary: the PMD tests' arguments
// (pmdtest::eal_args: no hugepages, no PCI, a file prefix unique to the
// process) with more memory, since a benchmark keeps several model-sized
// jobs or 9000-MTU links alive at once, plus its vdevs and lcores; and the
// main of a benchmark over DPDK.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "eal_args.h"
#include "net/eal.h"

namespace mercury::bench {

inline constexpr uint32_t kEalMemoryMb = 1024;

/// EAL arguments for benchmark `name` with `extra` appended.
inline std::vector<std::string> eal_args(const std::string& name,
                                         const std::vector<std::string>& extra) {
  return pmdtest::eal_args(name, extra, {.memory_mb = kEalMemoryMb});
}

/// A benchmark's main over DPDK: Google Benchmark takes its flags, EAL
/// starts (eal_args(name, eal_extra)), `run` builds the set-up and runs the
/// benchmarks with its reporter, EAL stops. An exception from EAL or `run`
/// (a run that failed its checks: a fault to look at, not a figure) ends the
/// benchmark with "<name>: <what>" and exit status 1.
inline int run_with_eal(int argc, char** argv, const std::string& name,
                        const std::vector<std::string>& eal_extra,
                        const std::function<void()>& run) {
  benchmark::Initialize(&argc, argv);
  int rc = 0;
  try {
    net::Eal eal(eal_args(name, eal_extra));
    run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    rc = 1;
  }
  benchmark::Shutdown();
  return rc;
}

}  // namespace mercury::bench
