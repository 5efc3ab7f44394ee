// Loader tests: defaults, every refusal (each with file, line and key), the
// helpers, and the example files in config/.
#include "config/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace mercury::config {
namespace {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The job header takes lines 1-3, so `sections` starts on line 4.
std::string doc(std::string_view sections, std::string_view nodes);

// Two nodes joined by one ring link; with no sections, "nodes:" is line 4,
// the server's "- name" line 5 and the worker's line 11.
constexpr std::string_view kNodes =
    "  - name: s0\n"         // 5
    "    role: server\n"     // 6
    "    ipv4: 10.0.0.1\n"   // 7
    "    ports: [ring:a]\n"  // 8
    "    lcores: [0, 1]\n"   // 9
    "    shards: 1\n"        // 10
    "  - name: w0\n"         // 11
    "    role: worker\n"     // 12
    "    ipv4: 10.0.0.2\n"   // 13
    "    ports: [ring:a]\n"  // 14
    "    lcores: [2]\n";     // 15

std::string doc(std::string_view sections, std::string_view nodes = kNodes) {
  std::string s = "job:\n  id: 7\n  name: demo\n";
  s += sections;
  s += "nodes:\n";
  s += nodes;
  return s;
}

// A worker block of 5 lines, for tests that need more nodes.
std::string worker(std::string_view name, std::string_view ip, std::string_view port,
                   std::string_view lcores = "[2]") {
  return "  - name: " + std::string(name) + "\n    role: worker\n    ipv4: " + std::string(ip) +
         "\n    ports: [\"" + std::string(port) + "\"]\n    lcores: " + std::string(lcores) + "\n";
}

// Checks that `yaml` is refused with exactly this file, line and key, and a
// message containing `fragment`; and that what() is "t.yaml:<line>: <key>: ...".
::testing::AssertionResult refused(const std::string& yaml, int line, std::string_view key,
                                   std::string_view fragment) {
  try {
    load_string(yaml, "t.yaml");
  } catch (const ConfigError& e) {
    std::string prefix = "t.yaml:" + std::to_string(line) + ": ";
    if (!key.empty()) prefix += std::string(key) + ": ";
    std::string what = e.what();
    if (e.source() != "t.yaml" || e.line() != line || e.key() != key || !what.starts_with(prefix) ||
        what.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "got: " << what << "\nwant prefix: " << prefix << "\nand fragment: " << fragment;
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "accepted:\n" << yaml;
}

// ---------------------------------------------------------------- accepted

TEST(ConfigLoad, MinimalJobGetsDocumentedDefaults) {
  JobConfig job = load_string(doc(""), "t.yaml");
  EXPECT_EQ(job.id, 7u);
  EXPECT_EQ(job.name, "demo");
  EXPECT_EQ(job.source, "t.yaml");
  EXPECT_EQ(job.network.mtu, 1500u);
  EXPECT_EQ(job.network.udp_port, 47100u);
  EXPECT_TRUE(job.network.udp_checksum);
  EXPECT_EQ(job.network.window, 0u);
  EXPECT_EQ(job.network.peer_timeout_ms, 5000u);
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
  EXPECT_EQ(job.training.staleness, 0u);
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
          "training:\n"
          "  sync: bsp\n"
          "  staleness: 0\n"
          "  optimizer: adam\n"
          "  learning_rate: 1.0e-3\n"
          "  beta1: 0.8\n"
          "  beta2: 0.99\n"
          "  epsilon: 1e-6\n",
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
  EXPECT_FALSE(job.network.udp_checksum);
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
  EXPECT_TRUE(job.link.enabled());
  EXPECT_EQ(job.training.sync, Sync::kBsp);
  EXPECT_EQ(job.training.staleness, 0u);
  EXPECT_EQ(job.training.optimizer, Optimizer::kAdam);
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
  EXPECT_EQ(payload(1500), 1408u);  // 1500 - 20 - 8 - 56 = 1416, down to 22 lines
  EXPECT_EQ(payload(9000), 8896u);
  EXPECT_EQ(payload(1491), 1344u);  // 1407: 21 lines and 63 bytes
  EXPECT_EQ(payload(1492), 1408u);  // exactly 22 lines
  EXPECT_EQ(payload(1556), 1472u);  // exactly 23 lines
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

// ----------------------------------------------------- refused: the file

TEST(ConfigRefuse, FileThatCannotBeOpenedNamesPathAndStrerror) {
  try {
    load_file("/nonexistent/job.yaml");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/job.yaml: cannot open: No such file or directory");
  }
}

TEST(ConfigRefuse, ErrorsFromAFileNameThePath) {
  auto path = std::filesystem::temp_directory_path() / "mercury_config_test_bad.yaml";
  {
    std::ofstream out(path);
    out << doc("network:\n  mtu: 100\n");
  }
  try {
    load_file(path.string());
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path.string() + ":5: network.mtu: 100 is out of range (576..9000)");
  }
  std::filesystem::remove(path);
}

TEST(ConfigRefuse, YamlSyntaxErrorNamesLine) {
  EXPECT_TRUE(refused("job:\n  id: 7\n  name: [demo\nnodes: []\n", 4, "", "YAML syntax error"));
}

TEST(ConfigRefuse, EmptyDocument) {
  EXPECT_TRUE(refused("", 1, "", "the document is empty"));
  EXPECT_TRUE(refused("# just a comment\n", 1, "", "the document is empty"));
}

TEST(ConfigRefuse, SecondDocument) {
  EXPECT_TRUE(refused(doc("") + "---\njob: {id: 8}\n", 17, "", "a second YAML document"));
}

TEST(ConfigRefuse, TopLevelIsNotAMapping) {
  EXPECT_TRUE(refused("- job\n- nodes\n", 1, "", "expected a mapping at the top, got a list"));
}

TEST(ConfigRefuse, UnknownKey) {
  EXPECT_TRUE(refused(doc("jobs: 1\n"), 4, "jobs", "unknown key (valid keys here: job, network"));
  EXPECT_TRUE(refused(doc("network:\n  mtuu: 1500\n"), 5, "network.mtuu",
                      "unknown key (valid keys here: mtu, udp_port"));
  std::string nodes = std::string(kNodes) + "    lcore: [3]\n";
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].lcore", "unknown key"));
  EXPECT_TRUE(refused(doc("network:\n  <<: {mtu: 1500}\n"), 5, "network.<<",
                      "YAML merge keys are not supported"));
}

TEST(ConfigRefuse, KeyGivenTwice) {
  EXPECT_TRUE(refused(doc("network:\n  mtu: 1500\n  mtu: 9000\n"), 6, "network.mtu",
                      "key given twice (first on line 5)"));
}

TEST(ConfigRefuse, RequiredKeyMissing) {
  EXPECT_TRUE(refused("nodes: []\n", 1, "job", "required key is missing"));
  EXPECT_TRUE(refused("job:\n  name: demo\nnodes: []\n", 1, "job.id", "required key is missing"));
  EXPECT_TRUE(refused("job: {id: 1, name: x}\n", 1, "nodes", "required key is missing"));
  std::string nodes = "  - name: s0\n    role: server\n    ports: [ring:a]\n";
  EXPECT_TRUE(refused(doc("", nodes), 5, "nodes[0].ipv4", "required key is missing"));
}

TEST(ConfigRefuse, SectionIsNotAMapping) {
  EXPECT_TRUE(refused(doc("network: 5\n"), 4, "network", "expected a mapping, got \"5\""));
  EXPECT_TRUE(refused(doc("", "  - s0\n"), 5, "nodes[0]", "expected a mapping, got \"s0\""));
}

TEST(ConfigRefuse, IntegerExpected) {
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: big\n"), 5, "network.mtu", "expected an integer, got \"big\""));
  EXPECT_TRUE(refused(doc("network:\n  mtu: 1500.0\n"), 5, "network.mtu", "expected an integer"));
  EXPECT_TRUE(
      refused(doc("network:\n  mtu:\n"), 5, "network.mtu", "expected an integer, got no value"));
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: [1]\n"), 5, "network.mtu", "expected an integer, got a list"));
}

TEST(ConfigRefuse, QuotedNumberIsAString) {
  EXPECT_TRUE(refused(doc("network:\n  mtu: \"1500\"\n"), 5, "network.mtu",
                      "expected an integer, got the quoted string \"1500\""));
  EXPECT_TRUE(refused(doc("network:\n  mtu: !!int 1500\n"), 5, "network.mtu",
                      "expected an integer, got \"1500\" tagged tag:yaml.org,2002:int"));
}

TEST(ConfigRefuse, IntegerOutOfRange) {
  EXPECT_TRUE(
      refused(doc("network:\n  mtu: 575\n"), 5, "network.mtu", "575 is out of range (576..9000)"));
  EXPECT_TRUE(refused(doc("network:\n  mtu: 9001\n"), 5, "network.mtu", "out of range"));
  EXPECT_TRUE(refused("job:\n  id: -1\n", 2, "job.id", "-1 is out of range (0..4294967295)"));
  EXPECT_TRUE(refused("job:\n  id: 4294967296\n", 2, "job.id", "out of range"));
  EXPECT_TRUE(refused(doc("link: {seed: 18446744073709551616}\n"), 4, "link.seed",
                      "18446744073709551616 is out of range"));
}

TEST(ConfigRefuse, BooleanExpected) {
  EXPECT_TRUE(refused(doc("network:\n  udp_checksum: yes\n"), 5, "network.udp_checksum",
                      "expected true or false, got \"yes\""));
}

TEST(ConfigRefuse, NumberExpected) {
  EXPECT_TRUE(
      refused(doc("link:\n  loss: lots\n"), 5, "link.loss", "expected a number, got \"lots\""));
  EXPECT_TRUE(refused(doc("link:\n  loss: .nan\n"), 5, "link.loss", "expected a number"));
}

TEST(ConfigRefuse, StringExpected) {
  EXPECT_TRUE(
      refused("job:\n  id: 1\n  name: [demo]\n", 3, "job.name", "expected a string, got a list"));
}

TEST(ConfigRefuse, ListExpected) {
  EXPECT_TRUE(refused(doc("eal:\n  extra: --log-level=8\n"), 5, "eal.extra",
                      "expected a list, got \"--log-level=8\""));
}

TEST(ConfigRefuse, NotOneOfTheChoices) {
  EXPECT_TRUE(refused(doc("network:\n  scheduler: prio\n"), 5, "network.scheduler",
                      "\"prio\" is not one of strict, fifo, partition"));
  EXPECT_TRUE(refused(doc("eal:\n  hugepages: yes\n"), 5, "eal.hugepages",
                      "\"yes\" is not one of auto, on, off"));
  EXPECT_TRUE(refused(doc("training:\n  sync: bulk\n"), 5, "training.sync",
                      "is not one of bsp, asp, ssp, psplus"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: lamb\n"), 5, "training.optimizer",
                      "is not one of sgd, momentum, adam, sum"));
  std::string nodes = "  - name: s0\n    role: boss\n";
  EXPECT_TRUE(refused(doc("", nodes), 6, "nodes[0].role", "\"boss\" is not one of server, worker"));
}

// ----------------------------------------------- refused: job and network

TEST(ConfigRefuse, JobNameNotAName) {
  EXPECT_TRUE(refused("job:\n  id: 1\n  name: My Job\n", 3, "job.name",
                      "\"My Job\" must match [a-z0-9_-]+ and be at most 32 characters"));
  EXPECT_TRUE(refused("job:\n  id: 1\n  name: " + std::string(33, 'a') + "\n", 3, "job.name",
                      "must match [a-z0-9_-]+"));
  // A multi-line value is shown on one line.
  EXPECT_TRUE(refused("job:\n  id: 1\n  name: |\n    a\n    b\n", 3, "job.name",
                      "\"a\\nb\\n\" must match"));
}

TEST(ConfigRefuse, UdpPortOutOfRange) {
  EXPECT_TRUE(refused(doc("network: {udp_port: 0}\n"), 4, "network.udp_port",
                      "0 is out of range (1..65535)"));
  std::string nodes = std::string(kNodes) + "    udp_port: 65536\n";
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].udp_port", "65536 is out of range (1..65535)"));
}

TEST(ConfigRefuse, PeerTimeoutOutOfRange) {
  EXPECT_TRUE(refused(doc("network: {peer_timeout_ms: 99}\n"), 4, "network.peer_timeout_ms",
                      "99 is out of range (100..600000)"));
}

TEST(ConfigRefuse, PartitionKeysNeedThePartitionScheduler) {
  EXPECT_TRUE(refused(doc("network:\n  partition_bytes: 65536\n"), 5, "network.partition_bytes",
                      "only used by scheduler partition (network.scheduler is strict)"));
  EXPECT_TRUE(refused(doc("network:\n  scheduler: fifo\n  credit_bytes: 65536\n"), 6,
                      "network.credit_bytes",
                      "only used by scheduler partition (network.scheduler is fifo)"));
}

TEST(ConfigRefuse, PartitionBytesTooSmall) {
  EXPECT_TRUE(refused(doc("network:\n  scheduler: partition\n  partition_bytes: 4095\n"), 6,
                      "network.partition_bytes", "4095 is out of range (4096..4294967295)"));
}

TEST(ConfigRefuse, CreditSmallerThanPartition) {
  EXPECT_TRUE(refused(doc("network:\n  scheduler: partition\n  partition_bytes: 65536\n"
                          "  credit_bytes: 8192\n"),
                      7, "network.credit_bytes",
                      "8192 credit bytes are fewer than network.partition_bytes (65536)"));
  // Only partition_bytes given, above the default credit: the error points at it.
  EXPECT_TRUE(refused(doc("network:\n  scheduler: partition\n  partition_bytes: 16777216\n"), 6,
                      "network.partition_bytes",
                      "8388608 credit bytes are fewer than network.partition_bytes (16777216)"));
}

// ------------------------------------------------- refused: mempool, eal, link

TEST(ConfigRefuse, TooFewMbufs) {
  EXPECT_TRUE(refused(doc("mempool:\n  mbufs: 1022\n"), 5, "mempool.mbufs",
                      "1022 is out of range (1023..4294967295)"));
}

TEST(ConfigRefuse, CacheAboveDpdkMaximum) {
  EXPECT_TRUE(
      refused(doc("mempool:\n  cache: 513\n"), 5, "mempool.cache", "513 is out of range (0..512)"));
}

TEST(ConfigRefuse, MemoryOutOfRange) {
  EXPECT_TRUE(refused(doc("eal:\n  memory_mb: 63\n"), 5, "eal.memory_mb",
                      "63 is out of range (64..65536)"));
}

TEST(ConfigRefuse, ExtraRepeatsAGeneratedOption) {
  EXPECT_TRUE(refused(doc("eal:\n  extra:\n    - --log-level=8\n    - --lcores=0@0\n"), 7,
                      "eal.extra[1]",
                      "\"--lcores=0@0\" is generated from nodes[].lcores; set it there"));
  EXPECT_TRUE(refused(doc("eal:\n  extra: [--no-huge]\n"), 5, "eal.extra[0]",
                      "generated from eal.hugepages"));
  EXPECT_TRUE(refused(doc("eal:\n  extra: [-m, \"256\"]\n"), 5, "eal.extra[0]",
                      "generated from eal.memory_mb"));
  EXPECT_TRUE(refused(doc("eal:\n  extra: [--file-prefix=x]\n"), 5, "eal.extra[0]",
                      "generated from job.name"));
}

TEST(ConfigRefuse, ExtraItemNotAString) {
  EXPECT_TRUE(refused(doc("eal:\n  extra: [{a: 1}]\n"), 5, "eal.extra[0]",
                      "expected a string, got a mapping"));
}

TEST(ConfigRefuse, RateOutOfRange) {
  EXPECT_TRUE(refused(doc("link:\n  rate_gbps: 0.0005\n"), 5, "link.rate_gbps",
                      "0.0005 is out of range (0 for unlimited, else 0.001..400)"));
  EXPECT_TRUE(refused(doc("link:\n  rate_gbps: 401\n"), 5, "link.rate_gbps", "out of range"));
  EXPECT_TRUE(refused(doc("link:\n  rate_gbps: -1\n"), 5, "link.rate_gbps", "out of range"));
}

TEST(ConfigRefuse, DelayOutOfRange) {
  EXPECT_TRUE(refused(doc("link:\n  delay_us: 1000001\n"), 5, "link.delay_us",
                      "1000001 is out of range (0..1000000)"));
}

TEST(ConfigRefuse, ProbabilityOutOfRange) {
  EXPECT_TRUE(refused(doc("link:\n  loss: 1.0\n"), 5, "link.loss", "1.0 is out of range [0, 1)"));
  EXPECT_TRUE(
      refused(doc("link:\n  duplicate: -0.1\n"), 5, "link.duplicate", "out of range [0, 1)"));
  EXPECT_TRUE(refused(doc("link:\n  reorder: 2\n"), 5, "link.reorder", "out of range [0, 1)"));
  EXPECT_TRUE(refused(doc("link:\n  corrupt: 1\n"), 5, "link.corrupt", "out of range [0, 1)"));
}

// ------------------------------------------------------ refused: training

TEST(ConfigRefuse, SyncModesNotRunEndToEnd) {
  // The server and the worker run BSP only: a job asking for another mode
  // is refused at its key rather than silently trained with BSP.
  for (const char* mode : {"asp", "ssp", "psplus"}) {
    EXPECT_TRUE(refused(doc(std::string("training:\n  sync: ") + mode + "\n"), 5, "training.sync",
                        std::string(mode) +
                            " is not run end to end yet: the server and the worker library run "
                            "bsp only"))
        << mode;
  }
}

TEST(ConfigRefuse, StalenessWithBsp) {
  EXPECT_TRUE(refused(doc("training:\n  sync: bsp\n  staleness: 2\n"), 6, "training.staleness",
                      "2 must be 0 or absent with training.sync bsp"));
  JobConfig job = load_string(doc("training:\n  staleness: 0\n"));
  EXPECT_EQ(job.training.staleness, 0u);
}

TEST(ConfigRefuse, LearningRateWithSum) {
  EXPECT_TRUE(refused(doc("training:\n  optimizer: sum\n  learning_rate: 0.1\n"), 6,
                      "training.learning_rate", "not used by optimizer sum"));
}

TEST(ConfigRefuse, NotPositive) {
  EXPECT_TRUE(refused(doc("training:\n  learning_rate: 0\n"), 5, "training.learning_rate",
                      "0 is out of range (must be > 0)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: adam\n  epsilon: -1e-8\n"), 6,
                      "training.epsilon", "out of range (must be > 0)"));
}

TEST(ConfigRefuse, OptimizerKeyForAnotherOptimizer) {
  EXPECT_TRUE(refused(doc("training:\n  momentum: 0.5\n"), 5, "training.momentum",
                      "only used by optimizer momentum (training.optimizer is sgd)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: momentum\n  beta1: 0.5\n"), 6, "training.beta1",
                      "only used by optimizer adam (training.optimizer is momentum)"));
  EXPECT_TRUE(refused(doc("training:\n  beta2: 0.5\n"), 5, "training.beta2", "only used by"));
  EXPECT_TRUE(refused(doc("training:\n  epsilon: 0.5\n"), 5, "training.epsilon", "only used by"));
}

TEST(ConfigRefuse, OptimizerParameterOutOfRange) {
  EXPECT_TRUE(refused(doc("training:\n  optimizer: momentum\n  momentum: 1\n"), 6,
                      "training.momentum", "1 is out of range [0, 1)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: adam\n  beta2: 1.5\n"), 6, "training.beta2",
                      "out of range [0, 1)"));
}

// ---------------------------------------------------------- refused: nodes

TEST(ConfigRefuse, NodesNotAList) {
  EXPECT_TRUE(refused("job: {id: 1, name: x}\nnodes: {a: 1}\n", 2, "nodes",
                      "expected a list, got a mapping"));
}

TEST(ConfigRefuse, NodesEmpty) {
  EXPECT_TRUE(refused("job: {id: 1, name: x}\nnodes: []\n", 2, "nodes", "the list is empty"));
}

TEST(ConfigRefuse, NodeNameNotAName) {
  std::string nodes = "  - name: Server0\n";
  EXPECT_TRUE(refused(doc("", nodes), 5, "nodes[0].name",
                      "\"Server0\" must match [a-z0-9_-]+ and be at most 32 characters"));
}

TEST(ConfigRefuse, NodeNameRepeated) {
  std::string nodes = std::string(kNodes) + worker("w0", "10.0.0.3", "net_null0", "[3]");
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[2].name", "\"w0\" is already used by nodes[1]"));
}

TEST(ConfigRefuse, Ipv4Malformed) {
  for (const char* bad : {"10.0.0", "10.0.0.256", "010.0.0.1", "localhost"}) {
    std::string nodes = "  - name: s0\n    role: server\n    ipv4: " + std::string(bad) + "\n";
    EXPECT_TRUE(refused(doc("", nodes), 7, "nodes[0].ipv4",
                        "\"" + std::string(bad) +
                            "\" is not an IPv4 address (expected a dotted quad, e.g. 10.0.0.1)"));
  }
}

TEST(ConfigRefuse, Ipv4NotUnicast) {
  for (const char* bad : {"0.0.0.0", "224.0.0.1", "255.255.255.255"}) {
    std::string nodes = "  - name: s0\n    role: server\n    ipv4: " + std::string(bad) + "\n";
    EXPECT_TRUE(refused(doc("", nodes), 7, "nodes[0].ipv4",
                        std::string(bad) + " is not a unicast address"));
  }
}

TEST(ConfigRefuse, EndpointRepeated) {
  std::string nodes = std::string(kNodes) + worker("w1", "10.0.0.1", "net_null0", "[3]");
  EXPECT_TRUE(
      refused(doc("", nodes), 18, "nodes[2].ipv4", "10.0.0.1:47100 is already used by nodes[0]"));
}

TEST(ConfigRefuse, MacMalformed) {
  std::string nodes = std::string(kNodes) + "    mac: zz:00\n";
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].mac",
                      "\"zz:00\" is not a MAC address (expected six hex bytes, e.g. "
                      "02:00:00:00:00:01)"));
}

TEST(ConfigRefuse, MacNotUnicast) {
  for (const char* bad : {"01:00:5e:00:00:01", "00:00:00:00:00:00"}) {
    std::string nodes = std::string(kNodes) + "    mac: " + bad + "\n";
    EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].mac",
                        std::string(bad) + " is not a unicast address"));
  }
}

TEST(ConfigRefuse, MacRepeated) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    mac: 02:00:00:00:00:01\n"
      "    ports: [ring:a]\n    lcores: [0, 1]\n    shards: 1\n" +
      worker("w0", "10.0.0.2", "ring:a") + "    mac: 02:00:00:00:00:01\n";
  EXPECT_TRUE(
      refused(doc("", nodes), 17, "nodes[1].mac", "02:00:00:00:00:01 is already used by nodes[0]"));
}

TEST(ConfigRefuse, PortsEmpty) {
  std::string nodes = "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: []\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports",
                      "the list is empty (a node needs at least one port)"));
}

TEST(ConfigRefuse, PortOfNoKnownForm) {
  std::string nodes = "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [eth0]\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[0]",
                      "\"eth0\" is not a port (expected ring:<link>, net_<driver><n>"));
  // An unquoted vdev in a flow list splits at its commas; the hint says so.
  nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [net_memif0,role=server]\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[1]",
                      "quote vdev strings that hold commas inside [ ]"));
}

TEST(ConfigRefuse, VdevMalformed) {
  for (const char* bad : {"net_memif", "net_0", "net_memif0,role", "net_memif0,=x",
                          "net_memif0,role=server,", "net_Memif0"}) {
    std::string nodes = "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [\"" +
                        std::string(bad) + "\"]\n";
    EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[0]",
                        "\"" + std::string(bad) + "\" is not a vdev string"));
  }
}

TEST(ConfigRefuse, PciMalformed) {
  for (const char* bad : {"03:20.0", "03:00.8", "0:03:00.0", "003:00.0", "0000:3:00.0"}) {
    std::string nodes = "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [\"" +
                        std::string(bad) + "\"]\n";
    EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[0]",
                        "\"" + std::string(bad) + "\" is not a PCI address"));
  }
}

TEST(ConfigRefuse, RingLinkNotAName) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [\"ring:\"]\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[0]",
                      "\"ring:\": the ring link name must match [a-z0-9_-]+"));
}

TEST(ConfigRefuse, RingLinkWithOneEnd) {
  std::string nodes = std::string(kNodes) + worker("w1", "10.0.0.3", "ring:b", "[3]");
  EXPECT_TRUE(refused(doc("", nodes), 19, "nodes[2].ports[0]",
                      "ring link b has only one end (name it on exactly two ports"));
}

TEST(ConfigRefuse, RingLinkWithThreeEnds) {
  std::string nodes = std::string(kNodes) + worker("w1", "10.0.0.3", "ring:a", "[3]");
  EXPECT_TRUE(refused(doc("", nodes), 19, "nodes[2].ports[0]",
                      "ring link a already joins nodes[0].ports[0] and nodes[1].ports[0]"));
}

TEST(ConfigRefuse, RingLinkWithBothEndsOnOneNode) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a, ring:a]\n"
      "    lcores: [0, 1]\n    shards: 1\n" +
      worker("w0", "10.0.0.2", "net_null0");
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[1]",
                      "ring link a has both ends on node s0 (also nodes[0].ports[0])"));
}

TEST(ConfigRefuse, VdevNameRepeatedAcrossNodes) {
  std::string nodes = std::string(kNodes) + worker("w1", "10.0.0.3", "net_null0,size=64", "[3]") +
                      worker("w2", "10.0.0.4", "net_null0", "[4]");
  EXPECT_TRUE(refused(doc("", nodes), 24, "nodes[3].ports[0]",
                      "vdev name net_null0 is already used by nodes[2].ports[0]"));
}

TEST(ConfigRefuse, VdevNameRepeatedWithinNode) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [net_null0, net_null0]\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[1]",
                      "vdev name net_null0 is already used by nodes[0].ports[0]"));
}

TEST(ConfigRefuse, PciDeviceRepeatedWithinNode) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [03:00.0, 0000:03:00.0]\n";
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports[1]",
                      "PCI device 0000:03:00.0 is already used by nodes[0].ports[0]"));
}

TEST(ConfigRefuse, LcoresEmpty) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n    lcores: []\n";
  EXPECT_TRUE(refused(doc("", nodes), 9, "nodes[0].lcores",
                      "the list is empty (the first lcore is the node's net core)"));
}

TEST(ConfigRefuse, LcoreOutOfRange) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n"
      "    lcores: [0, 128]\n";
  EXPECT_TRUE(refused(doc("", nodes), 9, "nodes[0].lcores[1]", "128 is out of range (0..127)"));
}

TEST(ConfigRefuse, LcoreRepeated) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n"
      "    lcores:\n      - 0\n      - 1\n      - 0\n";
  EXPECT_TRUE(refused(doc("", nodes), 12, "nodes[0].lcores[2]",
                      "lcore 0 is listed twice (also nodes[0].lcores[0])"));
}

TEST(ConfigRefuse, ServerWithoutShards) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n"
      "    lcores: [0, 1]\n";
  EXPECT_TRUE(refused(doc("", nodes), 5, "nodes[0].shards", "required for a server (1..64)"));
}

TEST(ConfigRefuse, WorkerWithShards) {
  std::string nodes = std::string(kNodes) + "    shards: 1\n";
  EXPECT_TRUE(refused(doc("", nodes), 16, "nodes[1].shards",
                      "only servers have shards (this node is a worker)"));
}

TEST(ConfigRefuse, ShardsOutOfRange) {
  for (const char* bad : {"0", "65"}) {
    std::string nodes =
        "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n"
        "    lcores: [0, 1]\n    shards: " +
        std::string(bad) + "\n";
    EXPECT_TRUE(refused(doc("", nodes), 10, "nodes[0].shards",
                        std::string(bad) + " is out of range (1..64)"));
  }
}

TEST(ConfigRefuse, MoreShardsThanShardLcores) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [ring:a]\n"
      "    lcores: [0, 1, 2]\n    shards: 3\n";
  EXPECT_TRUE(refused(doc("", nodes), 10, "nodes[0].shards",
                      "3 shards need 3 lcores after the net core, but nodes[0].lcores has 2"));
}

TEST(ConfigRefuse, NoServer) {
  std::string nodes =
      worker("w0", "10.0.0.2", "ring:a") + worker("w1", "10.0.0.3", "ring:a", "[3]");
  EXPECT_TRUE(refused(doc("", nodes), 4, "nodes", "no server (a job needs at least one server"));
}

TEST(ConfigRefuse, NoWorker) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [net_null0]\n    lcores: [0, 1]\n    shards: 1\n";
  EXPECT_TRUE(refused(doc("", nodes), 4, "nodes", "no worker (a job needs at least one server"));
}

TEST(ConfigRefuse, TooManyWorkers) {
  std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [net_null0]\n    lcores: [0, 1]\n    shards: 1\n";
  for (int i = 0; i < 65; ++i) {
    nodes += worker("w" + std::to_string(i), "10.0.1." + std::to_string(i + 1),
                    "net_null" + std::to_string(i + 1), "[2]");
  }
  // Worker 65 is nodes[65]; its block starts on line 11 + 64 * 5, role on the next line.
  EXPECT_TRUE(refused(doc("", nodes), 11 + 64 * 5 + 1, "nodes[65].role",
                      "worker 65 is over the limit of 64 workers"));
}

}  // namespace
}  // namespace mercury::config
