// NodeNetworks: a job file's nodes brought up on real ports in one process.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <stdexcept>

#include "config/config.h"
#include "net/node.h"
#include "pmd_env.h"

namespace mercury::net {
namespace {

constexpr const char* kJob = R"(
job: {id: 3, name: nodetest}
network: {mtu: 9000}
mempool: {mbufs: 2047, cache: 32}
link: {loss: 0.5, seed: 9}
nodes:
  - {name: s, role: server, ipv4: 10.1.0.1, mac: "02:00:00:00:01:01", ports: ["ring:a", "ring:b"],
     lcores: [0, 1], shards: 1}
  - {name: a, role: worker, ipv4: 10.1.0.2, ports: ["ring:a"], lcores: [2]}
  - {name: b, role: worker, ipv4: 10.1.0.3, mac: "02:00:00:00:01:03", ports: ["ring:b"],
     lcores: [3]}
)";

TEST(NodeNetworks, BuildsRingLinksWithAddressesArpAndTheEmulator) {
  const config::JobConfig job = config::load_string(kJob, "node.yaml");
  NodeNetworks nets(job, {"s", "a", "b"});
  ASSERT_EQ(nets.ports_of("s").size(), 2u);
  ASSERT_EQ(nets.ports_of("a").size(), 1u);
  NodePort& s0 = *nets.ports_of("s")[0];
  NodePort& a0 = *nets.ports_of("a")[0];
  NodePort& b0 = *nets.ports_of("b")[0];
  EXPECT_EQ(s0.port->mtu(), 9000u);
  EXPECT_EQ(s0.interface->local().mac.to_string(), "02:00:00:00:01:01");  // from the job
  EXPECT_EQ(b0.interface->local().mac.to_string(), "02:00:00:00:01:03");
  EXPECT_FALSE(a0.interface->local().mac.is_zero());  // none configured: the port's own
  EXPECT_EQ(a0.interface->local().ip, 0x0a010002u);
  EXPECT_EQ(a0.interface->local().udp_port, 47100);
  // The job's link section attaches an emulator to every port, each seeded apart.
  ASSERT_NE(s0.emulator, nullptr);
  EXPECT_NE(s0.emulator->model().params().seed,
            nets.ports_of("s")[1]->emulator->model().params().seed);

  // a knows s's MAC statically (s has one in the job): a route at once, no ARP.
  Route r;
  EXPECT_TRUE(a0.interface->resolve_st(0x0a010001, 47100, r, rte_rdtsc()));
  EXPECT_EQ(r.dst_mac.to_string(), "02:00:00:00:01:01");
  EXPECT_EQ(a0.interface->counters().arp_requests_sent, 0u);
  // s has no static entry for a (a has no MAC in the job): it must ask.
  EXPECT_FALSE(s0.interface->resolve_st(0x0a010002, 47100, r, rte_rdtsc()));
  EXPECT_EQ(s0.interface->counters().arp_requests_sent, 1u);
}

TEST(NodeNetworks, RingToANodeOfAnotherProcessIsRefused) {
  const config::JobConfig job = config::load_string(kJob, "node.yaml");
  try {
    NodeNetworks nets(job, {"s", "a"});
    FAIL() << "a ring link to node b, not in this process, was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ring:b"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("net_memif"), std::string::npos) << e.what();
  }
}

TEST(NodeNetworks, ChecksumsAutoLeavesThemOutOverSharedMemoryOnly) {
  // kJob's link emulator loses packets but does not corrupt them.
  auto mode = [](const std::string& network, const std::string& link) {
    std::string yaml = kJob;
    yaml.replace(yaml.find("network: {mtu: 9000}"), 20, network);
    yaml.replace(yaml.find("link: {loss: 0.5, seed: 9}"), 26, link);
    // Ring link names are process-wide: each call gets its own.
    static int serial = 0;
    const std::string tag = std::to_string(serial++);
    for (const char* l : {"ring:a", "ring:b"}) {
      for (size_t at = yaml.find(l); at != std::string::npos; at = yaml.find(l, at + 1)) {
        yaml.insert(at + 6, "x" + tag);
      }
    }
    const config::JobConfig job = config::load_string(yaml, "node.yaml");
    NodeNetworks nets(job, {"s", "a", "b"});
    return nets.ports_of("a")[0]->interface->checksum_mode();
  };
  EXPECT_EQ(mode("network: {mtu: 9000}", "link: {loss: 0.5}"), ChecksumMode::kNone);
  EXPECT_EQ(mode("network: {mtu: 9000, udp_checksum: true}", "link: {loss: 0.5}"),
            ChecksumMode::kSoftware);
  // A link emulator that corrupts frames makes the ring a link that can corrupt.
  EXPECT_EQ(mode("network: {mtu: 9000}", "link: {corrupt: 0.01}"), ChecksumMode::kSoftware);
  EXPECT_EQ(mode("network: {mtu: 9000, udp_checksum: false}", "link: {corrupt: 0.01}"),
            ChecksumMode::kNone);
}

}  // namespace
}  // namespace mercury::net

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
