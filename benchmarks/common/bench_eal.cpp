#include "bench_eal.h"

#include <unistd.h>

namespace mercury::bench {

std::vector<std::string> eal_args(const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> a = {name,
                                "--no-huge",
                                "-m",
                                "1024",
                                "--no-pci",
                                "--no-shconf",
                                "--log-level=lib.eal:warning",
                                "--file-prefix=mb-" + name + "-" + std::to_string(getpid())};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace mercury::bench
