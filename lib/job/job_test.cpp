#include "job/job.h"

#include <gtest/gtest.h>

namespace mercury::job {
namespace {

const char* kJob = R"(
job: {id: 9, name: j}
network: {mtu: 9000, scheduler: partition, partition_bytes: 1048576, credit_bytes: 2097152,
          window: 64, peer_timeout_ms: 1500}
training: {sync: bsp, optimizer: adam, learning_rate: 0.5, beta1: 0.8}
nodes:
  - {name: s0, role: server, ipv4: 10.0.0.1, ports: ["ring:a"], lcores: [0, 1], shards: 1}
  - {name: s1, role: server, ipv4: 10.0.0.2, ports: ["ring:b"], lcores: [2, 3, 4], shards: 2}
  - {name: w0, role: worker, ipv4: 10.0.0.3, ports: ["ring:a"], lcores: [5]}
  - {name: w1, role: worker, ipv4: 10.0.0.4, ports: ["ring:b"], lcores: [6]}
)";

TEST(Job, EndpointConfigFollowsTheNetworkSection) {
  const config::JobConfig j = config::load_string(kJob);
  const transport::EndpointConfig c = endpoint_config(j, 3, 77, 2'000'000'000);
  EXPECT_EQ(c.mode, sched::Mode::kPartition);
  EXPECT_EQ(c.partition_bytes, 1048576u);
  EXPECT_EQ(c.credit_bytes, 2097152u);
  EXPECT_EQ(c.transport.window_packets, 64u);
  EXPECT_EQ(c.transport.peer_timeout_us, 1'500'000u);
  EXPECT_EQ(c.transport.tsc_hz, 2'000'000'000u);
  EXPECT_EQ(c.transport.packet_bytes, 9038u);
  EXPECT_EQ(c.job_id, 9u);
  EXPECT_EQ(c.sender_id, 3);
  EXPECT_EQ(c.local_epoch, 77);
  EXPECT_THROW(endpoint_config(j, 3, 0, 1), config::ConfigError);
}

TEST(Job, OptimizerAndSyncFollowTheTrainingSection) {
  const config::JobConfig j = config::load_string(kJob);
  const agg::OptimizerConfig o = optimizer_config(j.training);
  EXPECT_EQ(o.kind, agg::OptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.5f);
  EXPECT_FLOAT_EQ(o.beta1, 0.8f);
  EXPECT_NE(sync_policy(j.training), nullptr);
}

TEST(Job, ShardLayoutNumbersShardsAcrossServersInFileOrder) {
  const ShardLayout l = shard_layout(config::load_string(kJob));
  EXPECT_EQ(l.total, 3u);
  ASSERT_EQ(l.first.size(), 2u);
  EXPECT_EQ(l.first[1], 1u);
  EXPECT_EQ(l.server_of(0), 0u);
  EXPECT_EQ(l.server_of(1), 1u);
  EXPECT_EQ(l.server_of(2), 1u);
}

TEST(Job, FreshEpochIsNeverZero) { EXPECT_NE(fresh_epoch(), 0); }

}  // namespace
}  // namespace mercury::job
