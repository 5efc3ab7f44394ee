#include "base/published.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace mercury::base {
namespace {

struct Counters {
  uint64_t a = 0;
  std::array<uint64_t, 3> b{};
  uint64_t c = 0;
};

TEST(Published, ReadReturnsWhatWasPublished) {
  Published<Counters> p;
  EXPECT_EQ(p.read().a, 0u);
  Counters c;
  c.a = 1;
  c.b = {2, 3, 4};
  c.c = uint64_t{1} << 63;
  p.publish_st(c);
  const Counters r = p.read();
  EXPECT_EQ(r.a, 1u);
  EXPECT_EQ(r.b[0], 2u);
  EXPECT_EQ(r.b[2], 4u);
  EXPECT_EQ(r.c, uint64_t{1} << 63);
}

// A reader racing the writer sees every counter whole and never going back.
// The writer publishes from before the first read until after the last, so
// every read races it however the two threads are scheduled (on a loaded
// machine the writer could otherwise finish before the reader starts).
TEST(Published, ConcurrentReadersSeeEveryCounterWholeAndGrowing) {
  Published<Counters> p;
  constexpr uint64_t kReads = 20000;
  std::atomic<uint64_t> reads{0};
  uint64_t last_published = 0;  // the writer's, read after join()
  std::thread writer([&] {
    Counters c;
    uint64_t i = 0;
    // (Below 2^32, where a value's halves stop matching.)
    while (reads.load(std::memory_order_relaxed) < kReads && i < 0xffffffffu) {
      ++i;
      // Values with high and low halves set, so a torn word would show.
      const uint64_t v = (i << 32) | i;
      c.a = v;
      c.b = {v, v, v};
      c.c = v;
      p.publish_st(c);
    }
    last_published = i;
  });
  while (p.read().a == 0) std::this_thread::yield();  // the writer has begun
  Counters last;
  bool whole = true, growing = true;
  for (uint64_t n = 0; n < kReads; ++n) {
    const Counters r = p.read();
    for (uint64_t v : {r.a, r.b[0], r.b[1], r.b[2], r.c}) whole &= v >> 32 == (v & 0xffffffffu);
    growing &= r.a >= last.a && r.c >= last.c && r.b[1] >= last.b[1];
    last = r;
    reads.store(n + 1, std::memory_order_relaxed);
  }
  writer.join();
  EXPECT_TRUE(whole) << "torn word";
  EXPECT_TRUE(growing) << "a counter went back";
  EXPECT_EQ(p.read().c, (last_published << 32) | last_published);
}

}  // namespace
}  // namespace mercury::base
