#include "sched/message.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mercury::sched {
namespace {

TEST(MessagePool, ExhaustionReturnsNullAndRecovers) {
  MessagePool pool(4);
  std::vector<Message*> taken;
  for (int i = 0; i < 4; ++i) {
    Message* m = pool.alloc();
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(pool.owns(m));
    taken.push_back(m);
  }
  EXPECT_EQ(pool.alloc(), nullptr);
  EXPECT_EQ(pool.alloc(), nullptr);
  EXPECT_EQ(pool.alloc_failed(), 2u);
  // All four are distinct descriptors.
  for (size_t i = 0; i < taken.size(); ++i) {
    for (size_t j = i + 1; j < taken.size(); ++j) EXPECT_NE(taken[i], taken[j]);
  }
  pool.free(taken[2]);
  EXPECT_EQ(pool.alloc(), taken[2]);  // LIFO: the freed one comes back
  EXPECT_EQ(pool.alloc(), nullptr);
}

TEST(MessagePool, AllocResetsPublicFields) {
  MessagePool pool(1);
  Message* m = pool.alloc();
  m->len = 99;
  m->cookie = 7;
  m->priority = 3;
  pool.free(m);
  m = pool.alloc();
  EXPECT_EQ(m->len, 0u);
  EXPECT_EQ(m->cookie, 0u);
  EXPECT_EQ(m->priority, 0u);
}

// Counts live instances, so that construction and destruction are seen.
struct Counted {
  static inline int live = 0;
  uint64_t value = 7;
  Counted() { ++live; }
  ~Counted() { --live; }
};

TEST(HugeArray, ValueInitialisedAlignedAndDestroyed) {
  {
    HugeArray<uint64_t> small(10);
    ASSERT_EQ(small.size(), 10u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
    for (size_t i = 0; i < small.size(); ++i) EXPECT_EQ(small[i], 0u);

    // From 2 MB up the array starts on a huge page boundary.
    const size_t n = HugeArray<Counted>::kHugePage / sizeof(Counted) + 1;
    HugeArray<Counted> big(n);
    EXPECT_EQ(Counted::live, static_cast<int>(n));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % HugeArray<Counted>::kHugePage, 0u);
    EXPECT_EQ(big[0].value, 7u);
    EXPECT_EQ(big[n - 1].value, 7u);

    HugeArray<Counted> moved(std::move(big));
    EXPECT_EQ(moved.size(), n);
    EXPECT_EQ(big.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state
    EXPECT_EQ(Counted::live, static_cast<int>(n));
    moved = HugeArray<Counted>(3);  // the old elements go
    EXPECT_EQ(Counted::live, 3);
  }
  EXPECT_EQ(Counted::live, 0);
  HugeArray<Counted> none;
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.data(), nullptr);
}

TEST(MessagePool, RejectsZeroCapacity) { EXPECT_THROW(MessagePool(0), std::invalid_argument); }

// Several threads alloc and free as fast as they can; each stamps what it
// holds and checks the stamp before freeing. A broken free list (ABA, lost
// update) hands one descriptor to two threads, which this catches.
TEST(MessagePool, ConcurrentAllocFreeNeverSharesADescriptor) {
  constexpr uint32_t kCapacity = 8;  // < 4 threads x 3 held: exhaustion is exercised too
  constexpr int kThreads = 4;
  constexpr int kRounds = 200000;
  MessagePool pool(kCapacity);
  std::atomic<int> shared{0};
  std::atomic<uint64_t> successes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Message* held[3] = {};
      uint64_t ok = 0;
      for (int r = 0; r < kRounds; ++r) {
        const int slot = r % 3;
        if (held[slot] != nullptr) {
          if (held[slot]->cookie != (uint64_t{static_cast<uint32_t>(t)} << 32 | r % 1000003)) {
            shared.fetch_add(1);
          }
          pool.free(held[slot]);
          held[slot] = nullptr;
        }
        Message* m = pool.alloc();
        if (m == nullptr) continue;
        m->cookie = uint64_t{static_cast<uint32_t>(t)} << 32 | (r + 3) % 1000003;
        held[slot] = m;
        ++ok;
      }
      for (Message* m : held) {
        if (m != nullptr) pool.free(m);
      }
      successes.fetch_add(ok);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shared.load(), 0);
  EXPECT_GT(successes.load(), 0u);
  // Everything came back: the pool holds exactly its capacity again.
  std::vector<Message*> all;
  while (Message* m = pool.alloc()) all.push_back(m);
  EXPECT_EQ(all.size(), kCapacity);
}

}  // namespace
}  // namespace mercury::sched
