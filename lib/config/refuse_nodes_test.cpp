// Refusals in the node list: names, addresses, MACs, port forms, ring links,
// vdev and PCI reuse, lcores, shards, and the rules across nodes (no server,
// no worker, too many workers), each with its file, line and key.
#include <gtest/gtest.h>

#include <string>

#include "config/load_test_util.h"

namespace mercury::config {
namespace {

using test::doc;
using test::kNodes;
using test::refused;
using test::worker;

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

// A spare worker (docs/membership.md, "Spare workers"): w1 after the two
// nodes, its `spare` key on line 21.
const std::string kSpare =
    std::string(kNodes) + worker("w1", "10.0.0.3", "net_null0", "[3]") + "    spare: true\n";

TEST(ConfigRefuse, SpareIsNoRank) {
  const JobConfig job = load_string(doc("training:\n  sync: asp\n", kSpare), "t.yaml");
  ASSERT_EQ(job.workers().size(), 1u);  // the world size counts ranks only
  EXPECT_EQ(job.workers()[0]->name, "w0");
  ASSERT_EQ(job.spares().size(), 1u);
  EXPECT_EQ(job.spares()[0]->name, "w1");
  EXPECT_TRUE(job.node("w1").spare);
  EXPECT_EQ(job.node("w1").rank, 0u);  // among the spares
  EXPECT_EQ(job.training.spare_grace_s, 2.0);
  const JobConfig graced =
      load_string(doc("training:\n  sync: psplus\n  spare_grace_s: 0.5\n", kSpare), "t.yaml");
  EXPECT_EQ(graced.training.spare_grace_s, 0.5);
}

TEST(ConfigRefuse, SpareUnderBsp) {
  EXPECT_TRUE(refused(doc("", kSpare), 21, "nodes[2].spare",
                      "a spare needs training.sync asp, ssp or psplus (training.sync is bsp)"));
}

TEST(ConfigRefuse, SpareNotAWorker) {
  std::string nodes(kNodes);
  nodes.insert(nodes.find("  - name: w0"), "    spare: true\n");  // line 11
  EXPECT_TRUE(refused(doc("", nodes), 11, "nodes[0].spare", "only a worker is a spare"));
}

TEST(ConfigRefuse, SpareNotABoolean) {
  std::string nodes = kSpare;
  nodes.replace(nodes.rfind("true"), 4, "maybe");
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n", nodes), 23, "nodes[2].spare",
                      "expected true or false"));
}

TEST(ConfigRefuse, SpareGraceWithoutASpare) {
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n  spare_grace_s: 1\n"), 6,
                      "training.spare_grace_s", "only used with a spare worker"));
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n  spare_grace_s: -1\n", kSpare), 6,
                      "training.spare_grace_s", "expected 0..86400 seconds"));
}

TEST(ConfigRefuse, OnlySpares) {
  const std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [net_null0]\n    lcores: [0, 1]\n    shards: 1\n" +
      worker("w1", "10.0.0.3", "net_null1", "[3]") + "    spare: true\n";
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n", nodes), 6, "nodes", "no worker but spares"));
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

TEST(ConfigRefuse, MemifFramesMustFitOneBuffer) {
  // A server on net_memif with the default bsize (2048): MTU 1500 fits, 9000 does not.
  const auto nodes = [](std::string_view args) {
    return "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
           "    ports: [\"net_memif0,role=server" +
           std::string(args) + "\"]\n    lcores: [0, 1]\n    shards: 1\n" +
           worker("w0", "10.0.0.2", "net_memif1,role=client" + std::string(args));
  };
  EXPECT_NO_THROW(load_string(doc("", nodes(""))));
  EXPECT_TRUE(refused(doc("network:\n  mtu: 9000\n", nodes("")), 10, "nodes[0].ports[0]",
                      "network.mtu 9000 makes frames of 9014 bytes, which net_memif must carry "
                      "in one buffer: add bsize=9014 or more (e.g. bsize=9216) to both ends of "
                      "the link (now 2048)"));
  EXPECT_NO_THROW(load_string(doc("network:\n  mtu: 9000\n", nodes(",bsize=9216"))));
  EXPECT_TRUE(refused(doc("", nodes(",bsize=lots")), 8, "nodes[0].ports[0]",
                      "bsize \"lots\" is not a buffer size (1..65535 bytes)"));
}

TEST(ConfigRefuse, ServerWithNoPortToAWorker) {
  // Two ports, three workers: neither one port for all nor one per worker.
  const std::string nodes =
      "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n"
      "    ports: [\"net_memif0,role=server\", \"net_memif1,role=server\"]\n"
      "    lcores: [0, 1]\n    shards: 1\n" +
      worker("w0", "10.0.0.2", "net_memif10,role=client") +
      worker("w1", "10.0.0.3", "net_memif11,role=client") +
      worker("w2", "10.0.0.4", "net_memif12,role=client");
  EXPECT_TRUE(refused(doc("", nodes), 8, "nodes[0].ports",
                      "no port of server s0 leads to worker w0 (rank 0): give the server one port "
                      "for all workers, one port per worker in rank order (the spares' after the "
                      "ranks'), or a ring: link to it"));
}

TEST(ConfigRefuse, VdevArgumentsThePmdDoesNotTake) {
  const auto nodes = [](std::string_view server_port) {
    return "  - name: s0\n    role: server\n    ipv4: 10.0.0.1\n    ports: [\"" +
           std::string(server_port) + "\"]\n    lcores: [0, 1]\n    shards: 1\n" +
           worker("w0", "10.0.0.2", "net_memif1,role=client");
  };
  EXPECT_NO_THROW(load_string(doc("", nodes("net_memif0,role=server,id=0,socket=/tmp/x.sock,"
                                            "socket-abstract=no,zero-copy=no,rsize=10"))));
  EXPECT_TRUE(refused(doc("", nodes("net_memif0,zole=server")), 8, "nodes[0].ports[0]",
                      "\"net_memif0,zole=server\": \"zole\" is not an argument of net_memif "
                      "(it takes id, role, bsize, rsize, socket, socket-abstract, mac, zero-copy, "
                      "owner-uid, owner-gid, secret)"));
  EXPECT_TRUE(refused(doc("", nodes("net_memif0,role=master")), 8, "nodes[0].ports[0]",
                      "role \"master\" is neither server nor client"));
  EXPECT_TRUE(refused(doc("", nodes("net_memif0,role=server,zero-copy=yes")), 8,
                      "nodes[0].ports[0]", "zero-copy=yes needs role=client"));
  EXPECT_TRUE(refused(doc("", nodes("net_memif0,role=client,zero-copy=1")), 8, "nodes[0].ports[0]",
                      "zero-copy \"1\" is neither yes nor no"));
  EXPECT_TRUE(refused(doc("", nodes("net_af_packet0,iface=veth0,queues=2")), 8, "nodes[0].ports[0]",
                      "\"queues\" is not an argument of net_af_packet"));
  // Drivers Mercury does not know are left to their PMD.
  EXPECT_NO_THROW(load_string(doc("", nodes("net_vhost0,iface=/tmp/v.sock,queues=1"))));
}

// A hot standby (docs/durability.md): s0 names s0b; one line per node.
std::string standby_nodes(std::string_view s0 = "lcores: [0], shards: 1, standby: s0b",
                          std::string_view s0b = "lcores: [0]",
                          std::string_view s0_port = "net_af_packet0,iface=eth0") {
  return "  - {name: s0, role: server, ipv4: 10.0.0.1, ports: [\"" + std::string(s0_port) +
         "\"], " + std::string(s0) +
         "}\n"
         "  - {name: s0b, role: standby, ipv4: 10.0.0.2, ports: [\"net_af_packet1,iface=eth0\"], " +
         std::string(s0b) +
         "}\n"
         "  - {name: w0, role: worker, ipv4: 10.0.0.3, ports: [\"net_af_packet2,iface=eth0\"], "
         "lcores: [0]}\n";
}

TEST(ConfigLoad, StandbyPairIsRead) {
  const JobConfig job = load_string(doc("", standby_nodes()), "t.yaml");
  const NodeConfig& s0 = job.node("s0");
  const NodeConfig& s0b = job.node("s0b");
  EXPECT_EQ(s0.standby, "s0b");
  EXPECT_EQ(s0b.role, Role::kStandby);
  EXPECT_EQ(s0b.standby, "s0");
  EXPECT_EQ(s0b.rank, s0.rank);
  EXPECT_EQ(s0b.shards, 0u);
  ASSERT_EQ(job.servers().size(), 1u);  // the standby is no server of the layout
  EXPECT_EQ(job.servers()[0]->name, "s0");
  EXPECT_EQ(job.workers().size(), 1u);
}

// Two servers, each with a standby of its own.
TEST(ConfigLoad, EveryServerMayHaveAStandby) {
  const std::string two =
      standby_nodes() +
      "  - {name: s1, role: server, ipv4: 10.0.0.4, ports: [\"net_af_packet3,iface=eth0\"], "
      "lcores: [0], shards: 1, standby: s1b}\n"
      "  - {name: s1b, role: standby, ipv4: 10.0.0.5, ports: [\"net_af_packet4,iface=eth0\"], "
      "lcores: [0]}\n";
  const JobConfig job = load_string(doc("", two), "t.yaml");
  ASSERT_EQ(job.servers().size(), 2u);
  EXPECT_EQ(job.node("s0b").standby, "s0");
  EXPECT_EQ(job.node("s1b").standby, "s1");
  EXPECT_EQ(job.node("s1b").rank, job.node("s1").rank);
  EXPECT_EQ(job.node("s1").rank, 1u);
  // One standby for both: refused on the second server's key.
  std::string shared = two;
  shared.replace(shared.find("standby: s1b"), 12, "standby: s0b");
  EXPECT_TRUE(refused(doc("", shared), 8, "nodes[3].standby",
                      "s0b stands by for s0 already: a standby stands by for one server"));
  // Servers that roll back (docs/durability.md, "Several servers") would leave their
  // standbys ahead.
  EXPECT_TRUE(refused(doc("network:\n  on_server_loss: wait\n"
                          "checkpoint: {dir: c, every_versions: 10}\n",
                          two),
                      5, "network.on_server_loss",
                      "wait with 2 server nodes and a standby (s0's s0b) is not built"));
}

TEST(ConfigRefuse, StandbyNamesNoStandby) {
  EXPECT_TRUE(refused(doc("", standby_nodes("lcores: [0], shards: 1, standby: s9")), 5,
                      "nodes[0].standby", "no node is called"));
  EXPECT_TRUE(refused(doc("", standby_nodes("lcores: [0], shards: 1, standby: w0")), 5,
                      "nodes[0].standby", "w0 is a worker, not a standby"));
  EXPECT_TRUE(refused(doc("", standby_nodes("lcores: [0, 1], shards: 1")), 6, "nodes[1].role",
                      "standby s0b stands by for no server"));
}

TEST(ConfigRefuse, StandbyOutsideWhatIsBuilt) {
  EXPECT_TRUE(refused(doc("training: {sync: asp}\n", standby_nodes()), 6, "nodes[0].standby",
                      "a standby needs training.sync bsp"));
  EXPECT_TRUE(refused(doc("training: {aggregation: tensor}\n", standby_nodes()), 6,
                      "nodes[0].standby", "a standby needs training.aggregation chunk"));
  EXPECT_TRUE(refused(doc("training: {on_worker_loss: shrink}\n", standby_nodes()), 6,
                      "nodes[0].standby",
                      "a standby with training.on_worker_loss shrink is not built"));
  EXPECT_TRUE(refused(doc("", standby_nodes("lcores: [0, 1], shards: 1, standby: s0b")), 5,
                      "nodes[0].lcores", "run their shards on their net core"));
  EXPECT_TRUE(refused(doc("", standby_nodes("lcores: [0], shards: 1, standby: s0b", "lcores: [0]",
                                            "net_memif0,role=server,id=0,socket=/tmp/s.sock")),
                      5, "nodes[0].ports[0]", "a memif or ring link joins two nodes only"));
  EXPECT_TRUE(refused(
      doc("", standby_nodes("lcores: [0], shards: 1, standby: s0b", "lcores: [0], shards: 1")), 6,
      "nodes[1].shards", "a standby runs its server's shards"));
  EXPECT_TRUE(refused(
      doc("", std::string(kNodes) + "  - {name: w1, role: worker, ipv4: 10.0.0.9, ports: [ring:b], "
                                    "lcores: [3], standby: s0}\n"),
      16, "nodes[2].standby", "only a server names a standby"));
}

}  // namespace
}  // namespace mercury::config
