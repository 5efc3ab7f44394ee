#include "shared_wire.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
  // Every user holds a shared lock on the segment for as long as it has it
  // open; the last one to close it removes the name (the destructor). A
  // segment whose name went while we waited for the lock is a closed wire:
  // open the name again, which makes a fresh one.
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) throw error(name, "shm_open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::flock(fd, LOCK_SH) != 0 || ::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw error(name, "lock " + path + ": " + std::strerror(e));
    }
    if (st.st_nlink == 0) {
      ::close(fd);
      fd = -1;
      if (attempt == 100) throw error(name, "closed by another job each time it was opened");
    }
  }
  // Every opener sizes it; a fresh segment reads as zeros (no rate, free now).
  if (::ftruncate(fd, sizeof(State)) != 0) {
    const int e = errno;
    ::close(fd);
    throw error(name, "ftruncate " + path + ": " + std::strerror(e));
  }
  void* p = ::mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw error(name, "mmap " + path + ": " + std::strerror(e));
  }
  state_ = static_cast<State*>(p);
  fd_ = fd;
  const uint64_t mine = std::bit_cast<uint64_t>(rate_gbps);
  uint64_t rate = 0;
  if (state_->rate_bits.compare_exchange_strong(rate, mine) || rate == mine) return;
  // Another rate. If no other process holds the wire, it is a dead job's (a
  // process killed before it closed the wire leaves its segment): take it
  // over as a fresh wire. Otherwise a running job paces it at that rate.
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    state_->free_at.store(0, std::memory_order_relaxed);
    state_->rate_bits.store(mine, std::memory_order_relaxed);
    if (::flock(fd_, LOCK_SH) == 0) return;
  }
  ::munmap(state_, sizeof(State));
  state_ = nullptr;
  ::close(fd_);
  fd_ = -1;
  throw error(name,
              "another job paces this wire at another rate (every job on a wire must "
              "set the same link.rate_gbps)");
}

SharedWire::~SharedWire() {
  if (state_ == nullptr) return;
  ::munmap(state_, sizeof(State));
  // The last user (no other process holds its lock) removes the name, so a
  // job started afterwards gets a fresh wire; while others run it stays.
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) ::shm_unlink(("/mercury-wire-" + name_).c_str());
  ::close(fd_);
}

}  // namespace mercury::net
