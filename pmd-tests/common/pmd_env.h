// The one way PMD test binaries start DPDK: EAL once per binary with
// eal_args() (no hugepages, 512 MB, no PCI, a file prefix unique to the
// binary and process, so tests never share runtime state), then GoogleTest.
#pragma once

#include <string>
#include <vector>

namespace mercury::pmdtest {

/// Starts EAL with eal_args(<binary name>, `extra_eal_args`) (vdevs,
/// lcores), runs every test, stops EAL, and returns gtest's exit code.
/// gtest flags in argv are honoured, also after `--`.
int run_all_tests(int argc, char** argv, const std::vector<std::string>& extra_eal_args);

}  // namespace mercury::pmdtest
