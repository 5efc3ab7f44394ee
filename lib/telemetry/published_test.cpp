#include "telemetry/published.h"

#include <gtest/gtest.h>

#include <thread>

namespace mercury::telemetry {
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
TEST(Published, ConcurrentReadersSeeEveryCounterWholeAndGrowing) {
  Published<Counters> p;
  constexpr uint64_t kRounds = 200000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    Counters c;
    for (uint64_t i = 1; i <= kRounds; ++i) {
      // Values with high and low halves set, so a torn word would show.
      const uint64_t v = (i << 32) | i;
      c.a = v;
      c.b = {v, v, v};
      c.c = v;
      p.publish_st(c);
    }
    done = true;
  });
  Counters last;
  uint64_t reads = 0;
  while (!done.load()) {
    const Counters r = p.read();
    for (uint64_t v : {r.a, r.b[0], r.b[1], r.b[2], r.c}) {
      ASSERT_EQ(v >> 32, v & 0xffffffffu) << "torn word";
    }
    ASSERT_GE(r.a, last.a);
    ASSERT_GE(r.c, last.c);
    ASSERT_GE(r.b[1], last.b[1]);
    last = r;
    ++reads;
  }
  writer.join();
  EXPECT_EQ(p.read().c, (kRounds << 32) | kRounds);
  EXPECT_GT(reads, 0u);
}

}  // namespace
}  // namespace mercury::telemetry
