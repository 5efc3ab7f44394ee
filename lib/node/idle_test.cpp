// The idle back-off's two modes, under a fake clock (1 tick = 1 us): busy
// never gives the CPU up; adaptive pauses, then yields until yield_us of
// empty passes have gone by, then asks to sleep, each sleep twice the one
// before up to max_sleep_us; any work starts it over.
#include "node/idle.h"

#include <gtest/gtest.h>

#include <vector>

namespace mercury::node {
namespace {

constexpr uint64_t kTickHz = 1'000'000;

TEST(IdleBackoff, BusyNeverYieldsNorSleeps) {
  IdleBackoff b({.mode = config::Poll::kBusy, .spins = 4, .yield_us = 10, .sleep_us = 20}, kTickHz);
  for (uint64_t t = 0; t < 100'000; t += 7) EXPECT_FALSE(b.after_pass(0, t)) << t;
  EXPECT_EQ(b.yields(), 0u);
  EXPECT_EQ(b.sleeps(), 0u);
}

TEST(IdleBackoff, AdaptivePausesThenYieldsThenSleeps) {
  IdleBackoff b({.mode = config::Poll::kAdaptive, .spins = 4, .yield_us = 100, .sleep_us = 20},
                kTickHz);
  uint64_t t = 1000;
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(b.after_pass(0, t++));  // the spins
  EXPECT_EQ(b.yields(), 0u);
  // Yields from the first pass past the spins (at 1004) until 100 us later.
  for (; t < 1104; t += 10) EXPECT_FALSE(b.after_pass(0, t)) << t;
  EXPECT_EQ(b.yields(), 10u);
  EXPECT_EQ(b.sleeps(), 0u);
  EXPECT_TRUE(b.after_pass(0, 1104));
  EXPECT_EQ(b.sleep_us(), 20u);
  EXPECT_TRUE(b.after_pass(0, 5000));
  EXPECT_EQ(b.sleeps(), 2u);
  EXPECT_EQ(b.sleep_us(), 40u);
}

// Each sleep of one idle stretch is twice the one before, up to
// max_sleep_us; work starts the next stretch's sleeps from sleep_us again.
TEST(IdleBackoff, SleepsGrowToTheCapAndWorkResetsThem) {
  IdleBackoff b({.mode = config::Poll::kAdaptive,
                 .spins = 0,
                 .yield_us = 0,
                 .sleep_us = 20,
                 .max_sleep_us = 200},
                kTickHz);
  std::vector<uint32_t> got;
  uint64_t t = 0;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(b.after_pass(0, ++t));
    got.push_back(b.sleep_us());
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{20, 40, 80, 160, 200, 200}));
  EXPECT_FALSE(b.after_pass(1, ++t));
  ASSERT_TRUE(b.after_pass(0, ++t));
  EXPECT_EQ(b.sleep_us(), 20u);
  ASSERT_TRUE(b.after_pass(0, ++t));
  EXPECT_EQ(b.sleep_us(), 40u);
}

// keep_short(): this sleep and the next at sleep_us, then growing again.
TEST(IdleBackoff, KeepShortStartsTheGrowthOver) {
  IdleBackoff b({.mode = config::Poll::kAdaptive,
                 .spins = 0,
                 .yield_us = 0,
                 .sleep_us = 10,
                 .max_sleep_us = 80},
                kTickHz);
  uint64_t t = 0;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b.after_pass(0, ++t));
  EXPECT_EQ(b.sleep_us(), 80u);
  b.keep_short();
  EXPECT_EQ(b.sleep_us(), 10u);
  ASSERT_TRUE(b.after_pass(0, ++t));
  EXPECT_EQ(b.sleep_us(), 10u);
  ASSERT_TRUE(b.after_pass(0, ++t));
  EXPECT_EQ(b.sleep_us(), 20u);
}

// A cap below sleep_us never shortens the sleeps.
TEST(IdleBackoff, ACapBelowTheFirstSleepKeepsTheFirstSleep) {
  IdleBackoff b({.mode = config::Poll::kAdaptive,
                 .spins = 0,
                 .yield_us = 0,
                 .sleep_us = 50,
                 .max_sleep_us = 10},
                kTickHz);
  for (uint64_t t = 1; t < 5; ++t) {
    ASSERT_TRUE(b.after_pass(0, t));
    EXPECT_EQ(b.sleep_us(), 50u) << t;
  }
}

TEST(IdleBackoff, WorkStartsItOver) {
  IdleBackoff b({.mode = config::Poll::kAdaptive, .spins = 2, .yield_us = 50, .sleep_us = 20},
                kTickHz);
  uint64_t t = 0;
  while (!b.after_pass(0, t)) ++t;   // into the sleeps
  EXPECT_EQ(t, 2u + 50u);            // two spins, then 50 us of yields
  EXPECT_FALSE(b.after_pass(3, t));  // work: nothing to wait for
  // The spins again, and the yield window measured from the new idle start.
  EXPECT_FALSE(b.after_pass(0, t + 1));
  EXPECT_FALSE(b.after_pass(0, t + 2));
  const uint64_t yields = b.yields();
  EXPECT_FALSE(b.after_pass(0, t + 3));
  EXPECT_EQ(b.yields(), yields + 1);
  EXPECT_FALSE(b.after_pass(0, t + 3 + 49));
  EXPECT_TRUE(b.after_pass(0, t + 3 + 50));
}

TEST(IdleBackoff, DefaultsAreAdaptive) {
  const IdleOptions o;
  EXPECT_EQ(o.mode, config::Poll::kAdaptive);
  EXPECT_EQ(o.spins, 16u);
  EXPECT_EQ(o.yield_us, 2000u);
  EXPECT_EQ(o.sleep_us, 20u);
  EXPECT_EQ(o.max_sleep_us, 1000u);
}

}  // namespace
}  // namespace mercury::node
