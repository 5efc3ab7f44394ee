// Flow control's sizing as a pure function of the ports' facts: the shared
// pool less the headroom, split among the ports that draw on it, divided by
// the join depth, a quarter kept for copies with shard cores; a configured
// limit taken as it is.
#include "server/flow_control.h"

#include <gtest/gtest.h>

namespace mercury::server {
namespace {

const int kPool = 0;  // its address is the pool's identity

FlowFacts one_port(uint32_t workers_behind, uint32_t workers) {
  FlowFacts f;
  f.pool = {.id = &kPool, .size = 4095, .cache_size = 128, .cache_lcores = 3};
  f.ports = {FlowPort{.pool = &kPool, .workers = workers_behind, .queues = {}}};
  f.workers = workers;
  return f;
}

// The documented example (docs/server.md): one port, 4095 buffers, cache 128,
// 3 lcores: 4095 - (4 x 32 + 128 x 1.5 x 3 + 64 + 32) = 3295.
TEST(FlowLimits, OnePortTakesThePoolLessTheHeadroom) {
  const auto l = flow_limits(one_port(1, 4));
  ASSERT_TRUE(l[0].has_value());
  EXPECT_EQ(l[0]->limit, 3295u);
  EXPECT_EQ(l[0]->copies, 0u);
}

TEST(FlowLimits, DescriptorRingsAreHeadroom) {
  FlowFacts f = one_port(1, 4);
  f.ports[0].queues = {.rx_descriptors = 512, .tx_descriptors = 256};
  EXPECT_EQ(flow_limits(f)[0]->limit, 3295u - 768);
}

// Several workers behind one port: joins are admitted over the limit, so the
// share is divided by min(workers behind, N - 1).
TEST(FlowLimits, TheJoinDepthDividesTheShare) {
  EXPECT_EQ(flow_limits(one_port(4, 4))[0]->limit, 3295u / 3);
  EXPECT_EQ(flow_limits(one_port(2, 4))[0]->limit, 3295u / 2);
  FlowFacts f = one_port(4, 4);
  f.stages_every_set = true;  // joins are copied too: depth 1
  EXPECT_EQ(flow_limits(f)[0]->limit, 3295u);
}

TEST(FlowLimits, PortsSharingAPoolShareIt) {
  FlowFacts f = one_port(1, 2);
  const int other = 0;
  f.ports.push_back(FlowPort{.pool = &kPool, .workers = 1, .queues = {}});
  f.ports.push_back(FlowPort{.pool = &other, .workers = 1, .queues = {}});   // another pool
  f.ports.push_back(FlowPort{.pool = nullptr, .workers = 1, .queues = {}});  // not seen yet
  const auto l = flow_limits(f);
  // Two ports on the pool: twice the per-port headroom (64 + 32), halves.
  const uint64_t share = (4095 - (128 + 576 + 2 * 96)) / 2;
  ASSERT_TRUE(l[0] && l[1]);
  EXPECT_EQ(l[0]->limit, share);
  EXPECT_EQ(l[1]->limit, share);
  EXPECT_FALSE(l[2].has_value());
  EXPECT_FALSE(l[3].has_value());
}

TEST(FlowLimits, CopiesGetAQuarterWithShardCoresAndABurstInline) {
  FlowFacts f = one_port(1, 4);
  f.staging = true;
  f.shard_cores = true;
  auto l = flow_limits(f);
  EXPECT_EQ(l[0]->copies, 3295u / 4);
  EXPECT_EQ(l[0]->limit, 3295u - 3295u / 4);
  f.shard_cores = false;
  l = flow_limits(f);
  EXPECT_EQ(l[0]->copies, 32u);
  EXPECT_EQ(l[0]->limit, 3295u - 32);
}

TEST(FlowLimits, AConfiguredLimitIsTakenAsItIs) {
  FlowFacts f = one_port(1, 4);
  f.ports.push_back(FlowPort{.pool = &kPool, .workers = 1, .queues = {}});
  f.configured = 1000;
  f.configured_port = 1;
  f.staging = true;
  const auto l = flow_limits(f);
  EXPECT_FALSE(l[0].has_value());
  ASSERT_TRUE(l[1].has_value());
  EXPECT_EQ(l[1]->limit, 1000u);
  EXPECT_EQ(l[1]->copies, 32u);
}

TEST(FlowLimits, ATinyPoolStillAdmitsOne) {
  FlowFacts f = one_port(1, 4);
  f.pool.size = 100;
  EXPECT_EQ(flow_limits(f)[0]->limit, 1u);
}

}  // namespace
}  // namespace mercury::server
