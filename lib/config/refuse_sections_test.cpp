// Refusals per section other than nodes: job, network (the partition
// scheduler's keys and credit), mempool, eal, link and training, each with
// its file, line and key.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/load_test_util.h"

namespace mercury::config {
namespace {

using test::doc;
using test::kNodes;
using test::refused;

// ------------------------------------------------ network.auth_key_file

// A key file in a fresh directory, with `mode`; removed with the directory.
struct KeyDir {
  std::string dir;
  KeyDir() {
    char t[] = "/tmp/mercury-key-XXXXXX";
    dir = ::mkdtemp(t);
  }
  ~KeyDir() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text, mode_t mode = 0600) const {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
};

const std::string kKeyHex = "00112233445566778899aabbccddeeff0123456789abcdefFEDCBA9876543210";

TEST(ConfigAuthKey, ReadsTheKeyAndShrinksThePayload) {
  KeyDir d;
  const std::string path = d.write("job.key", kKeyHex + "\n");
  const JobConfig plain = load_string(doc(""), "t.yaml");
  EXPECT_EQ(plain.network.auth_key, nullptr);
  EXPECT_EQ(plain.payload_bytes_per_packet(), 1408u);
  const JobConfig job = load_string(doc("network:\n  auth_key_file: " + path + "\n"), "t.yaml");
  ASSERT_NE(job.network.auth_key, nullptr);
  EXPECT_EQ(job.network.auth_key_file, path);
  EXPECT_EQ((*job.network.auth_key)[0], 0x00);
  EXPECT_EQ((*job.network.auth_key)[1], 0x11);
  EXPECT_EQ((*job.network.auth_key)[16], 0x01);
  EXPECT_EQ((*job.network.auth_key)[31], 0x10);
  // The block after the header costs 24 bytes, rounded to whole lines.
  EXPECT_EQ(job.payload_bytes_per_packet(), 1344u);
}

TEST(ConfigAuthKey, ARelativePathIsTheJobFilesNeighbour) {
  KeyDir d;
  d.write("job.key", kKeyHex);
  const std::string job_path = d.write("job.yaml", doc("network:\n  auth_key_file: job.key\n"));
  const JobConfig job = load_file(job_path);
  ASSERT_NE(job.network.auth_key, nullptr);
  EXPECT_EQ((*job.network.auth_key)[2], 0x22);
}

TEST(ConfigAuthKey, BadKeyFilesAreRefusedWithFileLineAndKey) {
  KeyDir d;
  const auto refused_key = [&](const std::string& path, std::string_view fragment) {
    return refused(doc("network:\n  auth_key_file: " + path + "\n"), 5, "network.auth_key_file",
                   fragment);
  };
  EXPECT_TRUE(refused_key(d.dir + "/missing.key",
                          "cannot open " + d.dir + "/missing.key: No such file or directory"));
  EXPECT_TRUE(
      refused_key(d.write("open.key", kKeyHex, 0644), "is open to group or others (mode 644)"));
  EXPECT_TRUE(
      refused_key(d.write("short.key", kKeyHex.substr(2)),
                  "must hold the key as 64 hex digits (openssl rand -hex 32); it holds 62"));
  std::string bad = kKeyHex;
  bad[10] = 'g';
  EXPECT_TRUE(refused_key(d.write("bad.key", bad), "character 11 is not one"));
  EXPECT_TRUE(refused_key(d.write("long.key", kKeyHex + kKeyHex + kKeyHex), "and is longer"));
  EXPECT_TRUE(refused_key(d.dir, "is not a regular file"));
  EXPECT_TRUE(refused(doc("network:\n  auth_key_file: \"\"\n"), 5, "network.auth_key_file",
                      "names no file"));
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

TEST(ConfigRefuse, RateStepsOutOfOrderOrRange) {
  EXPECT_TRUE(refused(doc("link:\n  rate_steps:\n    - {at_s: 2, rate_gbps: 1}\n"
                          "    - {at_s: 2, rate_gbps: 3}\n"),
                      7, "link.rate_steps[1].at_s",
                      "2 is not after the previous step's at_s (2): steps go in time order"));
  EXPECT_TRUE(refused(doc("link:\n  rate_steps: [{at_s: 0, rate_gbps: 1}]\n"), 5,
                      "link.rate_steps[0].at_s", ""));
  EXPECT_TRUE(refused(doc("link:\n  rate_steps: [{at_s: 1, rate_gbps: 500}]\n"), 5,
                      "link.rate_steps[0].rate_gbps", "out of range"));
  EXPECT_TRUE(refused(doc("link:\n  rate_steps: [{at_s: 1}]\n"), 5, "link.rate_steps[0].rate_gbps",
                      "required key is missing"));
  EXPECT_TRUE(refused(doc("link:\n  rate_steps: [{at_s: 1, rate: 2}]\n"), 5,
                      "link.rate_steps[0].rate", "unknown key (valid keys here: at_s, rate_gbps)"));
  EXPECT_TRUE(refused(doc("link:\n  rate_steps: 3\n"), 5, "link.rate_steps", "expected a list"));
}

TEST(ConfigRefuse, SharedWireNeedsOneFixedRateAndAName) {
  EXPECT_EQ(load_string(doc("link:\n  rate_gbps: 2\n  shared_wire: rack-1\n")).link.shared_wire,
            "rack-1");
  EXPECT_TRUE(load_string(doc("")).link.shared_wire.empty());
  EXPECT_TRUE(refused(doc("link:\n  shared_wire: rack-1\n"), 5, "link.shared_wire",
                      "needs link.rate_gbps"));
  EXPECT_TRUE(refused(doc("link:\n  rate_gbps: 2\n  rate_steps: [{at_s: 1, rate_gbps: 1}]\n"
                          "  shared_wire: rack-1\n"),
                      7, "link.shared_wire", "cannot be combined with link.rate_steps"));
  EXPECT_TRUE(refused(doc("link:\n  rate_gbps: 2\n  shared_wire: Rack/1\n"), 6, "link.shared_wire",
                      "must match [a-z0-9_-]+"));
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

TEST(ConfigRefuse, SyncModesAndTheirKeys) {
  JobConfig job = load_string(doc("training:\n  sync: ssp\n  staleness_bound: 2\n"));
  EXPECT_EQ(job.training.sync, Sync::kSsp);
  EXPECT_EQ(job.training.staleness_bound, 2u);
  job = load_string(doc("training:\n  sync: psplus\n  staleness_lr: inverse_sqrt\n"));
  EXPECT_EQ(job.training.staleness_lr, StalenessLr::kInverseSqrt);
  EXPECT_EQ(load_string(doc("training:\n  sync: psplus\n")).training.staleness_lr,
            StalenessLr::kInverse);
  EXPECT_EQ(load_string(doc("training:\n  sync: asp\n")).training.sync, Sync::kAsp);
  // SSP without its bound is refused on the section's line.
  EXPECT_TRUE(refused(doc("training:\n  sync: ssp\n"), 5, "training.sync",
                      "ssp needs training.staleness_bound"));
  EXPECT_TRUE(refused(doc("training:\n  sync: bsp\n  staleness_bound: 2\n"), 6,
                      "training.staleness_bound",
                      "only used by training.sync ssp (training.sync is bsp)"));
  EXPECT_TRUE(refused(doc("training:\n  sync: psplus\n  staleness_bound: 2\n"), 6,
                      "training.staleness_bound", "training.sync is psplus"));
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n  staleness_lr: none\n"), 6,
                      "training.staleness_lr",
                      "only used by training.sync psplus (training.sync is asp)"));
  EXPECT_TRUE(refused(doc("training:\n  sync: psplus\n  staleness_lr: linear\n"), 6,
                      "training.staleness_lr", "is not one of"));
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n  optimizer: sum\n"), 6, "training.optimizer",
                      "sum needs training.sync bsp"));
  // The old spelling is an unknown key.
  EXPECT_TRUE(refused(doc("training:\n  staleness: 0\n"), 5, "training.staleness", ""));
}

TEST(ConfigRefuse, OnWorkerLoss) {
  EXPECT_EQ(load_string(doc("training:\n  sync: bsp\n")).training.on_worker_loss,
            OnWorkerLoss::kFail);
  EXPECT_EQ(load_string(doc("training:\n  on_worker_loss: fail\n")).training.on_worker_loss,
            OnWorkerLoss::kFail);
  EXPECT_EQ(load_string(doc("training:\n  on_worker_loss: shrink\n")).training.on_worker_loss,
            OnWorkerLoss::kShrink);
  // Where shrink is not honoured (wait: OnWorkerLossWait).
  EXPECT_TRUE(refused(doc("training:\n  aggregation: tensor\n  on_worker_loss: shrink\n"), 6,
                      "training.on_worker_loss", "shrink needs training.aggregation chunk"));
  EXPECT_TRUE(refused(doc("training:\n  on_worker_loss: shrink\nnetwork:\n  on_server_loss: "
                          "wait\ncheckpoint: {dir: c, every_versions: 10}\n"),
                      7, "network.on_server_loss",
                      "wait with training.on_worker_loss shrink is not built"));
  EXPECT_TRUE(refused(doc("training:\n  on_worker_loss: linger\n"), 5, "training.on_worker_loss",
                      "is not one of"));
  EXPECT_TRUE(refused(doc("training:\n  sync: asp\n  on_worker_loss: fail\n"), 6,
                      "training.on_worker_loss",
                      "only used by training.sync bsp (training.sync is asp)"));
}

// One refusal: the sections (doc()), the nodes, where and why.
struct Refusal {
  std::string sections;
  int line;
  std::string key;
  std::string fragment;
  std::string nodes = std::string(kNodes);
};

// kNodes and a second server with a worker of its own.
const std::string kTwoServers = std::string(kNodes) +
                                "  - name: s1\n    role: server\n    ipv4: 10.0.0.3\n"
                                "    ports: [ring:b]\n    lcores: [3, 5]\n    shards: 1\n" +
                                test::worker("w1", "10.0.0.4", "ring:b", "[4]");

void expect_refused(const std::vector<Refusal>& cases) {
  for (const Refusal& r : cases) {
    EXPECT_TRUE(refused(doc(r.sections, r.nodes), r.line, r.key, r.fragment)) << r.sections;
  }
}

TEST(ConfigRefuse, Checkpoint) {
  const JobConfig off = load_string(doc(""), "t.yaml");
  EXPECT_FALSE(off.checkpoint.enabled());
  const JobConfig on =
      load_string(doc("checkpoint:\n  dir: ckpt\n  every_versions: 50\n"), "/jobs/t.yaml");
  EXPECT_TRUE(on.checkpoint.enabled());
  EXPECT_EQ(on.checkpoint.dir, "ckpt");
  EXPECT_EQ(on.checkpoint.path, "/jobs/ckpt") << "the job file's neighbour";
  EXPECT_EQ(on.checkpoint.every_versions, 50u);
  EXPECT_EQ(on.checkpoint.keep, 2u);
  const JobConfig timed =
      load_string(doc("checkpoint: {dir: /var/ckpt, every_s: 60, keep: 3}\n"), "t.yaml");
  EXPECT_EQ(timed.checkpoint.path, "/var/ckpt");
  EXPECT_EQ(timed.checkpoint.every_s, 60.0);
  EXPECT_EQ(timed.checkpoint.keep, 3u);
  EXPECT_EQ(load_string(doc("checkpoint:\n  dir: c\n  every_versions: 30\n", kTwoServers))
                .checkpoint.every_versions,
            30u);
  expect_refused({
      {"checkpoint:\n  every_versions: 5\n", 5, "checkpoint.every_versions",
       "needs checkpoint.dir"},
      {"checkpoint:\n  dir: ckpt\n", 5, "checkpoint.dir",
       "checkpoint needs every_versions or every_s"},
      {"checkpoint:\n  dir: \"\"\n  every_versions: 5\n", 5, "checkpoint.dir",
       "names no directory"},
      {"checkpoint:\n  dir: c\n  every_versions: 0\n", 6, "checkpoint.every_versions",
       "out of range"},
      {"checkpoint:\n  dir: c\n  every_s: -1\n", 6, "checkpoint.every_s", "must be > 0"},
      {"checkpoint:\n  dir: c\n  every_versions: 5\n  keep: 0\n", 7, "checkpoint.keep",
       "out of range"},
      {"checkpoint:\n  dir: c\n  every_versions: 5\n  often: 1\n", 7, "checkpoint.often", ""},
      {"training:\n  sync: asp\ncheckpoint:\n  dir: c\n  every_versions: 5\n", 7, "checkpoint.dir",
       "checkpoints need training.sync bsp (training.sync is asp)"},
      // Two servers cannot agree on a time.
      {"checkpoint:\n  dir: c\n  every_s: 30\n", 6, "checkpoint.every_s",
       "use checkpoint.every_versions", kTwoServers},
  });
}

TEST(ConfigRefuse, OnServerLoss) {
  EXPECT_EQ(load_string(doc("")).network.on_server_loss, OnServerLoss::kFail);
  const std::string ckpt = "checkpoint: {dir: c, every_versions: 10}\n";
  const JobConfig wait =
      load_string(doc("network:\n  on_server_loss: wait\n  server_wait_s: 30\n" + ckpt));
  EXPECT_EQ(wait.network.on_server_loss, OnServerLoss::kWait);
  EXPECT_EQ(wait.network.server_wait_s, 30.0);
  EXPECT_EQ(load_string(doc("network:\n  on_server_loss: wait\n" + ckpt)).network.server_wait_s,
            60.0);
  expect_refused({
      {"network:\n  on_server_loss: linger\n", 5, "network.on_server_loss", "is not one of"},
      {"network:\n  server_wait_s: 5\n", 5, "network.server_wait_s",
       "only used with network.on_server_loss wait"},
      {"network:\n  on_server_loss: wait\n  server_wait_s: 0\n" + ckpt, 6, "network.server_wait_s",
       "must be > 0"},
      {"network:\n  on_server_loss: wait\n", 5, "network.on_server_loss",
       "wait needs checkpoint.dir"},
      {"network:\n  on_server_loss: wait\ntraining:\n  sync: asp\n", 5, "network.on_server_loss",
       "wait needs training.sync bsp"},
      {"network:\n  on_server_loss: wait\ntraining:\n  aggregation: tensor\n" + ckpt, 5,
       "network.on_server_loss",
       "wait with 2 server nodes and training.aggregation tensor is not built", kTwoServers},
  });
  // Several servers: the running ones roll back too (docs/durability.md).
  EXPECT_EQ(load_string(doc("network:\n  on_server_loss: wait\n" + ckpt, kTwoServers))
                .network.on_server_loss,
            OnServerLoss::kWait);
}

TEST(ConfigRefuse, OnWorkerLossWait) {
  const JobConfig wait = load_string(doc("training:\n  on_worker_loss: wait\n"));
  EXPECT_EQ(wait.training.on_worker_loss, OnWorkerLoss::kWait);
  EXPECT_EQ(wait.training.worker_wait_s, 60.0);
  EXPECT_EQ(load_string(doc("training:\n  on_worker_loss: wait\n  worker_wait_s: 12.5\n"))
                .training.worker_wait_s,
            12.5);
  expect_refused({
      {"training:\n  worker_wait_s: 5\n", 5, "training.worker_wait_s",
       "only used with training.on_worker_loss wait"},
      {"training:\n  on_worker_loss: shrink\n  worker_wait_s: 5\n", 6, "training.worker_wait_s",
       "only used with training.on_worker_loss wait"},
      {"training:\n  on_worker_loss: wait\n  worker_wait_s: -1\n", 6, "training.worker_wait_s",
       "must be > 0"},
      {"training:\n  on_worker_loss: wait\n  worker_wait_s: 0\n", 6, "training.worker_wait_s",
       "must be > 0"},
      {"training:\n  aggregation: tensor\n  on_worker_loss: wait\n", 6, "training.on_worker_loss",
       "wait needs training.aggregation chunk"},
      {"training:\n  on_worker_loss: wait\n", 5, "training.on_worker_loss",
       "wait with 2 server nodes is not built: one server node only", kTwoServers},
      {"training:\n  on_worker_loss: wait\nnetwork:\n  on_server_loss: wait\n"
       "checkpoint: {dir: c, every_versions: 10}\n",
       7, "network.on_server_loss", "wait with training.on_worker_loss wait is not built"},
  });
}

TEST(ConfigRefuse, Aggregation) {
  EXPECT_EQ(load_string(doc("training:\n  sync: bsp\n")).training.aggregation, Aggregation::kChunk);
  EXPECT_EQ(load_string(doc("training:\n  aggregation: tensor\n")).training.aggregation,
            Aggregation::kTensor);
  EXPECT_EQ(load_string(doc("training:\n  sync: asp\n  aggregation: chunk\n")).training.aggregation,
            Aggregation::kChunk);
  EXPECT_TRUE(refused(doc("training:\n  sync: ssp\n  staleness_bound: 1\n  aggregation: tensor\n"),
                      7, "training.aggregation",
                      "tensor needs training.sync bsp (training.sync is ssp)"));
  EXPECT_TRUE(refused(doc("training:\n  aggregation: layer\n"), 5, "training.aggregation",
                      "is not one of"));
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
                      "only used by optimizer adam and adamw (training.optimizer is momentum)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: sum\n  weight_decay: 0.1\n"), 6,
                      "training.weight_decay",
                      "only used by optimizer sgd, momentum, adam and adamw (training.optimizer is "
                      "sum)"));
  EXPECT_TRUE(refused(doc("training:\n  beta2: 0.5\n"), 5, "training.beta2", "only used by"));
  EXPECT_TRUE(refused(doc("training:\n  epsilon: 0.5\n"), 5, "training.epsilon", "only used by"));
}

TEST(ConfigRefuse, OptimizerParameterOutOfRange) {
  EXPECT_TRUE(refused(doc("training:\n  optimizer: momentum\n  momentum: 1\n"), 6,
                      "training.momentum", "1 is out of range [0, 1)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: adam\n  beta2: 1.5\n"), 6, "training.beta2",
                      "out of range [0, 1)"));
  EXPECT_TRUE(refused(doc("training:\n  optimizer: adamw\n  weight_decay: -0.1\n"), 6,
                      "training.weight_decay", "out of range [0, 1)"));
}

}  // namespace
}  // namespace mercury::config
