// The idle policy of node::Loop (loop.h), which runs every poll loop of
// Mercury: the server's net core, its shard cores and the worker's net core.
//
// What it is for. A poll loop that finds nothing to do must not keep a CPU
// that another thread needs: on a machine where the nodes, their shard cores
// and the trainers outnumber the CPUs, a loop that spins while it waits for a
// packet holds the CPU for its whole time slice, and the thread that would
// send that packet (a peer's net core, a shard core, the trainer) waits behind
// it. Timed sleeps are no answer either: the kernel rounds a 20 us sleep up to
// 80-120 us in this VM, so a loop that sleeps finds a full ring on waking.
//
// The two modes (config::Poll, the job file's `network.poll` or a node's own
// `poll`):
//   * busy: spin with a pause per empty pass, never give the CPU up. For a
//     node on dedicated cores (isolated, one poller per CPU).
//   * adaptive (the default): after `spins` empty passes, give the CPU to any
//     runnable thread (sched_yield) on each further empty pass; the loop runs
//     again as soon as nothing else wants the CPU, so a packet is seen within
//     microseconds of its arrival whenever a CPU is free. After `yield_us` of
//     nothing but empty passes (the job is idle: between rounds, a trainer
//     computing), it sleeps per empty pass, on whatever can wake it early (the
//     worker's doorbell) or with a timeout: `sleep_us` first, each further
//     sleep twice the one before, up to `max_sleep_us`. A loop idle for long
//     wakes rarely: each wake-up costs a timer interrupt and a pass (several
//     microseconds in a VM), and seven loops waking every 100 us took a
//     quarter of a CPU from the trainers while they computed. The first
//     packet after a long idle waits at most `max_sleep_us`; work within
//     `yield_us` of the last never waits for a sleep.
// benchmarks/README.md ("Measured design decisions") has the measurement that
// chose these defaults over spinning and over timed sleeps.
//
// How the loop uses it: once per pass, `if (backoff.after_pass(work, now))`
// the loop may sleep for sleep_us(), on its doorbell (so a producer can wake
// it early), once every poller agrees (Poller::may_sleep_st). `now` is the
// loop's clock in ticks of `tick_hz` (the TSC in the datapath; any clock in
// tests).
//
// Threads: an IdleBackoff belongs to its loop's thread. Costs: a compare and
// a pause per empty pass while it spins, a sched_yield system call per empty
// pass while it yields; nothing allocates, locks or logs.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>

#include "config/config.h"

namespace mercury::node {

struct IdleOptions {
  config::Poll mode = config::Poll::kAdaptive;
  uint32_t spins = 16;           ///< adaptive: empty passes with a pause before the loop yields
  uint32_t yield_us = 2000;      ///< adaptive: then it yields per empty pass for this long
  uint32_t sleep_us = 20;        ///< adaptive: then it sleeps this long per empty pass,
  uint32_t max_sleep_us = 1000;  ///< each sleep twice the one before, up to this
};

class IdleBackoff {
 public:
  /// `tick_hz`: the rate of the clock after_pass() is given.
  IdleBackoff(const IdleOptions& options, uint64_t tick_hz)
      : options_(options),
        yield_ticks_(tick_hz * options.yield_us / 1000000),
        next_sleep_us_(options.sleep_us) {}

  /// After a pass that did `work` (packets, requests, items: 0 = nothing),
  /// at `now`. Returns true when the loop should sleep now, for sleep_us();
  /// otherwise it has paused or yielded (or, after work, returned at once).
  bool after_pass(uint32_t work, uint64_t now) {
    if (work != 0) {
      empty_ = 0;
      next_sleep_us_ = options_.sleep_us;
      return false;
    }
    if (options_.mode == config::Poll::kBusy || empty_ < options_.spins) {
      if (empty_ < options_.spins) ++empty_;
      _mm_pause();
      return false;
    }
    if (empty_ == options_.spins) {  // the first pass past the spins
      ++empty_;
      idle_since_ = now;
    }
    if (now - idle_since_ < yield_ticks_) {
      ++yields_;
      sched_yield();
      return false;
    }
    ++sleeps_;
    sleep_us_ = next_sleep_us_;
    next_sleep_us_ =
        std::min(next_sleep_us_ * 2, std::max(options_.max_sleep_us, options_.sleep_us));
    return true;
  }

  /// After after_pass() returned true: this sleep and the next are the
  /// shortest (a poller holds work due soon, Poller::may_sleep_long_st).
  void keep_short() {
    sleep_us_ = options_.sleep_us;
    next_sleep_us_ = options_.sleep_us;
  }

  /// How long to sleep after after_pass() returned true.
  [[nodiscard]] uint32_t sleep_us() const { return sleep_us_; }
  /// Times the loop gave its CPU up (sched_yield), and was told to sleep.
  [[nodiscard]] uint64_t yields() const { return yields_; }
  [[nodiscard]] uint64_t sleeps() const { return sleeps_; }
  [[nodiscard]] const IdleOptions& options() const { return options_; }

 private:
  IdleOptions options_;
  uint64_t yield_ticks_;
  uint32_t empty_ = 0;
  uint64_t idle_since_ = 0;
  uint32_t next_sleep_us_;
  uint32_t sleep_us_ = 0;
  uint64_t yields_ = 0;
  uint64_t sleeps_ = 0;
};

}  // namespace mercury::node
