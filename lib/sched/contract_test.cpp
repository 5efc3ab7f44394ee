// The single-consumer contract of PortScheduler, checked where it is enforced:
// this binary compiles the scheduler with the owner checks on
// (MERCURY_OWNER_CHECKS=1, see meson.build) whatever the build's
// owner_checks, so the check really runs in CI.
#include <gtest/gtest.h>

#include <thread>

#include "sched/message.h"
#include "sched/port_scheduler.h"

namespace mercury::sched {
namespace {

TEST(SchedDeathTest, SecondConsumerThreadIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        MessagePool pool(1);
        SchedulerConfig config;
        PortScheduler sched(config, pool);
        sched.drain_ingress_st();  // binds this thread as the consumer
        std::thread other([&] { sched.drain_ingress_st(); });
        other.join();
      },
      "drain_ingress_st called on thread .*, but its object belongs to thread");
}

// Handed over, the consumer role moves to the next thread that calls.
TEST(SchedDeathTest, AHandedOverConsumerMoves) {
  MessagePool pool(1);
  SchedulerConfig config;
  PortScheduler sched(config, pool);
  sched.drain_ingress_st();
  sched.hand_over_consumer();
  std::thread other([&] { EXPECT_EQ(sched.drain_ingress_st(), 0u); });
  other.join();
}

TEST(SchedDeathTest, TheSameThreadMayCallAgain) {
  MessagePool pool(1);
  SchedulerConfig config;
  PortScheduler sched(config, pool);
  EXPECT_EQ(sched.drain_ingress_st(), 0u);
  EXPECT_EQ(sched.drain_ingress_st(), 0u);
}

}  // namespace
}  // namespace mercury::sched
