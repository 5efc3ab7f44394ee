// The loop of pollers under a fake clock: pass order, tasks on their periods,
// stopping from inside, and the idle policy's rule that the loop sleeps only
// when every poller agrees (and wakes when its doorbell rings).
#include "node/loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace mercury::node {
namespace {

constexpr uint64_t kHz = 1'000'000;  // 1 tick = 1 us

class Recorder final : public Poller {
 public:
  Recorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(log) {}
  uint32_t poll_st(Tick now) override {
    log_.push_back(name_ + "@" + std::to_string(now));
    return work;
  }
  bool may_sleep_st() override {
    ++asked;
    return sleepy.load();
  }
  bool may_sleep_long_st() override { return long_sleepy; }
  uint32_t work = 0;
  std::atomic<bool> sleepy{true};
  bool long_sleepy = true;
  uint32_t asked = 0;

 private:
  std::string name_;
  std::vector<std::string>& log_;
};

TEST(Loop, APassPollsInOrderThenRunsTheTasksThatAreDue) {
  std::vector<std::string> log;
  Recorder a("a", log), b("b", log);
  Loop loop({.tick_hz = kHz});
  loop.add(a);
  loop.add(b);
  std::vector<Tick> ticks;
  loop.every(100, [&](Tick now) {
    ticks.push_back(now);
    log.push_back("task");
  });
  a.work = 2;
  b.work = 3;
  EXPECT_EQ(loop.pass_st(10), 5u);
  EXPECT_EQ(log, (std::vector<std::string>{"a@10", "b@10", "task"}));
  for (Tick t = 20; t <= 400; t += 10) loop.pass_st(t);
  // The first pass runs the task; then the first pass 100 ticks after its last run.
  EXPECT_EQ(ticks, (std::vector<Tick>{10, 110, 210, 310}));
  EXPECT_EQ(loop.passes(), 40u);
}

TEST(Loop, RunStopsWhenAPollerSaysSo) {
  std::vector<std::string> log;
  class Stopper final : public Poller {
   public:
    explicit Stopper(Loop& l) : loop(l) {}
    uint32_t poll_st(Tick) override {
      if (++passes == 7) loop.stop_st();
      return 1;
    }
    Loop& loop;
    int passes = 0;
  };
  Loop loop({.tick_hz = kHz});
  Stopper s(loop);
  loop.add(s);
  loop.run();
  EXPECT_EQ(s.passes, 7);
  EXPECT_TRUE(loop.stopping_st());
}

TEST(Loop, RunStopsOnTheOutsideFlag) {
  std::vector<std::string> log;
  Recorder a("a", log);
  a.work = 1;
  Loop loop({.tick_hz = kHz});
  loop.add(a);
  std::atomic<bool> stop{true};
  loop.run(stop);
  EXPECT_TRUE(log.empty());
}

// An idle loop whose every poller agrees sleeps; one poller that says no
// keeps it awake (it only pauses and yields).
TEST(Loop, SleepsOnlyWhenEveryPollerAgrees) {
  std::vector<std::string> log;
  Recorder a("a", log), b("b", log);
  const IdleOptions idle{
      .mode = config::Poll::kAdaptive, .spins = 2, .yield_us = 0, .sleep_us = 1, .max_sleep_us = 1};
  static std::atomic<Tick> clock{0};
  auto tick = []() -> Tick { return clock.fetch_add(1) + 1; };
  {
    Loop loop({.idle = idle, .tick_hz = kHz});
    loop.add(a);
    loop.add(b);
    b.sleepy = false;
    loop.every(1, [&](Tick) {
      if (loop.passes() >= 200) loop.stop_st();
    });
    loop.run(std::atomic<bool>{false}, +tick);
    EXPECT_EQ(loop.sleeps(), 0u);
    EXPECT_GT(b.asked, 100u);
  }
  {
    log.clear();
    b.sleepy = true;
    Loop loop({.idle = idle, .tick_hz = kHz});
    loop.add(a);
    loop.add(b);
    loop.every(1, [&](Tick) {
      if (loop.passes() >= 50) loop.stop_st();
    });
    loop.run(std::atomic<bool>{false}, +tick);
    EXPECT_GT(loop.sleeps(), 40u);  // every pass after the two spins
  }
}

// An idle loop's sleeps grow while every poller lets them; one poller that
// holds work due soon (may_sleep_long_st) keeps each at the shortest.
TEST(Loop, APollerWithWorkDueKeepsTheSleepsShort) {
  std::vector<std::string> log;
  Recorder a("a", log), b("b", log);
  const IdleOptions idle{
      .mode = config::Poll::kAdaptive, .spins = 0, .yield_us = 0, .sleep_us = 1, .max_sleep_us = 8};
  static std::atomic<Tick> clock{0};
  auto tick = []() -> Tick { return clock.fetch_add(1) + 1; };
  for (const bool long_sleepy : {true, false}) {
    b.long_sleepy = long_sleepy;
    Loop loop({.idle = idle, .tick_hz = kHz});
    loop.add(a);
    loop.add(b);
    loop.every(1, [&](Tick) {
      if (loop.passes() >= 20) loop.stop_st();
    });
    loop.run(std::atomic<bool>{false}, +tick);
    EXPECT_GT(loop.sleeps(), 10u);
    EXPECT_EQ(loop.idle().sleep_us(), long_sleepy ? 8u : 1u) << long_sleepy;
  }
}

// A loop asleep on its doorbell (a long sleep) is woken by a ring from
// another thread, as a trainer's request wakes the worker's net core.
TEST(Loop, ARingWakesASleepingLoop) {
  std::vector<std::string> log;
  Recorder a("a", log);
  const IdleOptions idle{
      .mode = config::Poll::kAdaptive, .spins = 0, .yield_us = 0, .sleep_us = 60'000'000};
  Loop loop({.idle = idle, .tick_hz = kHz});
  loop.add(a);
  std::atomic<int> rings{0};
  loop.every(1, [&](Tick) {
    if (rings.load() >= 3) loop.stop_st();
  });
  std::thread ringer([&] {
    // Each ring wakes one 60 s sleep; three of them end the test in far less.
    for (int i = 0; i < 3; ++i) {
      while (loop.sleeps() <= static_cast<uint64_t>(i)) std::this_thread::yield();
      rings.fetch_add(1);
      loop.doorbell().ring();
    }
  });
  loop.run();
  ringer.join();
  EXPECT_GE(loop.sleeps(), 3u);
}

// A poller's slow work runs on its own period; a removed poller runs no
// more, nor does its slow work.
TEST(Loop, SlowWorkOnThePollersPeriodAndRemoval) {
  class Slow final : public Poller {
   public:
    explicit Slow(Tick period) : period_(period) {}
    uint32_t poll_st(Tick) override { return ++polls, 0; }
    [[nodiscard]] Tick slow_period() const override { return period_; }
    void slow_st(Tick now) override { runs.push_back(now); }
    uint32_t polls = 0;
    std::vector<Tick> runs;

   private:
    Tick period_;
  };
  Loop loop({.tick_hz = kHz});
  Slow a(50), none(0);
  loop.add(a);
  loop.add(none);
  EXPECT_TRUE(loop.contains(a));
  for (Tick t = 0; t < 200; t += 10) loop.pass_st(t);
  EXPECT_EQ(a.runs, (std::vector<Tick>{0, 50, 100, 150}));
  EXPECT_TRUE(none.runs.empty());
  loop.remove(a);
  EXPECT_FALSE(loop.contains(a));
  for (Tick t = 200; t < 400; t += 10) loop.pass_st(t);
  EXPECT_EQ(a.polls, 20u);
  EXPECT_EQ(a.runs.size(), 4u);
  EXPECT_EQ(none.polls, 40u);
}

TEST(Loop, ClockRateIsRequired) { EXPECT_THROW(Loop({.tick_hz = 0}), std::invalid_argument); }

}  // namespace
}  // namespace mercury::node
