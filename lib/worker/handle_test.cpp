#include "worker/handle.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace mercury::worker {
namespace {

TEST(Handle, PendingUntilCompleted) {
  Handle h;
  EXPECT_FALSE(h.ready());
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(h.status(), Handle::Status::kPending);
  EXPECT_TRUE(h.error().empty());
  EXPECT_TRUE(h.complete());
  EXPECT_TRUE(h.ready());
  EXPECT_TRUE(h.ok());
  EXPECT_TRUE(h.wait());
  EXPECT_TRUE(h.error().empty());
}

TEST(Handle, CopiesShareOneState) {
  Handle a;
  const Handle b = a;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a == Handle());
  b.complete();
  EXPECT_TRUE(a.ready());
  EXPECT_TRUE(Handle::completed().ok());
}

TEST(Handle, FailCarriesTheMessage) {
  Handle h;
  EXPECT_TRUE(h.fail("peer s1 (10.0.0.2:47100) did not acknowledge for 5000 ms"));
  EXPECT_TRUE(h.ready());
  EXPECT_FALSE(h.ok());
  EXPECT_FALSE(h.wait());
  EXPECT_EQ(h.status(), Handle::Status::kFailed);
  EXPECT_EQ(h.error(), "peer s1 (10.0.0.2:47100) did not acknowledge for 5000 ms");
}

TEST(Handle, LongErrorIsTruncatedNotAllocated) {
  Handle h;
  const std::string long_text(1000, 'x');
  h.fail(long_text);
  EXPECT_EQ(h.error().size(), kMaxErrorBytes);
  EXPECT_EQ(h.error(), long_text.substr(0, kMaxErrorBytes));
}

TEST(Handle, CallbackRunsAtOnceWhenAlreadyComplete) {
  Handle h;
  h.complete();
  std::thread::id ran_on;
  int runs = 0;
  h.on_complete([&](const Handle& done) {
    EXPECT_TRUE(done.ok());
    ran_on = std::this_thread::get_id();
    ++runs;
  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(Handle, CallbacksRunOnTheCompletingThreadOnceEachInOrder) {
  Handle h;
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 5; ++i) {
    h.on_complete([&, i](const Handle& done) {
      EXPECT_FALSE(done.ok());
      EXPECT_EQ(done.error(), "shard 1 gone");
      order.push_back(i);
      ran_on = std::this_thread::get_id();
    });
  }
  EXPECT_TRUE(order.empty());
  std::thread completer([&] { h.fail("shard 1 gone"); });
  const std::thread::id completer_id = completer.get_id();
  completer.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ran_on, completer_id);
}

#ifdef NDEBUG
TEST(Handle, SecondCompletionIsRefusedAndCounted) {
  Handle h;
  int runs = 0;
  h.on_complete([&](const Handle&) { ++runs; });
  EXPECT_TRUE(h.complete());
  EXPECT_FALSE(h.fail("late failure"));
  EXPECT_FALSE(h.complete());
  EXPECT_EQ(h.extra_completions(), 2u);
  EXPECT_TRUE(h.ok());  // the first outcome stands
  EXPECT_TRUE(h.error().empty());
  EXPECT_EQ(runs, 1);
}
#else
TEST(HandleDeathTest, SecondCompletionAsserts) {
  Handle h;
  h.complete();
  EXPECT_DEATH(h.complete(), "completed twice");
}
#endif

TEST(Handle, UncompletedHandleWithCallbacksIsFreed) {
  // The callback list of a handle that never completes is freed with it
  // (checked by ASan/valgrind builds; here: no crash, callback not run).
  bool ran = false;
  {
    Handle h;
    h.on_complete([&](const Handle&) { ran = true; });
  }
  EXPECT_FALSE(ran);
}

// Many trainer threads (TBB tasks) wait on and register callbacks with the
// same handles while another thread completes them at an arbitrary moment:
// every waiter returns, every callback runs exactly once, none is lost.
TEST(Handle, ManyWaitersAndCallbacksRaceCompletion) {
  constexpr int kRounds = 300;
  constexpr int kTasks = 64;
  // More threads than cores, so that blocked waiters and running tasks mix.
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 8);
  tbb::task_arena arena(8);
  for (int round = 0; round < kRounds; ++round) {
    Handle h;
    const bool failed = round % 3 == 0;
    std::atomic<int> callbacks{0};
    std::atomic<int> woken{0};
    std::atomic<int> started{0};
    std::thread completer([&] {
      // Complete at a varying moment: before any task ran, or after one
      // started plus a varying delay. (Never wait for more tasks than can
      // run at once: blocked waiters hold their threads.)
      while (started.load(std::memory_order_relaxed) < round % 2) std::this_thread::yield();
      for (int i = 0; i < round % 50; ++i) std::this_thread::yield();
      if (failed) {
        h.fail("peer w3 unreachable");
      } else {
        h.complete();
      }
    });
    arena.execute([&] {
      tbb::parallel_for(0, kTasks, [&](int i) {
        started.fetch_add(1, std::memory_order_relaxed);
        const Handle mine = h;
        if (i % 2 == 0) {
          EXPECT_EQ(mine.wait(), !failed);
          EXPECT_TRUE(mine.ready());
          if (failed) {
            EXPECT_EQ(mine.error(), "peer w3 unreachable");
          }
          woken.fetch_add(1, std::memory_order_relaxed);
        } else {
          mine.on_complete([&](const Handle& done) {
            EXPECT_TRUE(done.ready());
            EXPECT_EQ(done.ok(), !failed);
            callbacks.fetch_add(1, std::memory_order_relaxed);
          });
        }
      });
    });
    completer.join();
    EXPECT_EQ(woken.load(), kTasks / 2) << "round " << round;
    EXPECT_EQ(callbacks.load(), kTasks / 2) << "round " << round;
    EXPECT_EQ(h.extra_completions(), 0u);
  }
}

// Bytes written before complete() are visible to a waiter after wait():
// the release/acquire pairing the net core relies on when it places a
// pulled tensor and then completes its handle.
TEST(Handle, WaitSeesWritesMadeBeforeCompletion) {
  constexpr int kRounds = 500;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<int> data(64, 0);
    Handle h;
    std::thread producer([&] {
      for (int& x : data) x = round;
      h.complete();
    });
    h.wait();
    for (int x : data) ASSERT_EQ(x, round);
    producer.join();
  }
}

}  // namespace
}  // namespace mercury::worker
