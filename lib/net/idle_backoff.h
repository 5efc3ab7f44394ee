// The idle back-off every poll loop of Mercury shares: the server's net core,
// its shard cores and the worker's net core.
//
// What it is for. A poll loop that found nothing to do spins a little (a
// pause instruction per pass: work that arrives within microseconds is
// caught at once), then sleeps a short while per further empty pass, so that
// a loop on a shared CPU gives the CPU back to the trainer and to its peers.
// sleep_us = 0 is pure polling, for a dedicated core. One set of defaults
// (IdleOptions) serves every loop; the apps and the job file override them.
//
// How a loop uses it: once per pass, `if (backoff.after_pass(work))` sleep
// for backoff.sleep_us() on whatever can wake it early (the worker's
// doorbell), or call backoff.idle(work), which sleeps with nanosleep.
//
// Threads: an IdleBackoff belongs to its loop's thread. Costs: a compare and
// a pause per empty pass; nothing allocates, locks or logs.
#pragma once

#include <rte_cycles.h>
#include <rte_pause.h>

#include <cstdint>

namespace mercury::net {

struct IdleOptions {
  uint32_t spins = 256;    ///< empty passes with a pause before the loop sleeps
  uint32_t sleep_us = 20;  ///< per empty pass after that; 0 = never sleep (dedicated core)
};

class IdleBackoff {
 public:
  explicit IdleBackoff(const IdleOptions& options = {}) : options_(options) {}

  /// After a pass that did `work` (packets, requests, items: 0 = nothing).
  /// Returns true when the loop should sleep now, for sleep_us(); otherwise
  /// it has paused (or, after work, returned at once).
  bool after_pass(uint32_t work) {
    if (work != 0) {
      empty_ = 0;
      return false;
    }
    if (options_.sleep_us == 0 || empty_ < options_.spins) {
      ++empty_;
      rte_pause();
      return false;
    }
    ++sleeps_;
    return true;
  }

  /// after_pass(work), sleeping sleep_us() in the kernel when it says so.
  void idle(uint32_t work) {
    if (after_pass(work)) rte_delay_us_sleep(options_.sleep_us);
  }

  [[nodiscard]] uint32_t sleep_us() const { return options_.sleep_us; }
  /// Times the loop was told to sleep.
  [[nodiscard]] uint64_t sleeps() const { return sleeps_; }
  [[nodiscard]] const IdleOptions& options() const { return options_; }

 private:
  IdleOptions options_;
  uint32_t empty_ = 0;
  uint64_t sleeps_ = 0;
};

}  // namespace mercury::net
