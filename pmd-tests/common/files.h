// A scratch directory for PMD tests and benchmarks, gone when they finish.
// (Whole-file reads are the apps' apps::read_file, apps/common/synthetic.h.)
// Control path only; throws.
#pragma once

#include <string>

namespace mercury::pmdtest {

/// A fresh directory, /tmp/mercury-<tag>-XXXXXX, removed with everything in
/// it by the destructor, unless MERCURY_KEEP_PCAP is set in the environment:
/// then it is kept and its path printed with `kept` (what to look at there).
class ScratchDir {
 public:
  ScratchDir(const std::string& tag, std::string kept);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string kept_;
};

}  // namespace mercury::pmdtest
