#include "node/loop.h"

#include <x86intrin.h>

#include <algorithm>
#include <stdexcept>

namespace mercury::node {

Tick tsc_now() noexcept { return __rdtsc(); }

Loop::Loop(const LoopOptions& options)
    : backoff_(options.idle, options.tick_hz),
      doorbell_(options.doorbell != nullptr ? options.doorbell : &own_doorbell_),
      tick_hz_(options.tick_hz) {
  if (options.tick_hz == 0) throw std::invalid_argument("node::Loop: tick_hz must be set");
}

void Loop::add(Poller& p) {
  pollers_.push_back(&p);
  if (const Tick period = p.slow_period(); period != 0) {
    tasks_.push_back(Task{period, 0, false, {}, &p});
  }
}

void Loop::remove(Poller& p) {
  std::erase(pollers_, &p);
  std::erase_if(tasks_, [&p](const Task& t) { return t.poller == &p; });
}

bool Loop::contains(const Poller& p) const {
  return std::find(pollers_.begin(), pollers_.end(), &p) != pollers_.end();
}

void Loop::every(Tick period, std::function<void(Tick)> task) {
  tasks_.push_back(Task{period, 0, false, std::move(task), nullptr});
}

uint32_t Loop::pass_st(Tick now) {
  MERCURY_OWNED(owner_);
  uint32_t work = 0;
  for (Poller* p : pollers_) work += p->poll_st(now);
  for (Task& t : tasks_) {
    if (t.ran && now - t.last < t.period) continue;
    t.ran = true;
    t.last = now;
    if (t.poller != nullptr) {
      t.poller->slow_st(now);
    } else {
      t.run(now);
    }
  }
  ++passes_;
  return work;
}

void Loop::run() {
  const std::atomic<bool> never{false};
  run(never);
}

void Loop::run(const std::atomic<bool>& stop, Tick (*clock)()) {
  MERCURY_OWNED(owner_);
  while (!stopping_ && !stop.load(std::memory_order_relaxed)) {
    const Tick now = clock();
    const uint32_t work = pass_st(now);
    if (stopping_ || !backoff_.after_pass(work, now)) continue;
    // Every poller found nothing for the policy's while: the loop sleeps if
    // they all agree, asked with the doorbell armed so that a producer who
    // queues work after its poller answered rings the sleep awake.
    const uint32_t ticket = doorbell_->arm();
    bool agreed = true;
    for (Poller* p : pollers_) {
      if (!p->may_sleep_st()) {
        agreed = false;
        break;
      }
    }
    if (agreed) {
      for (Poller* p : pollers_) {
        if (!p->may_sleep_long_st()) {
          backoff_.keep_short();
          break;
        }
      }
      std::atomic_ref<uint64_t>(sleeps_).store(sleeps_ + 1, std::memory_order_relaxed);
      doorbell_->sleep(ticket, backoff_.sleep_us());
    } else {
      doorbell_->disarm();
    }
  }
}

}  // namespace mercury::node
