// The one EAL argument list of every PMD test and benchmark binary, and of
// the peer processes they start: no hugepages, a fixed amount of memory, no
// PCI, no shared config, and a file prefix unique to the binary and the
// process, so that runs never share runtime state. Callers add their vdevs
// and lcores. Control path only; allocates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mercury::pmdtest {

struct EalOptions {
  uint32_t memory_mb = 512;  ///< -m: what a test needs; benchmarks ask for more
  /// --file-prefix; empty: "mt-<name>-<pid>". A script that cleans up after
  /// a killed process gives its own.
  std::string file_prefix;
};

/// argv for net::Eal: `name` (argv[0]), `--no-huge -m <memory_mb> --no-pci
/// --no-shconf --log-level=lib.eal:warning --file-prefix=<prefix>`, then
/// `extra`.
std::vector<std::string> eal_args(const std::string& name, const std::vector<std::string>& extra,
                                  const EalOptions& options = {});

}  // namespace mercury::pmdtest
