// libFuzzer target for the job-file loader (config::load_string): whatever
// the bytes, it returns a job or throws config::ConfigError naming the file,
// in bounded time and memory (the loader's own guards against yaml-cpp's
// pathological inputs included). Any other exception, a crash, a hang or UB
// (ASan/UBSan) is a finding. A job that loads must load again from the same
// text to the same node list (the loader keeps no state between calls).
#include <cstdlib>
#include <string_view>

#include "config/config.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const mercury::config::JobConfig job = mercury::config::load_string(text, "fuzz.yaml");
    check(!job.nodes.empty());
    const mercury::config::JobConfig again = mercury::config::load_string(text, "fuzz.yaml");
    check(again.nodes.size() == job.nodes.size() && again.id == job.id && again.name == job.name);
  } catch (const mercury::config::ConfigError& e) {
    check(e.source() == "fuzz.yaml");
  }
  return 0;
}
