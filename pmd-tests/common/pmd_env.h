// The one way PMD test binaries start DPDK: EAL once per binary, without
// hugepages or PCI, with a file prefix unique to the binary and process so
// tests never share runtime state, then GoogleTest.
#pragma once

#include <string>
#include <vector>

namespace mercury::pmdtest {

/// Starts EAL with `--no-huge -m 512 --no-pci --no-shconf --file-prefix=<name>-<pid>`
/// plus `extra_eal_args` (vdevs, lcores), runs every test, stops EAL, and
/// returns gtest's exit code. gtest flags after `--` in argv are honoured.
int run_all_tests(int argc, char** argv, const std::vector<std::string>& extra_eal_args);

}  // namespace mercury::pmdtest
