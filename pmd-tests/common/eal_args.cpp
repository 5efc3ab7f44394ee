#include "eal_args.h"

#include <unistd.h>

namespace mercury::pmdtest {

std::vector<std::string> eal_args(const std::string& name, const std::vector<std::string>& extra,
                                  const EalOptions& options) {
  const std::string prefix = options.file_prefix.empty()
                                 ? "mt-" + name + "-" + std::to_string(::getpid())
                                 : options.file_prefix;
  std::vector<std::string> a = {name,
                                "--no-huge",
                                "-m",
                                std::to_string(options.memory_mb),
                                "--no-pci",
                                "--no-shconf",
                                "--log-level=lib.eal:warning",
                                "--file-prefix=" + prefix};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace mercury::pmdtest
