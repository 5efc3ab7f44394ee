#include "sched/peer_mask.h"

#include <gtest/gtest.h>

namespace mercury::sched {
namespace {

TEST(PeerMask, FirstNSetsExactlyThosePeers) {
  for (unsigned n : {0u, 1u, 63u, 64u, 65u, 200u, 256u}) {
    const PeerMask m = PeerMask::first(n);
    EXPECT_EQ(m.count(), n);
    for (unsigned p = 0; p < PeerMask::kBits; ++p) EXPECT_EQ(m.test(p), p < n) << n << " " << p;
  }
}

TEST(PeerMask, SetResetTestAcrossWords) {
  PeerMask m;
  EXPECT_FALSE(m.any());
  for (unsigned p : {0u, 63u, 64u, 127u, 128u, 255u}) m.set(p);
  EXPECT_EQ(m.count(), 6u);
  m.reset(64);
  EXPECT_FALSE(m.test(64));
  EXPECT_TRUE(m.test(63));
  EXPECT_TRUE(m.test(255));
}

TEST(PeerMask, NextAfterIsRoundRobinWithWrap) {
  PeerMask m;
  for (unsigned p : {3u, 70u, 200u}) m.set(p);
  EXPECT_EQ(m.next_after(255), 3);
  EXPECT_EQ(m.next_after(3), 70);
  EXPECT_EQ(m.next_after(70), 200);
  EXPECT_EQ(m.next_after(200), 3);
  EXPECT_EQ(m.next_after(100), 200);
  EXPECT_EQ(PeerMask{}.next_after(0), -1);
  PeerMask one;
  one.set(5);
  EXPECT_EQ(one.next_after(5), 5);  // a single member is always next
}

TEST(PeerMask, AndOr) {
  PeerMask a = PeerMask::first(100);
  PeerMask b;
  b.set(99);
  b.set(150);
  EXPECT_EQ((a & b).count(), 1u);
  EXPECT_TRUE((a & b).test(99));
  EXPECT_EQ((a | b).count(), 101u);
}

}  // namespace
}  // namespace mercury::sched
