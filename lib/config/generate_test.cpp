// Job files written from an allocation (generate.h): each result is loaded
// back by the loader and compared with what the hosts ask for.
#include "config/generate.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace mercury::config {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kDigits = std::string(MERCURY_CONFIG_DIR) + "/digits.yaml";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Generate, HostFilesAndSlurmCounts) {
  const auto hosts = parse_hostfile(
      "# the allocation\n"
      "\n"
      "node1 nic=0000:03:00.0,0000:03:00.1 servers=1 workers=1 cpus=16  # a comment\n"
      "node2 workers=2\n",
      "hosts.txt");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].nics, (std::vector<std::string>{"0000:03:00.0", "0000:03:00.1"}));
  EXPECT_EQ(hosts[0].servers, 1u);
  EXPECT_EQ(hosts[0].cpus, 16u);
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[1].workers, 2u);
  EXPECT_FALSE(hosts[1].servers.has_value());
  EXPECT_EQ(error_of([] { parse_hostfile("a\nb gpus=4\n", "h"); }),
            "h:2: host b gpus: unknown key (a host takes nic, servers, workers and cpus)");
  EXPECT_EQ(error_of([] { parse_hostfile("a cpus=x\n", "h"); }),
            "h:1: host a cpus: 'x' is not a whole number 0..1048576");
  EXPECT_EQ(error_of([] { parse_hostfile("a\na\n", "h"); }), "h:2: host a: is listed twice");
  EXPECT_EQ(error_of([] { parse_hostfile("a nic\n", "h"); }),
            "h:1: host a nic: expected key=value, not 'nic'");
  EXPECT_EQ(error_of([] { parse_hostfile("# nothing\n", "h"); }), "h: lists no host");
  EXPECT_EQ(parse_host_list("a,b").size(), 2u);
  EXPECT_EQ(error_of([] { parse_host_list("a,,b"); }), "--hosts: '' is not a host name");

  EXPECT_EQ(parse_slurm_cpus_per_node("8(x2),4"), (std::vector<uint32_t>{8, 8, 4}));
  EXPECT_EQ(parse_slurm_cpus_per_node("72"), (std::vector<uint32_t>{72}));
  EXPECT_THROW(parse_slurm_cpus_per_node("8(x"), ConfigError);
  EXPECT_THROW(parse_slurm_cpus_per_node("0"), ConfigError);
  EXPECT_THROW(parse_slurm_cpus_per_node(""), ConfigError);
}

// The digits job as one host of 2 CPUs gives it: the same sections, the same
// layout of lcores and shards, memif between the server and each worker.
TEST(Generate, OneHostOverMemifFromATemplate) {
  GenerateOptions o;
  o.template_text = read(kDigits);
  o.template_source = kDigits;
  o.nics = {"memif"};
  o.workers_per_host = 4;
  o.cpus = 2;
  o.memif_dir = "/tmp/run";
  o.origin = "SLURM_JOB_NODELIST";
  const std::string text = generate_job(parse_host_list("vm"), o);
  const JobConfig got = load_string(text, "generated.yaml");
  const JobConfig want = load_file(kDigits);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.network.mtu, 9000u);
  EXPECT_EQ(got.mempool.mbufs, want.mempool.mbufs);
  EXPECT_EQ(got.eal.memory_mb, want.eal.memory_mb);
  EXPECT_EQ(got.training.optimizer, Optimizer::kMomentum);
  EXPECT_EQ(got.training.learning_rate, want.training.learning_rate);  // bit for bit
  EXPECT_EQ(got.training.momentum, want.training.momentum);
  ASSERT_EQ(got.nodes.size(), want.nodes.size());
  for (size_t i = 0; i < got.nodes.size(); ++i) {
    EXPECT_EQ(got.nodes[i].role, want.nodes[i].role) << i;
    EXPECT_EQ(got.nodes[i].rank, want.nodes[i].rank) << i;
    EXPECT_EQ(got.nodes[i].lcores, want.nodes[i].lcores) << i;  // [0, 1], [2], ..., [5]
    EXPECT_EQ(got.nodes[i].shards, want.nodes[i].shards) << i;
    EXPECT_TRUE(got.nodes[i].mac.has_value()) << i;
  }
  EXPECT_EQ(got.nodes[0].name, "s0");
  EXPECT_EQ(got.nodes[1].name, "w0");
  EXPECT_EQ(got.nodes[1].ipv4.to_string(), "10.0.0.2");
  ASSERT_EQ(got.nodes[0].ports.size(), 4u);
  EXPECT_EQ(got.nodes[0].ports[3].text,
            "net_memif3,role=server,id=0,socket=/tmp/run/digits-w3.sock,bsize=9216");
  EXPECT_EQ(got.nodes[4].ports[0].text,
            "net_memif7,role=client,id=0,socket=/tmp/run/digits-w3.sock,bsize=9216");
  EXPECT_NE(text.find("# Written by ps-job from SLURM_JOB_NODELIST: 1 host, 1 server, 4 workers"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  - name: w2  # host vm\n"), std::string::npos) << text;
  EXPECT_EQ(multi_prog(got, "ps-server", "python3 train.py"),
            "# srun --multi-prog: rank r runs node r of generated.yaml\n"
            "0 ps-server\n"
            "1-4 python3 train.py\n");
}

// Two hosts over net_af_packet, each node on an interface of its own, no MACs
// (ARP finds them), written host by host.
TEST(Generate, HostsOverAfPacketFromAHostFile) {
  const auto hosts = parse_hostfile(
      "nsa nic=af_packet:eth0,af_packet:eth1 servers=1 workers=1\n"
      "nsb nic=af_packet:eth0,af_packet:eth1 servers=0 workers=2\n",
      "hosts.txt");
  GenerateOptions o;
  o.name = "ns";
  o.id = 44;
  o.cpus = 2;
  o.subnet = "10.79.0.0/24";
  const JobConfig j = load_string(generate_job(hosts, o), "g.yaml");
  EXPECT_EQ(j.id, 44u);
  ASSERT_EQ(j.nodes.size(), 4u);
  const char* names[] = {"s0", "w0", "w1", "w2"};
  const char* ports[] = {"net_af_packet0,iface=eth0", "net_af_packet1,iface=eth1",
                         "net_af_packet2,iface=eth0", "net_af_packet3,iface=eth1"};
  const std::vector<std::vector<uint32_t>> lcores = {{0, 1}, {2}, {0}, {1}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(j.nodes[i].name, names[i]);
    EXPECT_EQ(j.nodes[i].ports.at(0).text, ports[i]);
    EXPECT_EQ(j.nodes[i].lcores, lcores[i]);
    EXPECT_FALSE(j.nodes[i].mac.has_value());
    EXPECT_EQ(j.nodes[i].ipv4.to_string(), "10.79.0." + std::to_string(i + 1));
  }
  EXPECT_EQ(j.training.sync, Sync::kBsp);  // no template: the defaults
}

// PCI NICs (ports or virtual functions), shards from the CPU count.
TEST(Generate, PciHostsShardsFromTheCpus) {
  std::vector<HostSpec> hosts = parse_host_list("a,b");
  GenerateOptions o;
  o.name = "pci";
  o.nics = {"0000:03:00.0", "03:00.1", "0000:03:00.2"};
  o.servers_per_host = 1;
  o.workers_per_host = 2;
  o.cpus = 16;
  const JobConfig j = load_string(generate_job(hosts, o), "g.yaml");
  ASSERT_EQ(j.nodes.size(), 6u);
  EXPECT_EQ(j.nodes[0].shards, 13u);  // 16 CPUs, 2 workers: 14 for the server
  EXPECT_EQ(j.nodes[0].lcores.size(), 14u);
  EXPECT_EQ(j.nodes[1].lcores, std::vector<uint32_t>{14});
  EXPECT_EQ(j.nodes[2].ports[0].text, "0000:03:00.2");
  EXPECT_EQ(j.nodes[3].name, "s1");
  EXPECT_EQ(j.nodes[3].lcores.front(), 0u);
  EXPECT_EQ(j.workers().size(), 4u);
  EXPECT_EQ(multi_prog(j, "ps-server", "t"),
            "# srun --multi-prog: rank r runs node r of g.yaml\n0,3 ps-server\n1-2,4-5 t\n");
  o.shards = 2;
  EXPECT_EQ(load_string(generate_job(hosts, o), "g.yaml").nodes[0].shards, 2u);
}

// A template of a training section alone: what it sets carries over, and
// keys of other optimizers stay out.
TEST(Generate, ATemplateWithoutNodesOrJob) {
  GenerateOptions o;
  o.template_text =
      "training: {sync: ssp, staleness_bound: 0, optimizer: adamw, learning_rate: 0.003,\n"
      "           beta2: 0.98, epsilon: 1.0e-7, weight_decay: 0.01}\n"
      "link: {loss: 0.01, rate_steps: [{at_s: 1.5, rate_gbps: 2}]}\n"
      "eal: {hugepages: off, extra: [\"--log-level=lib.eal:debug\"]}\n";
  o.template_source = "t.yaml";
  o.name = "adam";
  o.nics = {"memif"};
  o.workers_per_host = 2;
  o.cpus = 4;
  const JobConfig j = load_string(generate_job(parse_host_list("h"), o), "g.yaml");
  EXPECT_EQ(j.name, "adam");
  EXPECT_EQ(j.id, 1u);
  EXPECT_EQ(j.training.sync, Sync::kSsp);
  EXPECT_EQ(j.training.staleness_bound, 0u);
  EXPECT_EQ(j.training.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(j.training.weight_decay, 0.01);
  EXPECT_EQ(j.training.learning_rate, 0.003);
  EXPECT_EQ(j.training.beta2, 0.98);
  EXPECT_EQ(j.training.epsilon, 1.0e-7);
  EXPECT_EQ(j.link.loss, 0.01);
  ASSERT_EQ(j.link.rate_steps.size(), 1u);
  EXPECT_EQ(j.link.rate_steps[0].at_s, 1.5);
  EXPECT_EQ(j.eal.hugepages, Hugepages::kOff);
  EXPECT_EQ(j.eal.extra, std::vector<std::string>{"--log-level=lib.eal:debug"});
  EXPECT_EQ(j.nodes[0].shards, 1u);  // 4 CPUs, 2 workers: 2 for the server
  EXPECT_EQ(j.nodes[0].lcores, (std::vector<uint32_t>{0, 1}));
}

TEST(Generate, WhatCannotMakeAJobIsRefused) {
  GenerateOptions o;
  o.name = "x";
  o.cpus = 2;
  o.origin = "hosts.txt";
  const auto hosts = parse_hostfile("a nic=af_packet:eth0 workers=1\n", "hosts.txt");
  EXPECT_EQ(error_of([&] { generate_job(hosts, o); }),
            "hosts.txt:1: host a: runs 2 nodes on 1 NIC(s): a PCI device or an interface serves "
            "one node (give each node its own: a port, a virtual function, an interface)");
  o.nics = {"memif"};
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a,b"), o); }),
            "hosts.txt: memif joins the processes of one host: a job over memif lists one host");
  o.servers_per_host = 2;
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "hosts.txt: a job over memif has one server (a worker has one port, and a memif link "
            "reaches one peer)");
  o.servers_per_host = 1;
  o.nics = {"memif", "af_packet:eth0"};
  EXPECT_NE(
      error_of([&] { generate_job(parse_host_list("a"), o); }).find("memif is a host's only NIC"),
      std::string::npos);
  o.nics = {"eth0"};
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "hosts.txt: host a: NIC 'eth0': expected a PCI address (0000:03:00.0), "
            "af_packet:IFACE or memif");
  o.nics = {};
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "hosts.txt: host a: has no NIC (nic= in the host file, or --nic)");
  o.nics = {"memif"};
  o.cpus = 0;
  EXPECT_NE(error_of([&] { generate_job(parse_host_list("a"), o); }).find("has no CPU count"),
            std::string::npos);
  o.cpus = 2;
  o.workers_per_host = 0;
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "hosts.txt: the hosts run 1 servers and 0 workers; a job needs at least one of each");
  o.workers_per_host = 8;
  o.subnet = "10.0.0.0/29";
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "--subnet: 10.0.0.0/29 holds 6 addresses, and the job has 9 nodes");
  o.subnet = "10.0.0.0";
  EXPECT_EQ(error_of([&] { generate_job(parse_host_list("a"), o); }),
            "--subnet: '10.0.0.0' is not an IPv4 subnet (e.g. 10.0.0.0/24)");
  o.subnet = "10.0.0.0/24";
  o.name = "Bad Name";
  EXPECT_NE(error_of([&] { generate_job(parse_host_list("a"), o); }).find("job.name"),
            std::string::npos);
  // The template's faults are the loader's, naming its file and line.
  o.name = "x";
  o.template_text = "training: {optimizer: sgd, momentum: 0.5}\n";
  o.template_source = "tmpl.yaml";
  EXPECT_NE(error_of([&] {
              generate_job(parse_host_list("a"), o);
            }).find("tmpl.yaml:1: training.momentum"),
            std::string::npos);
}

}  // namespace
}  // namespace mercury::config
