// rte_intr_instance_alloc and its accessors are experimental in DPDK 22.11.
#define ALLOW_EXPERIMENTAL_API 1
#include "net/eal.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_interrupts.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace mercury::net {

namespace {
std::atomic<bool> g_eal_up{false};

// EAL leaves its runtime directory (/var/run/dpdk/<file-prefix>) behind,
// empty, even when nothing in it outlives the process (--no-shconf): one per
// test binary run piles up. It is removed when empty, at the latest at
// exit: the telemetry socket in it is unlinked by an exit handler that EAL
// registers in rte_eal_init, and handlers run in reverse order, so ours is
// registered before it. A directory that is not empty (a shared
// configuration, another process's files) stays. A plain array, not a
// std::string: it is read after static destructors may have run.
char g_runtime_dir[4096];

void remove_empty_runtime_dir() {
  if (g_runtime_dir[0] != '\0') ::rmdir(g_runtime_dir);
}

// Where EAL's interrupt thread stays from Eal::~Eal to the process's exit.
std::atomic<bool> g_interrupt_thread_parked{false};
[[noreturn]] void park_interrupt_thread(void*) {
  g_interrupt_thread_parked.store(true, std::memory_order_release);
  for (;;) ::pause();
}
// The call that parks it: never destroyed (its destructor would wait for
// the park to end), reachable from here until the process exits.
InterruptThreadCall* g_park = nullptr;
constexpr uint32_t kParkWaitMs = 1000;
}  // namespace

Eal::Eal(const std::vector<std::string>& args) {
  if (g_eal_up.exchange(true)) {
    throw std::runtime_error("EAL is already initialised in this process (one Eal per process)");
  }
  static const bool at_exit = std::atexit(remove_empty_runtime_dir) == 0;
  (void)at_exit;
  std::vector<std::string> copy = args;  // rte_eal_init may permute argv
  std::vector<char*> argv;
  argv.reserve(copy.size() + 1);
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int n = rte_eal_init(static_cast<int>(copy.size()), argv.data());
  if (n < 0) {
    g_eal_up = false;
    std::string joined;
    for (const auto& a : args) joined += " " + a;
    throw std::runtime_error("rte_eal_init failed: " + std::string(rte_strerror(rte_errno)) +
                             " (arguments:" + joined + ")");
  }
  consumed_ = n + 1;
  std::snprintf(g_runtime_dir, sizeof g_runtime_dir, "%s", rte_eal_get_runtime_dir());
}

Eal::~Eal() {
  // DPDK 22.11's rte_eal_cleanup unmaps DPDK's memory while its interrupt
  // thread still runs, and that thread reads the handles of the callbacks
  // registered with it, some of them in that memory (net_memif's), each
  // time one is registered or removed: the cleanup's own bus cleanup
  // removes some just before it unmaps, and a net_memif server's listener
  // stays registered for good. The thread read unmapped memory there and
  // the process died at exit (1 run in 13 of pmd_port_stats's memif test,
  // loaded). Parked in a callback that never returns, it reads nothing
  // more; nothing in the cleanup waits for it.
  g_park = new InterruptThreadCall(park_interrupt_thread, nullptr);
  for (uint32_t waited = 0;
       g_park->woken() && !g_interrupt_thread_parked.load(std::memory_order_acquire) &&
       waited < kParkWaitMs;
       ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  rte_eal_cleanup();
  remove_empty_runtime_dir();  // now if it is empty already; otherwise at exit
  g_eal_up = false;
}

uint64_t Eal::tsc_hz() { return rte_get_tsc_hz(); }

uint64_t tsc_now() { return rte_rdtsc(); }

InterruptThreadCall::InterruptThreadCall(void (*fn)(void*), void* arg) noexcept
    : fn_(fn), arg_(arg) {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) return;
  rte_intr_handle* h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
  handle_ = h;
  registered_ = h != nullptr && rte_intr_fd_set(h, fd_) == 0 &&
                rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) == 0 &&
                rte_intr_callback_register(h, on_interrupt_thread, this) == 0;
  const uint64_t one = 1;
  woken_ = registered_ && ::write(fd_, &one, sizeof one) == sizeof one;
}

void InterruptThreadCall::on_interrupt_thread(void* self) {
  auto* call = static_cast<InterruptThreadCall*>(self);
  uint64_t n = 0;
  if (::read(call->fd_, &n, sizeof n) != sizeof n) return;  // not (or no longer) woken
  call->fn_(call->arg_);
  call->done_.store(true, std::memory_order_release);
}

bool InterruptThreadCall::wait_done(uint32_t ms) const {
  for (uint32_t waited = 0; woken_ && !done_.load(std::memory_order_acquire) && waited < ms;
       ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done_.load(std::memory_order_acquire);
}

InterruptThreadCall::~InterruptThreadCall() {
  auto* h = static_cast<rte_intr_handle*>(handle_);
  if (registered_) {
    // -EAGAIN while the callback runs: it is waited for, and once this
    // returns the interrupt thread no longer knows this call.
    while (rte_intr_callback_unregister(h, on_interrupt_thread, this) == -EAGAIN) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  rte_intr_instance_free(h);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace mercury::net
