// RAII for the DPDK Environment Abstraction Layer (EAL).
//
// One Eal object per process: constructing it runs rte_eal_init with the given
// arguments, destroying it parks EAL's interrupt thread and runs
// rte_eal_cleanup (Eal::~Eal says why the park). Every other DPDK resource
// (ports, mempools, rings) must be destroyed before it. Control path only:
// the constructor throws std::runtime_error with DPDK's reason on failure and
// if an Eal already exists in the process (DPDK cannot init twice).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mercury::net {

class Eal {
 public:
  /// `args` is a full argv: args[0] is the program name.
  explicit Eal(const std::vector<std::string>& args);
  ~Eal();
  Eal(const Eal&) = delete;
  Eal& operator=(const Eal&) = delete;

  /// TSC ticks per second, measured by EAL at start.
  [[nodiscard]] static uint64_t tsc_hz();
  /// Number of arguments EAL consumed (argv[0] included).
  [[nodiscard]] int consumed() const { return consumed_; }

 private:
  int consumed_ = 0;
};

/// The TSC now (rte_rdtsc); the one clock of the datapath.
uint64_t tsc_now();

/// One run of `fn(arg)` on EAL's interrupt thread: the thread on which EAL
/// runs drivers' callbacks (net_memif connects its peers and maps and unmaps
/// its shared memory there) and alarms. Constructing it registers a callback
/// on an eventfd of its own and wakes the thread; destroying it waits for a
/// run in progress to end and unregisters, so nothing of it is left for
/// rte_eal_cleanup to find. Control path: never throws, never called from
/// the interrupt thread itself (a callback would wait for itself).
class InterruptThreadCall {
 public:
  InterruptThreadCall(void (*fn)(void*), void* arg) noexcept;
  ~InterruptThreadCall();
  InterruptThreadCall(const InterruptThreadCall&) = delete;
  InterruptThreadCall& operator=(const InterruptThreadCall&) = delete;

  /// Whether the thread was woken (false: no eventfd, or EAL refused the
  /// callback; `fn` will not run).
  [[nodiscard]] bool woken() const { return woken_; }
  /// Waits until `fn` has returned, at most `ms`; whether it has.
  [[nodiscard]] bool wait_done(uint32_t ms) const;

 private:
  static void on_interrupt_thread(void* self);

  void (*fn_)(void*);
  void* arg_;
  int fd_ = -1;
  void* handle_ = nullptr;  // rte_intr_handle*
  bool registered_ = false;
  bool woken_ = false;
  std::atomic<bool> done_{false};
};

}  // namespace mercury::net
