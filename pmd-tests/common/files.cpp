#include "files.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

namespace mercury::pmdtest {

ScratchDir::ScratchDir(const std::string& tag, std::string kept) : kept_(std::move(kept)) {
  std::string pattern = "/tmp/mercury-" + tag + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  }
  path_ = buf.data();
}

ScratchDir::~ScratchDir() {
  if (std::getenv("MERCURY_KEEP_PCAP") != nullptr) {
    std::printf("%s kept in %s\n", kept_.c_str(), path_.c_str());
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace mercury::pmdtest
