#include "job/job.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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
  const transport::EndpointConfig c = endpoint_config(j, 3, 0xfedcba98u, 2'000'000'000);
  EXPECT_EQ(c.mode, sched::Mode::kPartition);
  EXPECT_EQ(c.partition_bytes, 1048576u);
  EXPECT_EQ(c.credit_bytes, 2097152u);
  EXPECT_EQ(c.transport.window_packets, 64u);
  EXPECT_EQ(c.transport.peer_timeout_us, 1'500'000u);
  EXPECT_EQ(c.transport.tsc_hz, 2'000'000'000u);
  EXPECT_EQ(c.transport.packet_bytes, 9038u);
  EXPECT_EQ(c.job_id, 9u);
  EXPECT_EQ(c.sender_id, 3);
  EXPECT_EQ(c.local_epoch, 0xfedcba98u);  // all 32 bits
  EXPECT_THROW(endpoint_config(j, 3, 0, 1), config::ConfigError);
}

TEST(Job, RtoFloorCoversASchedulerSliceWhenAnyNodePollsAdaptively) {
  // kJob leaves network.poll at its default, adaptive.
  const transport::EndpointConfig adaptive =
      endpoint_config(config::load_string(kJob), 3, 77, 2'000'000'000);
  EXPECT_EQ(adaptive.transport.min_rto_us, kAdaptiveMinRtoUs);
  EXPECT_GE(adaptive.transport.initial_rto_us, kAdaptiveMinRtoUs);
  EXPECT_NO_THROW(transport::resolve(adaptive.transport));
  // Every node busy: the transport's own floor.
  std::string busy = kJob;
  busy.replace(busy.find("peer_timeout_ms: 1500}"), 22, "peer_timeout_ms: 1500, poll: busy}");
  const transport::EndpointConfig dedicated =
      endpoint_config(config::load_string(busy), 3, 77, 2'000'000'000);
  EXPECT_EQ(dedicated.transport.min_rto_us, transport::Config{}.min_rto_us);
  EXPECT_LT(dedicated.transport.min_rto_us, kAdaptiveMinRtoUs);
  // One node adaptive is enough: its peers may wait a time slice for it.
  std::string one = busy;
  one.replace(one.find("lcores: [6]}"), 12, "lcores: [6], poll: adaptive}");
  EXPECT_EQ(endpoint_config(config::load_string(one), 3, 77, 1).transport.min_rto_us,
            kAdaptiveMinRtoUs);
}

TEST(Job, OptimizerAndSyncFollowTheTrainingSection) {
  const config::JobConfig j = config::load_string(kJob);
  const agg::OptimizerConfig o = optimizer_config(j.training);
  EXPECT_EQ(o.kind, agg::OptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.5f);
  EXPECT_FLOAT_EQ(o.beta1, 0.8f);
  EXPECT_EQ(o.weight_decay, 0.0f);
  EXPECT_FALSE(o.decoupled_weight_decay);
  EXPECT_NE(sync_policy(j.training), nullptr);
}

TEST(Job, AdamwIsAdamWithADecoupledWeightDecay) {
  std::string text = kJob;
  text.replace(text.find("optimizer: adam,"), 16, "optimizer: adamw, weight_decay: 0.25,");
  const agg::OptimizerConfig o = optimizer_config(config::load_string(text).training);
  EXPECT_EQ(o.kind, agg::OptimizerKind::kAdam);
  EXPECT_TRUE(o.decoupled_weight_decay);
  EXPECT_EQ(o.weight_decay, 0.25f);
  text.replace(text.find("optimizer: adamw,"), 17, "optimizer: momentum,");
  text.replace(text.find(", beta1: 0.8"), 12, "");
  const agg::OptimizerConfig l2 = optimizer_config(config::load_string(text).training);
  EXPECT_EQ(l2.kind, agg::OptimizerKind::kMomentum);
  EXPECT_FALSE(l2.decoupled_weight_decay);
  EXPECT_EQ(l2.weight_decay, 0.25f);
}

TEST(Job, StoreForwardUnitIsATensorOrAPartitionOfWholePackets) {
  config::JobConfig j = config::load_string(kJob);
  EXPECT_EQ(store_forward_unit(j), 0u);  // aggregation: chunk, the default
  j.training.aggregation = config::Aggregation::kTensor;
  // 1 MiB at 8896 B per packet (MTU 9000): 117 whole packets, as the endpoint cuts it.
  EXPECT_EQ(j.payload_bytes_per_packet(), 8896u);
  EXPECT_EQ(store_forward_unit(j), 1048576u / 8896u);
  j.network.partition_bytes = 4096;  // less than a packet: one
  EXPECT_EQ(store_forward_unit(j), 1u);
  j.network.scheduler = config::Scheduler::kFifo;
  EXPECT_EQ(store_forward_unit(j), UINT32_MAX);
  j.network.scheduler = config::Scheduler::kStrict;
  EXPECT_EQ(store_forward_unit(j), UINT32_MAX);
}

TEST(Job, PlacementKeepsTensorsWholeOnlyForTensorAggregation) {
  config::JobConfig j = config::load_string(kJob);
  EXPECT_EQ(placement_options(j).max_block_bytes, 0u);  // the automatic split
  j.training.aggregation = config::Aggregation::kTensor;
  EXPECT_EQ(placement_options(j).max_block_bytes, agg::PlacementOptions::kMaxMessageBytes);
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

TEST(Job, ShardLayoutOfCountsIsWhatTheJobFileGives) {
  const ShardLayout l = ShardLayout::of({1, 2});
  const ShardLayout j = shard_layout(config::load_string(kJob));
  EXPECT_EQ(l.total, j.total);
  EXPECT_EQ(l.first, j.first);
  EXPECT_EQ(l.servers(), 2u);
  EXPECT_EQ(l.count(0), 1u);
  EXPECT_EQ(l.count(1), 2u);
  EXPECT_EQ(l.count(2), 0u);
}

TEST(Job, WorkerNodeIsAWorkerOfTheJob) {
  const config::JobConfig j = config::load_string(kJob);
  EXPECT_EQ(worker_node(j, "w1").name, "w1");
  try {
    worker_node(j, "s0");
    FAIL() << "a server";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node s0 is a server, not a worker"), std::string::npos);
  }
  try {
    worker_node(j, "nobody");
    FAIL() << "no such node";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(nodes are: s0, s1, w0, w1)"), std::string::npos)
        << e.what();
  }
}

// Every node addresses a peer the same way: name, address, and its index in
// the job file as the id its packets carry.
TEST(Job, PeerOfANodeIsItsAddressAndItsIndex) {
  const config::JobConfig j = config::load_string(kJob);
  const transport::PeerSpec p = peer_of(j.node("w1"));
  EXPECT_EQ(p.name, "w1");
  EXPECT_EQ(p.ip, 0x0a000004u);
  EXPECT_EQ(p.udp_port, j.node("w1").udp_port);
  EXPECT_EQ(p.node_id, 3);
  EXPECT_EQ(p.peer_epoch, 0u);
}

// A server with `ports` and three workers on memif ports of their own.
std::string three_workers(const std::string& server_ports) {
  return R"(
job: {id: 3, name: p}
nodes:
  - {name: s, role: server, ipv4: 10.0.0.1, ports: )" +
         server_ports + R"(, lcores: [0, 1], shards: 1}
  - {name: a, role: worker, ipv4: 10.0.0.2, lcores: [2], ports: ["net_memif10,role=client"]}
  - {name: b, role: worker, ipv4: 10.0.0.3, lcores: [3], ports: ["net_memif11,role=client"]}
  - {name: c, role: worker, ipv4: 10.0.0.4, lcores: [4], ports: ["net_memif12,role=client"]}
)";
}

TEST(Job, PortOfWorkerFollowsRingPeersThenRankOrderThenOnePortForAll) {
  const config::JobConfig rings = config::load_string(kJob);
  // s1's only port is a ring to w1; w0 is behind it too (its only port).
  EXPECT_EQ(port_of_worker(rings, rings.node("s1")), (std::vector<uint32_t>{0, 0}));

  const config::JobConfig per_worker = config::load_string(three_workers(
      R"(["net_memif0,role=server", "net_memif1,role=server", "net_memif2,role=server"])"));
  EXPECT_EQ(port_of_worker(per_worker, per_worker.node("s")), (std::vector<uint32_t>{0, 1, 2}));

  const config::JobConfig one = config::load_string(three_workers(R"(["net_memif0,role=server"])"));
  EXPECT_EQ(port_of_worker(one, one.node("s")), (std::vector<uint32_t>{0, 0, 0}));
}

TEST(Job, PortOfWorkerRefusesALayoutThatLeavesAWorkerOutNamingTheKey) {
  // The loader refuses such a file (ConfigRefuse.ServerWithNoPortToAWorker);
  // a configuration changed after loading still gets the error.
  config::JobConfig j = config::load_string(
      three_workers(
          R"(["net_memif0,role=server", "net_memif1,role=server", "net_memif2,role=server"])"),
      "two.yaml");
  j.nodes[0].ports.pop_back();
  try {
    port_of_worker(j, j.node("s"));
    FAIL() << "two ports, three workers";
  } catch (const config::ConfigError& e) {
    EXPECT_EQ(e.source(), "two.yaml");
    EXPECT_EQ(e.key(), "nodes[0].ports");
    EXPECT_NE(e.message().find("server s: no port leads to worker a"), std::string::npos)
        << e.what();
  }
}

TEST(Job, FreshEpochIsNeverZero) { EXPECT_NE(fresh_epoch(), 0u); }

// The epoch is the wall clock in milliseconds: a node restarted 2 ms later
// (far less than EAL's start-up) is a new, newer incarnation.
TEST(Job, FreshEpochsTwoMillisecondsApartDifferAndTheLaterIsNewer) {
  const uint32_t first = fresh_epoch();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const uint32_t later = fresh_epoch();
  EXPECT_NE(later, first);
  EXPECT_TRUE(transport::epoch_newer(later, first));
  EXPECT_FALSE(transport::epoch_newer(first, later));
  // At least the 2 ms slept (mod 2^32, as the serial compare reads it); the
  // upper bound only guards against a unit other than milliseconds.
  EXPECT_GE(later - first, 2u);
  EXPECT_LT(later - first, 10'000u);
}

TEST(Job, FreshEpochIsTheWallClockInMilliseconds) {
  const auto ms = [] {
    return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  };
  const uint32_t before = ms();
  const uint32_t e = fresh_epoch();
  const uint32_t after = ms();
  EXPECT_FALSE(transport::epoch_newer(before, e));  // before <= e
  EXPECT_FALSE(transport::epoch_newer(e, after));   // e <= after
}

}  // namespace
}  // namespace mercury::job
