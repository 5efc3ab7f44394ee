#include "shared_wire.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace mercury::net {

namespace {

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::runtime_error error(const std::string& name, const std::string& what) {
  return std::runtime_error("shared wire " + name + ": " + what);
}

}  // namespace

SharedWire::SharedWire(const std::string& name, double rate_gbps)
    : name_(name), rate_gbps_(rate_gbps) {
  if (!valid_name(name)) throw error(name, "the name must match [a-z0-9_.-]+ (at most 200)");
  if (!(rate_gbps > 0)) throw error(name, "a shared wire needs a rate");
  const std::string path = "/mercury-wire-" + name;
  const int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) throw error(name, "shm_open " + path + ": " + std::strerror(errno));
  // Every opener sizes it; a fresh segment reads as zeros (no rate, free now).
  if (::ftruncate(fd, sizeof(State)) != 0) {
    const int e = errno;
    ::close(fd);
    throw error(name, "ftruncate " + path + ": " + std::strerror(e));
  }
  void* p = ::mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw error(name, "mmap " + path + ": " + std::strerror(e));
  state_ = static_cast<State*>(p);
  const uint64_t mine = std::bit_cast<uint64_t>(rate_gbps);
  uint64_t rate = 0;
  if (!state_->rate_bits.compare_exchange_strong(rate, mine) && rate != mine) {
    ::munmap(state_, sizeof(State));
    state_ = nullptr;
    throw error(name,
                "another job paces this wire at another rate (every job on a wire must "
                "set the same link.rate_gbps)");
  }
}

SharedWire::~SharedWire() {
  if (state_ == nullptr) return;
  ::munmap(state_, sizeof(State));
  ::shm_unlink(("/mercury-wire-" + name_).c_str());
}

}  // namespace mercury::net
