// EAL argument generation and the hugepage probe.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"

namespace mercury::config {
namespace {

using Argv = std::vector<std::string>;

// A server with a ring link, a vdev and a PCI NIC; two workers, one on the
// ring link and one on memif; a third worker on its own PCI NIC.
constexpr std::string_view kMixed = R"(job: {id: 9, name: mix}
eal:
  memory_mb: 256
  extra: [--log-level=7]
nodes:
  - name: ps
    role: server
    ipv4: 10.0.0.1
    ports: [ring:a, "net_memif0,role=server,socket=/tmp/mercury/w1.sock", 0000:03:00.0]
    lcores: [0, 1, 2]
    shards: 2
  - name: w0
    role: worker
    ipv4: 10.0.0.2
    ports: [ring:a]
    lcores: [4]
  - name: w1
    role: worker
    ipv4: 10.0.0.3
    ports: ["net_memif1,role=client,socket=/tmp/mercury/w1.sock"]
    lcores: [3]
  - name: w2
    role: worker
    ipv4: 10.0.0.4
    ports: [82:00.1]
    lcores: [2]
)";

Argv args(const JobConfig& job, std::vector<std::string> names, EalRunOptions options) {
  return eal_args(job, names, options);
}

EalRunOptions on_cpus(std::vector<uint32_t> cpus, bool hugepages = false) {
  EalRunOptions o;
  o.hugepages = hugepages;
  o.cpus = std::move(cpus);
  return o;
}

TEST(EalArgs, RingOnlyWorkerWithoutHugepages) {
  JobConfig job = load_string(kMixed);
  EXPECT_EQ(args(job, {"w0"}, on_cpus({0, 1})),
            (Argv{"mercury", "--file-prefix=mix-w0", "--lcores=4@0", "--no-huge", "-m", "256",
                  "--no-pci", "--no-shconf", "--log-level=7"}));
}

TEST(EalArgs, ServerMixesVdevAndPciWithHugepages) {
  JobConfig job = load_string(kMixed);
  EXPECT_EQ(args(job, {"ps"}, on_cpus({0, 1}, true)),
            (Argv{"mercury", "--file-prefix=mix-ps", "--lcores=0@0,1@1,2@0", "--huge-unlink", "-a",
                  "0000:03:00.0", "--vdev=net_memif0,role=server,socket=/tmp/mercury/w1.sock",
                  "--log-level=7"}));
}

TEST(EalArgs, ZeroCopyMemifKeepsEachMemsegListInOneFile) {
  std::string yaml(kMixed);
  yaml.replace(yaml.find("net_memif1,role=client,"), 23, "net_memif1,role=client,zero-copy=yes,");
  JobConfig job = load_string(yaml);
  const Argv a = args(job, {"w1"}, on_cpus({0, 1}));
  EXPECT_EQ(std::count(a.begin(), a.end(), "--single-file-segments"), 1) << a.back();
  const Argv server = args(job, {"ps"}, on_cpus({0, 1}));
  EXPECT_EQ(std::count(server.begin(), server.end(), "--single-file-segments"), 0);
}

TEST(EalArgs, SeveralNodesInOneProcessShareTheUnionOfLcoresAndAllDevices) {
  JobConfig job = load_string(kMixed);
  EalRunOptions o = on_cpus({0, 1});
  o.file_prefix_suffix = "-t42";
  o.extra = {"--", "x"};
  EXPECT_EQ(args(job, {"w1", "ps", "w0", "w2"}, o),
            (Argv{"mercury", "--file-prefix=mix-w1-t42", "--lcores=0@0,1@1,2@0,3@1,4@0",
                  "--no-huge", "-m", "256", "-a", "0000:03:00.0", "-a", "0000:82:00.1",
                  "--vdev=net_memif1,role=client,socket=/tmp/mercury/w1.sock",
                  "--vdev=net_memif0,role=server,socket=/tmp/mercury/w1.sock", "--no-shconf",
                  "--log-level=7", "--", "x"}));
}

TEST(EalArgs, LcoresMapOntoTheAllowedCpusModuloTheirCount) {
  JobConfig job = load_string(kMixed);
  Argv a = args(job, {"ps"}, on_cpus({2, 5}));
  EXPECT_EQ(a[2], "--lcores=0@2,1@5,2@2");
  a = args(job, {"ps"}, on_cpus({7}));
  EXPECT_EQ(a[2], "--lcores=0@7,1@7,2@7");
}

TEST(EalArgs, TheFirstLcoreOfTheFirstNodeIsDpdksMainLcore) {
  // A server whose net core is not its lowest lcore: DPDK would make lcore 0
  // main, and the shard core given lcore 0 would find it taken.
  std::string yaml(kMixed);
  yaml.replace(yaml.find("lcores: [0, 1, 2]"), 17, "lcores: [2, 0, 1]");
  JobConfig job = load_string(yaml);
  Argv a = args(job, {"ps"}, on_cpus({0, 1}));
  EXPECT_EQ(a[2], "--lcores=0@0,1@1,2@0");
  EXPECT_EQ(a[3], "--main-lcore=2");
  // The lowest first: nothing to say.
  a = args(load_string(kMixed), {"ps"}, on_cpus({0, 1}));
  EXPECT_EQ(std::count(a.begin(), a.end(), "--main-lcore=0"), 0);
  EXPECT_EQ(a[3], "--no-huge");
}

TEST(EalArgs, DefaultCpusAreThisProcessAffinity) {
  JobConfig job = load_string(kMixed);
  std::vector<uint32_t> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  Argv a = args(job, {"w0"}, EalRunOptions{});
  EXPECT_EQ(a[2], "--lcores=4@" + std::to_string(cpus[4 % cpus.size()]));
}

TEST(EalArgs, RefusesBadNodeLists) {
  JobConfig job = load_string(kMixed, "mix.yaml");
  try {
    args(job, {"w9"}, on_cpus({0}));
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "mix.yaml: no node named \"w9\" (nodes are: ps, w0, w1, w2)");
  }
  try {
    args(job, {}, on_cpus({0}));
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "mix.yaml: eal_args: no node names given");
  }
  try {
    args(job, {"w0", "w0"}, on_cpus({0}));
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "mix.yaml: eal_args: node \"w0\" is named twice");
  }
}

TEST(EalArgs, RefusesOnePciDeviceForTwoNodesOfOneProcess) {
  // Legal in the file (two hosts with the same slot), not in one process.
  JobConfig job = load_file(std::string(MERCURY_CONFIG_DIR) + "/cluster-pci.yaml");
  EXPECT_NO_THROW(args(job, {"w0"}, on_cpus({0})));
  try {
    args(job, {"w0", "w1"}, on_cpus({0}));
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("PCI device 0000:03:00.0 belongs to both w0 and w1"),
              std::string::npos)
        << e.what();
  }
}

TEST(EalArgs, ExampleRingDemoRunsInOneProcess) {
  JobConfig job = load_file(std::string(MERCURY_CONFIG_DIR) + "/ring-demo.yaml");
  std::vector<std::string> names;
  for (const NodeConfig& n : job.nodes) names.push_back(n.name);
  EXPECT_EQ(
      eal_args(job, names, on_cpus({0, 1})),
      (Argv{"mercury", "--file-prefix=ring-demo-server0", "--lcores=0@0,1@1,2@0,3@1,4@0,5@1,6@0",
            "--no-huge", "-m", "512", "--no-pci", "--no-shconf"}));
}

// A fake /sys/kernel/mm/hugepages and /proc/mounts.
class HugepageProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mercury_hugepages_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "sys");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void pages(const std::string& size, int free) {
    std::filesystem::create_directories(dir_ / "sys" / ("hugepages-" + size));
    std::ofstream(dir_ / "sys" / ("hugepages-" + size) / "free_hugepages") << free << "\n";
  }
  void mounts(const std::string& text) { std::ofstream(dir_ / "mounts") << text; }
  bool available() {
    return hugepages_available((dir_ / "sys").string(), (dir_ / "mounts").string());
  }

  std::filesystem::path dir_;
};

constexpr const char* kHugetlbfsMounted =
    "proc /proc proc rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n";

TEST_F(HugepageProbe, EnoughFreePagesAndAMountMeanAvailable) {
  pages("2048kB", 128);  // exactly 256 MB
  pages("1048576kB", 0);
  mounts(kHugetlbfsMounted);
  EXPECT_TRUE(available());
}

TEST_F(HugepageProbe, FreePagesOfAllSizesAddUp) {
  pages("2048kB", 64);  // 128 MB
  mounts(kHugetlbfsMounted);
  EXPECT_FALSE(available());
  pages("1048576kB", 1);  // + 1 GB
  EXPECT_TRUE(available());
}

TEST_F(HugepageProbe, TooFewFreePagesMeanUnavailable) {
  pages("2048kB", 127);
  mounts(kHugetlbfsMounted);
  EXPECT_FALSE(available());
}

TEST_F(HugepageProbe, NoHugetlbfsMountMeansUnavailable) {
  pages("2048kB", 1024);
  mounts("proc /proc proc rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n");
  EXPECT_FALSE(available());
}

TEST_F(HugepageProbe, MissingFilesMeanUnavailable) {
  EXPECT_FALSE(hugepages_available((dir_ / "nothing").string(), (dir_ / "none").string()));
}

TEST(ResolveHugepages, OnAndOffAreObeyed) {
  std::string notice = "stale";
  EalConfig eal;
  eal.hugepages = Hugepages::kOn;
  EXPECT_TRUE(resolve_hugepages(eal, 0, &notice));
  EXPECT_EQ(notice, "");
  eal.hugepages = Hugepages::kOff;
  EXPECT_FALSE(resolve_hugepages(eal, 0, &notice));
  EXPECT_EQ(notice, "");
}

TEST(ResolveHugepages, AutoFollowsTheProbeAndExplainsAFallback) {
  EalConfig eal;
  eal.memory_mb = 768;
  std::string notice;
  bool decision = resolve_hugepages(eal, 0, &notice);
  // Other processes' pending decisions (the ledger) can only make the answer
  // no where the probe alone says yes, never the other way round; the test
  // suite runs such processes beside this one.
  if (decision) {
    EXPECT_TRUE(hugepages_available());
    EXPECT_EQ(notice, "");
  } else {
    EXPECT_NE(notice.find("eal.hugepages is auto"), std::string::npos) << notice;
    EXPECT_NE(notice.find("--no-huge -m 768"), std::string::npos) << notice;
    EXPECT_EQ(notice.find('\n'), std::string::npos);
  }
  hugepages_settled();  // nothing will be allocated: let other processes decide
}

// This process's entry in the ledger, in bytes (0: none).
uint64_t ledger_entry() {
  std::ifstream in(kHugepageLedger);
  long long pid = 0;
  unsigned long long bytes = 0;
  while (in >> pid >> bytes) {
    if (pid == ::getpid()) return bytes;
  }
  return 0;
}

TEST(ResolveHugepages, AutoCountsWhatOtherProcessesAreTaking) {
  if (!hugepages_available()) GTEST_SKIP() << "no free hugepages here";
  EalConfig eal;  // auto
  hugepages_settled();
  EXPECT_EQ(ledger_entry(), 0u);
  ASSERT_TRUE(resolve_hugepages(eal, 100 << 20, nullptr));
  EXPECT_EQ(ledger_entry(), uint64_t{100} << 20) << "a chosen auto decision is in the ledger";
  hugepages_settled();
  EXPECT_EQ(ledger_entry(), 0u);
  hugepages_settled();  // idempotent
  struct stat st {};
  ASSERT_EQ(::stat(kHugepageLedger, &st), 0);
  if (st.st_uid == ::geteuid()) {
    EXPECT_EQ(st.st_mode & 0777, 0666u) << "every user's processes must be able to write it";
  }

  // Another live process (a child that waits) has decided on all but 100 MB
  // of what is free: a need of 256 MB no longer fits beside it.
  const int free_mb = [] {
    std::ifstream in("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    int pages = 0;
    in >> pages;
    return pages * 2;
  }();
  if (free_mb < 512) GTEST_SKIP() << "fewer than 512 MB of 2 MB hugepages free";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    const bool took = resolve_hugepages(eal, uint64_t(free_mb - 100) << 20, nullptr);
    const char c = took ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::pause();  // holds its entry until killed
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_EQ(c, 'y');
  std::string notice;
  EXPECT_FALSE(resolve_hugepages(eal, 256 << 20, &notice));
  EXPECT_NE(notice.find("beside the " + std::to_string(free_mb - 100) + " MB other processes"),
            std::string::npos)
      << notice;
  EXPECT_EQ(ledger_entry(), 0u);
  // Once it is gone, its entry counts no more.
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(resolve_hugepages(eal, 256 << 20, &notice)) << notice;
  hugepages_settled();
}

TEST_F(HugepageProbe, WhatTheProcessNeedsReplaces256MB) {
  pages("2048kB", 64);  // 128 MB
  mounts(kHugetlbfsMounted);
  EXPECT_FALSE(available());  // 256 MB when the need is not known
  EXPECT_TRUE(hugepages_available((dir_ / "sys").string(), (dir_ / "mounts").string(),
                                  uint64_t{100} << 20));
  pages("2048kB", 256);  // 512 MB
  EXPECT_TRUE(hugepages_available((dir_ / "sys").string(), (dir_ / "mounts").string(),
                                  uint64_t{512} << 20));
  EXPECT_FALSE(hugepages_available((dir_ / "sys").string(), (dir_ / "mounts").string(),
                                   (uint64_t{512} << 20) + 1));
}

}  // namespace
}  // namespace mercury::config
