// A wire shared by link emulators in different processes: one serialiser,
// so that two jobs on this host can compete for one emulated link the way
// two jobs on real hosts compete for a NIC's wire.
//
// The wire is a POSIX shared-memory segment ("/mercury-wire-<name>") holding
// the TSC tick at which the wire is next free and the rate every user paces
// it at. Each user holds a shared flock on it while it has it open; the last
// to close it removes the name, and a segment no process holds (a killed
// job's) is taken over as a fresh wire by the next opener. LinkModel::schedule() reserves each
// frame's wire time with one compare-and-swap on that tick (lock-free across processes; the TSC is
// one clock for every process on the host), so the frames of every emulator on the wire leave in
// the order they were offered, each behind the wire time of all before it: a drop-tail FIFO shared
// by the jobs, each job's delay line being its part of the queue.
//
// Threading: any number of emulators, in any processes, may reserve on one
// wire at once; each SharedWire object belongs to the thread that made it.
// Opening is control path (it throws std::runtime_error); reserving is
// datapath (no lock, no allocation, no failure).
//
// docs/link-emulator.md, "Shared wires", is the guide.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace mercury::net {

class SharedWire {
 public:
  /// Maps the wire `name` ([a-z0-9_.-], at most 200 characters), making it
  /// if no process has it open, for emulators pacing it at `rate_gbps`. The
  /// rate is compared in Gbit/s, not in ticks: each process converts it with
  /// its own EAL's TSC frequency, which may differ in the last digits.
  /// Throws std::runtime_error when the segment cannot be made, locked or
  /// mapped, when the rate is not positive, or when a running job paces the
  /// wire at another rate (a segment left by a dead job is reset instead).
  SharedWire(const std::string& name, double rate_gbps);
  /// Unmaps the segment; the last user removes its name, so that a job
  /// started afterwards gets a fresh wire.
  ~SharedWire();
  SharedWire(const SharedWire&) = delete;
  SharedWire& operator=(const SharedWire&) = delete;

  /// Reserves `ticks` of wire time for a frame offered at TSC `now`:
  /// returns the tick at which its last bit is out, max(now, the end of
  /// every earlier reservation) + ticks.
  uint64_t reserve(uint64_t now, uint64_t ticks) {
    uint64_t free_at = state_->free_at.load(std::memory_order_relaxed);
    uint64_t end;
    do {
      end = (now > free_at ? now : free_at) + ticks;
    } while (!state_->free_at.compare_exchange_weak(free_at, end, std::memory_order_relaxed));
    return end;
  }

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] double rate_gbps() const { return rate_gbps_; }

 private:
  struct State {
    std::atomic<uint64_t> rate_bits;  ///< the rate's double, bit for bit; 0 until set
    alignas(64) std::atomic<uint64_t> free_at;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free);

  std::string name_;
  double rate_gbps_;
  State* state_ = nullptr;
  int fd_ = -1;  ///< open while mapped: it holds the user's shared lock
};

}  // namespace mercury::net
