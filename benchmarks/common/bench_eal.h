// Starting EAL for a benchmark binary: the same arguments the PMD tests use
// (no hugepages, no PCI, a file prefix unique to the process), plus vdevs.
#pragma once

#include <string>
#include <vector>

namespace mercury::bench {

/// EAL arguments for benchmark `name` with `extra` appended.
std::vector<std::string> eal_args(const std::string& name, const std::vector<std::string>& extra);

}  // namespace mercury::bench
