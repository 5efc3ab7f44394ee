#include "net/arp.h"

#include <gtest/gtest.h>

namespace mercury::net {
namespace {

const MacAddr kMac1{{2, 0, 0, 0, 0, 1}};
const MacAddr kMac2{{2, 0, 0, 0, 0, 2}};

TEST(ArpTable, LearnsAndLooksUp) {
  ArpTable t(4, 100);
  EXPECT_EQ(t.lookup(1), nullptr);
  EXPECT_TRUE(t.learn(1, kMac1));
  ASSERT_NE(t.lookup(1), nullptr);
  EXPECT_EQ(*t.lookup(1), kMac1);
  EXPECT_TRUE(t.learn(1, kMac2));
  EXPECT_EQ(*t.lookup(1), kMac2);
}

TEST(ArpTable, StaticEntriesWin) {
  ArpTable t(4, 100);
  t.add_static(1, kMac1);
  t.learn(1, kMac2);
  EXPECT_EQ(*t.lookup(1), kMac1);
}

TEST(ArpTable, RequestsAreRateLimited) {
  ArpTable t(4, 100);
  EXPECT_TRUE(t.should_request(5, 1000));
  EXPECT_FALSE(t.should_request(5, 1050));
  EXPECT_TRUE(t.should_request(5, 1100));
  EXPECT_EQ(t.lookup(5), nullptr);
  t.learn(5, kMac1);
  EXPECT_FALSE(t.should_request(5, 5000));
}

TEST(ArpTable, FullTableRefusesInsteadOfEvicting) {
  ArpTable t(2, 100);
  EXPECT_TRUE(t.learn(1, kMac1));
  EXPECT_TRUE(t.learn(2, kMac1));
  EXPECT_FALSE(t.learn(3, kMac1));
  EXPECT_FALSE(t.should_request(4, 0));
  EXPECT_EQ(t.refused(), 2u);
  EXPECT_NE(t.lookup(1), nullptr);
  EXPECT_EQ(t.size(), 2u);
}

TEST(ArpTable, IgnoresBogusSenders) {
  ArpTable t(4, 100);
  EXPECT_FALSE(t.learn(0, kMac1));
  EXPECT_FALSE(t.learn(1, MacAddr{}));
  EXPECT_FALSE(t.learn(1, MacAddr::broadcast()));
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace mercury::net
