// The loader's accepted files: the documented defaults, every key read,
// ranks, ports and addresses as parsed, the value types, and the example
// files in config/ (so they cannot rot).
#include <gtest/gtest.h>

#include <string>

#include "config/load_test_util.h"

namespace mercury::config {
namespace {

using test::contains;
using test::doc;
using test::kNodes;
using test::worker;

TEST(ConfigLoad, MinimalJobGetsDocumentedDefaults) {
  JobConfig job = load_string(doc(""), "t.yaml");
  EXPECT_EQ(job.id, 7u);
  EXPECT_EQ(job.name, "demo");
  EXPECT_EQ(job.source, "t.yaml");
  EXPECT_EQ(job.network.mtu, 1500u);
  EXPECT_EQ(job.network.udp_port, 47100u);
  EXPECT_EQ(job.network.udp_checksum, Checksum::kAuto);
  EXPECT_EQ(job.network.window, 0u);
  EXPECT_EQ(job.network.peer_timeout_ms, 1500u);
  EXPECT_EQ(job.network.scheduler, Scheduler::kStrict);
  EXPECT_EQ(job.network.partition_bytes, 4194304u);
  EXPECT_EQ(job.network.credit_bytes, 8388608u);
  EXPECT_EQ(job.mempool.mbufs, 16383u);
  EXPECT_EQ(job.mempool.cache, 256u);
  EXPECT_EQ(job.eal.memory_mb, 512u);
  EXPECT_EQ(job.eal.hugepages, Hugepages::kAuto);
  EXPECT_TRUE(job.eal.extra.empty());
  EXPECT_EQ(job.link.rate_gbps, 0.0);
  EXPECT_EQ(job.link.delay_us, 0u);
  EXPECT_EQ(job.link.loss, 0.0);
  EXPECT_EQ(job.link.duplicate, 0.0);
  EXPECT_EQ(job.link.reorder, 0.0);
  EXPECT_EQ(job.link.corrupt, 0.0);
  EXPECT_EQ(job.link.seed, 1u);
  EXPECT_FALSE(job.link.enabled());
  EXPECT_EQ(job.training.sync, Sync::kBsp);
  EXPECT_EQ(job.training.staleness_bound, 0u);
  EXPECT_EQ(job.training.optimizer, Optimizer::kSgd);
  EXPECT_DOUBLE_EQ(job.training.learning_rate, 0.01);
  EXPECT_DOUBLE_EQ(job.training.momentum, 0.9);
  EXPECT_DOUBLE_EQ(job.training.beta1, 0.9);
  EXPECT_DOUBLE_EQ(job.training.beta2, 0.999);
  EXPECT_DOUBLE_EQ(job.training.epsilon, 1.0e-8);
  ASSERT_EQ(job.nodes.size(), 2u);
  const NodeConfig& s = job.nodes[0];
  EXPECT_EQ(s.name, "s0");
  EXPECT_EQ(s.role, Role::kServer);
  EXPECT_EQ(s.ipv4.to_string(), "10.0.0.1");
  EXPECT_EQ(s.udp_port, 47100u);  // inherited from network.udp_port
  EXPECT_FALSE(s.mac.has_value());
  EXPECT_EQ(s.shards, 1u);
  EXPECT_EQ(s.net_lcore(), 0u);
  ASSERT_EQ(s.shard_lcores().size(), 1u);
  EXPECT_EQ(s.shard_lcores()[0], 1u);
  EXPECT_EQ(job.nodes[1].shards, 0u);
}

TEST(ConfigLoad, EveryKeySetIsRead) {
  std::string yaml =
      doc("network:\n"
          "  mtu: 9000\n"
          "  udp_port: 5000\n"
          "  udp_checksum: false\n"
          "  window: 64\n"
          "  peer_timeout_ms: 100\n"
          "  scheduler: partition\n"
          "  partition_bytes: 65536\n"
          "  credit_bytes: 65536\n"
          "mempool: {mbufs: 4095, cache: 0}\n"
          "eal:\n"
          "  memory_mb: 1024\n"
          "  hugepages: off\n"
          "  extra: [--log-level=8, \"--in-memory\"]\n"
          "link:\n"
          "  rate_gbps: 2.5\n"
          "  delay_us: 100\n"
          "  loss: 0.01\n"
          "  duplicate: 0.02\n"
          "  reorder: 0.03\n"
          "  corrupt: 0.04\n"
          "  seed: 18446744073709551615\n"
          "  rate_steps: [{at_s: 5, rate_gbps: 1.25}, {at_s: 10.5, rate_gbps: 0}]\n"
          "training:\n"
          "  sync: bsp\n"
          "  optimizer: adamw\n"
          "  learning_rate: 1.0e-3\n"
          "  beta1: 0.8\n"
          "  beta2: 0.99\n"
          "  epsilon: 1e-6\n"
          "  weight_decay: 0.01\n",
          "  - name: s0\n"
          "    role: server\n"
          "    ipv4: 10.0.0.1\n"
          "    udp_port: 6000\n"
          "    mac: 02:AB:cd:00:00:01\n"
          "    ports: [ring:a]\n"
          "    lcores: [5, 3, 4]\n"
          "    shards: 2\n" +
              worker("w0", "10.0.0.2", "ring:a"));
  JobConfig job = load_string(yaml);
  EXPECT_EQ(job.source, "<inline>");
  EXPECT_EQ(job.network.mtu, 9000u);
  EXPECT_EQ(job.network.udp_port, 5000u);
  EXPECT_EQ(job.network.udp_checksum, Checksum::kOff);
  EXPECT_EQ(job.network.window, 64u);
  EXPECT_EQ(job.network.peer_timeout_ms, 100u);
  EXPECT_EQ(job.network.scheduler, Scheduler::kPartition);
  EXPECT_EQ(job.network.partition_bytes, 65536u);
  EXPECT_EQ(job.network.credit_bytes, 65536u);
  EXPECT_EQ(job.mempool.mbufs, 4095u);
  EXPECT_EQ(job.mempool.cache, 0u);
  EXPECT_EQ(job.eal.memory_mb, 1024u);
  EXPECT_EQ(job.eal.hugepages, Hugepages::kOff);
  EXPECT_EQ(job.eal.extra, (std::vector<std::string>{"--log-level=8", "--in-memory"}));
  EXPECT_DOUBLE_EQ(job.link.rate_gbps, 2.5);
  EXPECT_EQ(job.link.delay_us, 100u);
  EXPECT_DOUBLE_EQ(job.link.loss, 0.01);
  EXPECT_DOUBLE_EQ(job.link.duplicate, 0.02);
  EXPECT_DOUBLE_EQ(job.link.reorder, 0.03);
  EXPECT_DOUBLE_EQ(job.link.corrupt, 0.04);
  EXPECT_EQ(job.link.seed, 18446744073709551615ull);
  ASSERT_EQ(job.link.rate_steps.size(), 2u);
  EXPECT_DOUBLE_EQ(job.link.rate_steps[0].at_s, 5);
  EXPECT_DOUBLE_EQ(job.link.rate_steps[0].rate_gbps, 1.25);
  EXPECT_DOUBLE_EQ(job.link.rate_steps[1].at_s, 10.5);
  EXPECT_DOUBLE_EQ(job.link.rate_steps[1].rate_gbps, 0);
  EXPECT_TRUE(job.link.enabled());
  EXPECT_EQ(job.training.sync, Sync::kBsp);
  EXPECT_EQ(job.training.staleness_bound, 0u);
  EXPECT_EQ(job.training.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(to_string(job.training.optimizer), "adamw");
  EXPECT_DOUBLE_EQ(job.training.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(job.training.learning_rate, 1.0e-3);
  EXPECT_DOUBLE_EQ(job.training.beta1, 0.8);
  EXPECT_DOUBLE_EQ(job.training.beta2, 0.99);
  EXPECT_DOUBLE_EQ(job.training.epsilon, 1e-6);
  const NodeConfig& s = job.nodes[0];
  EXPECT_EQ(s.udp_port, 6000u);
  ASSERT_TRUE(s.mac.has_value());
  EXPECT_EQ(s.mac->to_string(), "02:ab:cd:00:00:01");
  EXPECT_EQ(s.lcores, (std::vector<uint32_t>{5, 3, 4}));
  EXPECT_EQ(s.net_lcore(), 5u);
  EXPECT_EQ(s.shards, 2u);
  EXPECT_EQ(job.nodes[1].udp_port, 5000u);
  EXPECT_EQ(job.payload_bytes_per_packet(), 8896u);
}

TEST(ConfigLoad, EmptySectionMeansDefaults) {
  JobConfig job = load_string(doc("network:\nmempool:\nlink:\ntraining:\neal:\n"));
  EXPECT_EQ(job.network.mtu, 1500u);
  EXPECT_EQ(job.mempool.mbufs, 16383u);
  EXPECT_EQ(job.training.sync, Sync::kBsp);
}

TEST(ConfigLoad, RanksFollowFileOrderPerRole) {
  std::string nodes = worker("wa", "10.0.0.10", "ring:a", "[3]") +
                      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
                      "    ports: [ring:a, ring:b]\n    lcores: [0, 1]\n    shards: 1\n" +
                      worker("wb", "10.0.0.11", "ring:b", "[4]") +
                      "  - name: s1\n    role: server\n    ipv4: 10.0.0.2\n"
                      "    ports: [\"net_null0\"]\n    lcores: [5, 6]\n    shards: 1\n";
  JobConfig job = load_string(doc("", nodes));
  EXPECT_EQ(job.rank_of("wa"), 0u);
  EXPECT_EQ(job.rank_of("wb"), 1u);
  EXPECT_EQ(job.rank_of("s0"), 0u);
  EXPECT_EQ(job.rank_of("s1"), 1u);
  EXPECT_EQ(job.node("s1").index, 3u);
  auto workers = job.workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0]->name, "wa");
  EXPECT_EQ(workers[1]->name, "wb");
  auto servers = job.servers();
  ASSERT_EQ(servers.size(), 2u);
  EXPECT_EQ(servers[1]->name, "s1");
  // Each ring end knows the node at the other end.
  EXPECT_EQ(job.node("s0").ports[0].ring_peer, "wa");
  EXPECT_EQ(job.node("s0").ports[1].ring_peer, "wb");
  EXPECT_EQ(job.node("wb").ports[0].ring_peer, "s0");
  EXPECT_EQ(job.node("wb").ports[0].ring_link, "b");
  EXPECT_EQ(job.find_node("nobody"), nullptr);
}

TEST(ConfigLoad, UnknownNodeNameListsTheValidNames) {
  JobConfig job = load_string(doc(""), "t.yaml");
  try {
    job.node("w9");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "t.yaml: no node named \"w9\" (nodes are: s0, w0)");
  }
  EXPECT_THROW(job.rank_of("w9"), ConfigError);
}

TEST(ConfigLoad, PayloadPerPacketIsMtuLessHeadersRoundedToCacheLines) {
  auto payload = [](int mtu) {
    return load_string(doc("network: {mtu: " + std::to_string(mtu) + "}\n"))
        .payload_bytes_per_packet();
  };
  EXPECT_EQ(payload(1500), 1408u);  // 1500 - 20 - 8 - 64 = 1408: exactly 22 lines
  EXPECT_EQ(payload(9000), 8896u);  // 8908, down to 139 lines
  EXPECT_EQ(payload(1499), 1344u);  // 1407: 21 lines and 63 bytes
  EXPECT_EQ(payload(1564), 1472u);  // exactly 23 lines
  EXPECT_EQ(payload(576), 448u);
}

TEST(ConfigLoad, PortFormsAreClassifiedAndPciNormalised) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [ring:a, \"net_memif0,role=server,socket=/tmp/mercury/x.sock\", 03:00.0,"
      " 0000:AF:1f.7, net_pcap1]\n"
      "    lcores: [0, 1]\n    shards: 1\n" +
      worker("w0", "10.0.0.2", "ring:a");
  JobConfig job = load_string(doc("", nodes));
  const auto& ports = job.nodes[0].ports;
  ASSERT_EQ(ports.size(), 5u);
  EXPECT_EQ(ports[0].kind, PortSpec::kRing);
  EXPECT_EQ(ports[0].text, "ring:a");
  EXPECT_EQ(ports[0].ring_link, "a");
  EXPECT_EQ(ports[1].kind, PortSpec::kVdev);
  EXPECT_EQ(ports[1].text, "net_memif0,role=server,socket=/tmp/mercury/x.sock");
  EXPECT_EQ(ports[1].vdev_name(), "net_memif0");
  EXPECT_EQ(ports[2].kind, PortSpec::kPci);
  EXPECT_EQ(ports[2].text, "0000:03:00.0");
  EXPECT_EQ(ports[3].text, "0000:af:1f.7");
  EXPECT_EQ(ports[4].kind, PortSpec::kVdev);
  EXPECT_EQ(ports[4].vdev_name(), "net_pcap1");
}

TEST(ConfigLoad, SameAddressOnAnotherUdpPortIsAnotherEndpoint) {
  std::string nodes =
      std::string(kNodes) + worker("w1", "10.0.0.2", "net_null0", "[3]") + "    udp_port: 47101\n";
  JobConfig job = load_string(doc("", nodes));
  EXPECT_EQ(job.node("w1").udp_port, 47101u);
}

// network.poll is every node's poll mode unless the node sets its own.
TEST(ConfigLoad, PollModeFromTheNetworkOrTheNode) {
  EXPECT_EQ(load_string(doc("")).network.poll, Poll::kAdaptive);
  EXPECT_EQ(load_string(doc("")).node("s0").poll, Poll::kAdaptive);
  const JobConfig busy = load_string(doc("network: {poll: busy}\n"));
  EXPECT_EQ(busy.network.poll, Poll::kBusy);
  EXPECT_EQ(busy.node("s0").poll, Poll::kBusy);
  EXPECT_EQ(busy.node("w0").poll, Poll::kBusy);
  // The server on dedicated cores, its workers sharing theirs with trainers.
  std::string nodes(kNodes);
  nodes.insert(nodes.find("  - name: w0"), "    poll: busy\n");
  const JobConfig mixed = load_string(doc("", nodes));
  EXPECT_EQ(mixed.node("s0").poll, Poll::kBusy);
  EXPECT_EQ(mixed.node("w0").poll, Poll::kAdaptive);
  EXPECT_EQ(to_string(Poll::kAdaptive), "adaptive");
  EXPECT_EQ(to_string(Poll::kBusy), "busy");
}

TEST(ConfigLoad, LargestCacheFitsTheSmallestPool) {
  // DPDK refuses cache * 1.5 > mbufs; the ranges (cache <= 512, mbufs >=
  // 1023) make that impossible, so the extremes together must load.
  JobConfig job = load_string(doc("mempool: {mbufs: 1023, cache: 512}\n"));
  EXPECT_EQ(job.mempool.mbufs, 1023u);
  EXPECT_EQ(job.mempool.cache, 512u);
}

TEST(ConfigValues, Ipv4AndMacParseStrictlyAndPrint) {
  ASSERT_TRUE(Ipv4::parse("192.168.10.255"));
  EXPECT_EQ(Ipv4::parse("192.168.10.255")->value, 0xc0a80affu);
  EXPECT_EQ(Ipv4{0x0a000001}.to_string(), "10.0.0.1");
  for (const char* bad : {"", "10.0.0", "10.0.0.1.", "10.0.0.256", "010.0.0.1", "10.0.0.-1",
                          "10.0.0.1 ", "a.b.c.d", "10..0.1"}) {
    EXPECT_FALSE(Ipv4::parse(bad)) << bad;
  }
  auto mac = Mac::parse("02:00:0A:ff:00:01");
  ASSERT_TRUE(mac);
  EXPECT_EQ(mac->to_string(), "02:00:0a:ff:00:01");
  EXPECT_FALSE(mac->is_multicast());
  EXPECT_TRUE(Mac::parse("01:00:5e:00:00:01")->is_multicast());
  for (const char* bad : {"zz:00", "02:00:00:00:00", "02-00-00-00-00-01", "02:00:00:00:00:0g",
                          "02:00:00:00:00:01:"}) {
    EXPECT_FALSE(Mac::parse(bad)) << bad;
  }
}

TEST(ConfigLoad, ExampleFilesLoad) {
  const std::string dir = MERCURY_CONFIG_DIR;
  JobConfig ring = load_file(dir + "/ring-demo.yaml");
  EXPECT_EQ(ring.servers().size(), 1u);
  EXPECT_EQ(ring.workers().size(), 4u);
  EXPECT_EQ(ring.servers()[0]->shards, 2u);
  for (const NodeConfig* w : ring.workers()) {
    ASSERT_EQ(w->ports.size(), 1u);
    EXPECT_EQ(w->ports[0].kind, PortSpec::kRing);
    EXPECT_EQ(w->ports[0].ring_peer, "server0");
  }

  JobConfig memif = load_file(dir + "/memif.yaml");
  EXPECT_EQ(memif.workers().size(), 4u);
  const NodeConfig& server = *memif.servers()[0];
  ASSERT_EQ(server.ports.size(), memif.workers().size());
  for (size_t i = 0; i < server.ports.size(); ++i) {
    const std::string sock = "socket=/tmp/mercury/w" + std::to_string(i) + ".sock";
    EXPECT_EQ(server.ports[i].kind, PortSpec::kVdev);
    EXPECT_TRUE(contains(server.ports[i].text, "role=server")) << server.ports[i].text;
    EXPECT_TRUE(contains(server.ports[i].text, sock)) << server.ports[i].text;
    const PortSpec& client = memif.workers()[i]->ports[0];
    EXPECT_TRUE(contains(client.text, "role=client")) << client.text;
    EXPECT_TRUE(contains(client.text, sock)) << client.text;
  }

  JobConfig cluster = load_file(dir + "/cluster-pci.yaml");
  EXPECT_EQ(cluster.servers().size(), 2u);
  EXPECT_EQ(cluster.workers().size(), 4u);
  EXPECT_EQ(cluster.network.mtu, 9000u);
  EXPECT_EQ(cluster.eal.hugepages, Hugepages::kOn);
  for (const NodeConfig& n : cluster.nodes) {
    ASSERT_EQ(n.ports.size(), 1u);
    EXPECT_EQ(n.ports[0].kind, PortSpec::kPci);
    EXPECT_EQ(n.ports[0].text, "0000:03:00.0");
  }
}

}  // namespace
}  // namespace mercury::config
