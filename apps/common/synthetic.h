// What ps-demo and ps-worker share: reading a whole file (a model's shapes)
// and the cheap deterministic values they train with. Control path; header
// only, included by the apps' mains.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mercury::apps {

/// The file's bytes; throws std::runtime_error naming it and strerror.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Cheap deterministic values: xorshift into [-1, 1).
struct Noise {
  uint64_t state;
  float next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<float>(static_cast<int32_t>(state >> 32)) * (1.0f / 2147483648.0f);
  }
};

}  // namespace mercury::apps
