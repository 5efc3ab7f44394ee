// The single-consumer contract of PortScheduler, checked where it is enforced:
// this binary compiles the scheduler with assertions on (-UNDEBUG, see
// meson.build) whatever the build type, so the check really runs in CI.
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
      "second thread");
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
