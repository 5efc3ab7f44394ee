// node::Loop: the one poll loop of Mercury. Every thread that polls (the
// server's net core, each shard core, the worker's net core, a test or a
// demo driving several nodes on one thread) runs a Loop of registered
// pollers; nothing else writes a `while (running)` over a port or a ring.
//
// One pass (pass_st(now)): every poller's poll_st(now) in the order they
// were added, then the slow work that is due (each poller's slow_st(), and
// the tasks added with every(), each on its own period of the loop's
// clock). The work the pollers report decides
// the idle policy (idle.h): after enough empty passes the loop may sleep, on
// its Doorbell, for the policy's sleep_us — but only when every poller
// agrees (may_sleep_st(), asked with the doorbell armed, so that what a
// producer queues after the question rings it awake). That is Seastar's
// reactor: the pollers decide together, and a sleeping loop is woken by
// whoever has work for it.
//
// Time. run() reads the clock once per pass (the TSC by default) and hands
// `now` down; pass_st(now) lets a test or an owner that keeps its own time
// drive the loop, so everything on it runs under a fake clock in unit tests.
//
// Threads. add(), every() and the constructor are control path, before the
// loop runs. run() and pass_st() belong to the loop's thread (the first call
// claims the loop, base/owner.h), and so do its pollers: their own _st
// entry points assert it (each object is claimed by its first _st call, or
// handed over where the code says so). stop_st() is
// for pollers and tasks (they run on the loop's thread); a `stop` flag given
// to run() may be set from anywhere. doorbell() may be rung from any thread.
//
// Costs per pass: one virtual call per poller and a compare per task; an
// empty pass also runs the idle policy (a pause, a sched_yield or a sleep).
// Nothing allocates, locks or logs after the first pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/owner.h"
#include "node/doorbell.h"
#include "node/idle.h"

namespace mercury::node {

using Tick = uint64_t;

/// The TSC now (what run() passes down by default).
Tick tsc_now() noexcept;

/// One concern a loop runs every pass: a port's endpoint, a ring's
/// consumer, a queue of requests.
class Poller {
 public:
  /// One pass at `now`; returns the work done (packets, requests, items;
  /// 0 = nothing, which lets the loop back off).
  virtual uint32_t poll_st(Tick now) = 0;
  /// The loop is about to sleep: false keeps it awake (something is
  /// pending that a sleep would delay). Asked with the loop's doorbell
  /// armed, after a pass in which every poller found nothing to do.
  virtual bool may_sleep_st() { return true; }
  /// Asked after may_sleep_st() said yes: false keeps this sleep at the
  /// policy's shortest (IdleOptions::sleep_us) instead of the growing one,
  /// for a poller that holds work due at a time of its own (a frame in a
  /// port's staging or its link emulator's delay line).
  virtual bool may_sleep_long_st() { return true; }
  /// Slow work (timers, liveness, publishing counters): slow_st(now) runs
  /// after the pollers of the first pass that comes slow_period() ticks or
  /// more after its last run. 0 (the default): none. Read once, by add().
  [[nodiscard]] virtual Tick slow_period() const { return 0; }
  virtual void slow_st(Tick) {}

  virtual ~Poller() = default;
};

struct LoopOptions {
  IdleOptions idle;      ///< busy or adaptive, and the adaptive timings
  uint64_t tick_hz = 0;  ///< the rate of the clock passes are given (TSC Hz); required
  /// What the loop sleeps on, when its producers hold it (a worker's
  /// trainer side rings its own); null: the loop's own.
  Doorbell* doorbell = nullptr;
};

class Loop {
 public:
  /// Throws std::invalid_argument when tick_hz is 0.
  explicit Loop(const LoopOptions& options);
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  /// Control path: runs `p` every pass, after those added before it, and
  /// its slow work on its period. `p` must outlive the loop, or be removed.
  void add(Poller& p);
  /// Control path, or the loop's thread between passes: `p` runs no more.
  void remove(Poller& p);
  /// Whether `p` is one of the loop's pollers.
  [[nodiscard]] bool contains(const Poller& p) const;
  /// Control path: runs `task(now)` after the pollers of the first pass
  /// that comes `period` ticks or more after its last run (the first pass
  /// runs it at once).
  void every(Tick period, std::function<void(Tick)> task);

  /// One pass at `now`: every poller, then the tasks that are due. Returns
  /// the pollers' work. No idle policy (the caller keeps time and pace).
  uint32_t pass_st(Tick now);
  /// Passes until `stop` is set or a poller or task calls stop_st(),
  /// reading `clock` once per pass and backing off when idle.
  void run(const std::atomic<bool>& stop, Tick (*clock)() = &tsc_now);
  /// run() without an outside flag: until stop_st().
  void run();
  /// The loop's thread (a poller or a task): run() returns after this pass.
  void stop_st() { stopping_ = true; }
  [[nodiscard]] bool stopping_st() const { return stopping_; }

  /// What a producer on another thread rings after handing this loop work.
  [[nodiscard]] Doorbell& doorbell() { return *doorbell_; }
  [[nodiscard]] const IdleBackoff& idle() const { return backoff_; }
  [[nodiscard]] uint64_t passes() const { return passes_; }
  /// Times run() slept on the doorbell (every poller agreed). Any thread.
  [[nodiscard]] uint64_t sleeps() const {
    return std::atomic_ref<const uint64_t>(sleeps_).load(std::memory_order_relaxed);
  }
  [[nodiscard]] uint64_t tick_hz() const { return tick_hz_; }

 private:
  struct Task {
    Tick period;
    Tick last;
    bool ran;
    std::function<void(Tick)> run;
    Poller* poller;  // a poller's slow work (run is empty), or null
  };
  std::vector<Poller*> pollers_;
  std::vector<Task> tasks_;
  IdleBackoff backoff_;
  Doorbell own_doorbell_;
  Doorbell* doorbell_;
  uint64_t tick_hz_;
  uint64_t passes_ = 0;
  uint64_t sleeps_ = 0;
  bool stopping_ = false;
  base::Owner owner_;
};

}  // namespace mercury::node
