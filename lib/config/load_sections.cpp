// The parsers of the job file's sections other than nodes (load_sections.h):
// job, network (with the partition scheduler's keys and their credit rule),
// mempool, eal (refusing options the generator writes), link and training
// (with the keys each optimizer owns).
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "config/load_sections.h"

namespace mercury::config::detail {

namespace {

constexpr uint64_t kMinMbufs = 1023;
constexpr uint64_t kMaxCache = 512;  // RTE_MEMPOOL_CACHE_MAX_SIZE

// EAL options the generator writes itself; a second copy in eal.extra would
// contradict the file (and EAL takes the last one silently).
const char* generated_option_source(std::string_view arg) {
  if (arg.starts_with("--file-prefix")) return "job.name";
  if (arg.starts_with("--lcores") || arg.starts_with("-l") || arg.starts_with("-c")) {
    return "nodes[].lcores";
  }
  if (arg == "--no-huge") return "eal.hugepages";
  if (arg.starts_with("-m")) return "eal.memory_mb";
  return nullptr;
}

}  // namespace

void parse_job(const Section& root, JobConfig& job) {
  Section s(root.require("job"), {"id", "name"});
  job.id = static_cast<uint32_t>(s.require("id").integer(0, kU32Max));
  Value name = s.require("name");
  job.name = name.string();
  if (!is_name(job.name)) name.fail(quoted(job.name) + " " + name_rule());
}

Poll parse_poll(const Value& v) {
  return v.choice<Poll>({{"adaptive", Poll::kAdaptive}, {"busy", Poll::kBusy}});
}

// The network section's keys (on_server_loss and server_wait_s are read by
// parse_server_loss, once the nodes and checkpoints are known).
#define MERCURY_NETWORK_KEYS                                                                  \
  {                                                                                           \
    "mtu", "udp_port", "udp_checksum", "poll", "window", "peer_timeout_ms", "scheduler",      \
        "partition_bytes", "credit_bytes", "auth_key_file", "on_server_loss", "server_wait_s" \
  }

void parse_network(const Section& root, NetworkConfig& net) {
  Section s = optional_section(root, "network", MERCURY_NETWORK_KEYS);
  if (auto v = s.get("mtu")) net.mtu = static_cast<uint32_t>(v->integer(576, 9000));
  if (auto v = s.get("udp_port")) net.udp_port = static_cast<uint16_t>(v->integer(1, 65535));
  if (auto v = s.get("udp_checksum")) {
    const std::optional<bool> on = v->boolean_or_auto();
    net.udp_checksum = !on ? Checksum::kAuto : *on ? Checksum::kOn : Checksum::kOff;
  }
  if (auto v = s.get("poll")) net.poll = parse_poll(*v);
  if (auto v = s.get("window")) net.window = static_cast<uint32_t>(v->integer(0, kU32Max));
  if (auto v = s.get("peer_timeout_ms")) {
    net.peer_timeout_ms = static_cast<uint32_t>(v->integer(100, 600000));
  }
  if (auto v = s.get("scheduler")) {
    net.scheduler = v->choice<Scheduler>({{"strict", Scheduler::kStrict},
                                          {"fifo", Scheduler::kFifo},
                                          {"partition", Scheduler::kPartition}});
  }
  for (const char* key : {"partition_bytes", "credit_bytes"}) {
    auto v = s.get(key);
    if (v && net.scheduler != Scheduler::kPartition) {
      v->fail("only used by scheduler partition (network.scheduler is " +
              std::string(to_string(net.scheduler)) + ")");
    }
  }
  if (auto v = s.get("partition_bytes")) {
    net.partition_bytes = static_cast<uint32_t>(v->integer(4096, kU32Max));
  }
  if (auto v = s.get("credit_bytes")) {
    net.credit_bytes = static_cast<uint32_t>(v->integer(4096, kU32Max));
  }
  if (auto v = s.get("auth_key_file")) {
    net.auth_key_file = v->string();
    if (net.auth_key_file.empty()) v->fail("names no file");
    // A relative path is the job file's neighbour, wherever the job is run from.
    std::string path = net.auth_key_file;
    const std::string& source = v->source();
    if (path.front() != '/' && source.find('/') != std::string::npos) {
      path = source.substr(0, source.rfind('/') + 1) + path;
    }
    try {
      net.auth_key = read_auth_key(path);
    } catch (const std::runtime_error& e) {
      v->fail(e.what());
    }
  }
  if (net.scheduler == Scheduler::kPartition && net.credit_bytes < net.partition_bytes) {
    // The credit must admit at least one whole partition, or nothing is ever sent.
    Value at = s.get("credit_bytes") ? *s.get("credit_bytes") : *s.get("partition_bytes");
    at.fail(std::to_string(net.credit_bytes) + " credit bytes are fewer than " +
            "network.partition_bytes (" + std::to_string(net.partition_bytes) +
            "): the credit must hold at least one partition");
  }
}

void parse_mempool(const Section& root, MempoolConfig& pool) {
  Section s = optional_section(root, "mempool", {"mbufs", "cache"});
  if (auto v = s.get("mbufs")) pool.mbufs = static_cast<uint32_t>(v->integer(kMinMbufs, kU32Max));
  if (auto v = s.get("cache")) pool.cache = static_cast<uint32_t>(v->integer(0, kMaxCache));
  // rte_mempool_create() refuses a pool whose cache flush threshold (cache *
  // 1.5, truncated) exceeds the pool size. The two ranges already rule that
  // out; should either range change, this stops the build rather than
  // leaving a rule untested.
  static_assert(kMaxCache * 3 / 2 <= kMinMbufs, "add a cache <= mbufs / 1.5 check");
}

void parse_eal(const Section& root, EalConfig& eal) {
  Section s = optional_section(root, "eal", {"memory_mb", "hugepages", "extra"});
  if (auto v = s.get("memory_mb")) eal.memory_mb = static_cast<uint32_t>(v->integer(64, 65536));
  if (auto v = s.get("hugepages")) {
    eal.hugepages = v->choice<Hugepages>(
        {{"auto", Hugepages::kAuto}, {"on", Hugepages::kOn}, {"off", Hugepages::kOff}});
  }
  if (auto v = s.get("extra")) {
    for (const Value& item : v->sequence()) {
      std::string arg = item.string();
      if (const char* from = generated_option_source(arg)) {
        item.fail(quoted(arg) + " is generated from " + from + "; set it there, not in eal.extra");
      }
      eal.extra.push_back(std::move(arg));
    }
  }
}

namespace {

double link_rate(const Value& v) {
  const double gbps = v.number();
  if (gbps != 0 && !(gbps >= 0.001 && gbps <= 400)) {
    v.fail(v.text() + " is out of range (0 for unlimited, else 0.001..400)");
  }
  return gbps;
}

}  // namespace

void parse_link(const Section& root, LinkConfig& link) {
  Section s = optional_section(root, "link",
                               {"rate_gbps", "delay_us", "loss", "duplicate", "reorder", "corrupt",
                                "seed", "rate_steps", "shared_wire"});
  if (auto v = s.get("rate_gbps")) link.rate_gbps = link_rate(*v);
  if (auto v = s.get("rate_steps")) {
    std::string previous;  // the previous step's at_s as written
    for (const Value& item : v->sequence()) {
      Section step(item, {"at_s", "rate_gbps"});
      const Value at = step.require("at_s");
      RateStep r{.at_s = positive(at), .rate_gbps = link_rate(step.require("rate_gbps"))};
      if (r.at_s > 1e6) at.fail(at.text() + " is out of range (at most 1e6 seconds)");
      if (!link.rate_steps.empty() && r.at_s <= link.rate_steps.back().at_s) {
        at.fail(at.text() + " is not after the previous step's at_s (" + previous +
                "): steps go in time order");
      }
      previous = at.text();
      link.rate_steps.push_back(r);
    }
  }
  if (auto v = s.get("delay_us")) link.delay_us = static_cast<uint32_t>(v->integer(0, 1000000));
  if (auto v = s.get("loss")) link.loss = half_open(*v, 0, 1);
  if (auto v = s.get("duplicate")) link.duplicate = half_open(*v, 0, 1);
  if (auto v = s.get("reorder")) link.reorder = half_open(*v, 0, 1);
  if (auto v = s.get("corrupt")) link.corrupt = half_open(*v, 0, 1);
  if (auto v = s.get("seed")) link.seed = v->integer(0, kU64Max);
  if (auto v = s.get("shared_wire")) {
    link.shared_wire = v->string();
    if (!is_name(link.shared_wire)) v->fail(quoted(link.shared_wire) + " " + name_rule());
    // A shared wire is one serialiser for every job on it: each must pace it at one
    // fixed rate (docs/link-emulator.md, "Shared wires").
    if (link.rate_gbps == 0)
      v->fail("needs link.rate_gbps: the wire's rate, the same in every job on it");
    if (!link.rate_steps.empty()) {
      v->fail("cannot be combined with link.rate_steps: the jobs on a wire share its rate");
    }
  }
}

// The training section's keys (on_worker_loss and spare_grace_s are checked
// against the nodes by check_worker_loss, once they are known).
#define MERCURY_TRAINING_KEYS                                                                    \
  {                                                                                              \
    "sync", "staleness_bound", "staleness_lr", "aggregation", "on_worker_loss", "worker_wait_s", \
        "spare_grace_s", "optimizer", "learning_rate", "momentum", "beta1", "beta2", "epsilon",  \
        "weight_decay"                                                                           \
  }

namespace {

// training.on_worker_loss as the job file spells it.
const char* loss_name(OnWorkerLoss l) {
  return l == OnWorkerLoss::kWait ? "wait" : l == OnWorkerLoss::kShrink ? "shrink" : "fail";
}

}  // namespace

void parse_training(const Section& root, TrainingConfig& t) {
  Section s = optional_section(root, "training", MERCURY_TRAINING_KEYS);
  const std::optional<Value> sync = s.get("sync");
  if (sync) {
    t.sync = sync->choice<Sync>(
        {{"bsp", Sync::kBsp}, {"asp", Sync::kAsp}, {"ssp", Sync::kSsp}, {"psplus", Sync::kPsPlus}});
  }
  if (auto v = s.get("optimizer")) {
    t.optimizer = v->choice<Optimizer>({{"sgd", Optimizer::kSgd},
                                        {"momentum", Optimizer::kMomentum},
                                        {"adam", Optimizer::kAdam},
                                        {"adamw", Optimizer::kAdamW},
                                        {"sum", Optimizer::kSum}});
  }
  const std::string opt_name(to_string(t.optimizer));
  const std::string sync_name(to_string(t.sync));
  if (t.sync == Sync::kSsp) {
    // The bound is the point of SSP: no silent default.
    const std::optional<Value> v = s.get("staleness_bound");
    if (!v) {
      sync->fail(
          "ssp needs training.staleness_bound: how many iterations a worker may run "
          "ahead of the slowest");
    }
    t.staleness_bound = static_cast<uint32_t>(v->integer(0, 1u << 30));
  } else if (auto v = s.get("staleness_bound")) {
    v->fail("only used by training.sync ssp (training.sync is " + sync_name + ")");
  }
  // A key of one sync mode is refused under the others.
  auto only_with = [&](const char* key, Sync owner) -> std::optional<Value> {
    auto v = s.get(key);
    if (v && t.sync != owner) {
      v->fail("only used by training.sync " + std::string(to_string(owner)) +
              " (training.sync is " + sync_name + ")");
    }
    return v;
  };
  if (auto v = only_with("staleness_lr", Sync::kPsPlus)) {
    t.staleness_lr = v->choice<StalenessLr>({{"inverse", StalenessLr::kInverse},
                                             {"inverse_sqrt", StalenessLr::kInverseSqrt},
                                             {"none", StalenessLr::kNone}});
  }
  if (auto v = s.get("aggregation")) {
    t.aggregation =
        v->choice<Aggregation>({{"chunk", Aggregation::kChunk}, {"tensor", Aggregation::kTensor}});
    if (t.aggregation == Aggregation::kTensor && t.sync != Sync::kBsp) {
      // An asynchronous update is one worker's gradient applied on arrival:
      // there is no tensor-wide set to wait for.
      v->fail("tensor needs training.sync bsp (training.sync is " + sync_name + ")");
    }
  }
  if (auto v = only_with("on_worker_loss", Sync::kBsp)) {
    t.on_worker_loss = v->choice<OnWorkerLoss>({{"fail", OnWorkerLoss::kFail},
                                                {"wait", OnWorkerLoss::kWait},
                                                {"shrink", OnWorkerLoss::kShrink}});
    if (t.on_worker_loss != OnWorkerLoss::kFail && t.aggregation != Aggregation::kChunk) {
      v->fail(std::string(loss_name(t.on_worker_loss)) +
              " needs training.aggregation chunk (a store-and-forward unit is not built to go "
              "on without a rank)");
    }
  }
  if (auto v = s.get("worker_wait_s")) {
    if (t.on_worker_loss != OnWorkerLoss::kWait) {
      v->fail("only used with training.on_worker_loss wait");
    }
    t.worker_wait_s = positive(*v);
  }
  if (t.sync != Sync::kBsp && t.optimizer == Optimizer::kSum) {
    // Sum-only averages a BSP set for the trainer's own optimizer; an
    // asynchronous update is one worker's gradient, there is no set.
    s.require("optimizer")
        .fail(
            "sum needs training.sync bsp (the asynchronous modes apply each worker's gradient on "
            "its own, so there is no set to average)");
  }

  if (auto v = s.get("learning_rate")) {
    if (t.optimizer == Optimizer::kSum) {
      v->fail("not used by optimizer sum (it only adds the gradients); remove it");
    }
    t.learning_rate = positive(*v);
  }
  auto only_for = [&](const char* key, std::initializer_list<Optimizer> owners,
                      const char* names) -> std::optional<Value> {
    auto v = s.get(key);
    if (v && std::find(owners.begin(), owners.end(), t.optimizer) == owners.end()) {
      v->fail(std::string("only used by optimizer ") + names + " (training.optimizer is " +
              opt_name + ")");
    }
    return v;
  };
  const std::initializer_list<Optimizer> kAdams = {Optimizer::kAdam, Optimizer::kAdamW};
  if (auto v = only_for("momentum", {Optimizer::kMomentum}, "momentum")) {
    t.momentum = half_open(*v, 0, 1);
  }
  if (auto v = only_for("beta1", kAdams, "adam and adamw")) t.beta1 = half_open(*v, 0, 1);
  if (auto v = only_for("beta2", kAdams, "adam and adamw")) t.beta2 = half_open(*v, 0, 1);
  if (auto v = only_for("epsilon", kAdams, "adam and adamw")) t.epsilon = positive(*v);
  if (auto v =
          only_for("weight_decay",
                   {Optimizer::kSgd, Optimizer::kMomentum, Optimizer::kAdam, Optimizer::kAdamW},
                   "sgd, momentum, adam and adamw")) {
    t.weight_decay = half_open(*v, 0, 1);
  }
}

void parse_checkpoint(const Section& root, JobConfig& job) {
  Section s = optional_section(root, "checkpoint", {"dir", "every_versions", "every_s", "keep"});
  CheckpointConfig& c = job.checkpoint;
  const std::optional<Value> dir = s.get("dir");
  const std::optional<Value> versions = s.get("every_versions");
  const std::optional<Value> seconds = s.get("every_s");
  const std::optional<Value> keep = s.get("keep");
  if (!dir) {
    // Any other key without a directory would be a setting that does nothing.
    for (const auto& v : {versions, seconds, keep}) {
      if (v) v->fail("needs checkpoint.dir: where the servers write their checkpoints");
    }
    return;
  }
  c.dir = dir->string();
  if (c.dir.empty()) dir->fail("names no directory");
  // A relative path is the job file's neighbour, wherever the job is run from.
  c.path = c.dir;
  const std::string& source = dir->source();
  if (c.path.front() != '/' && source.find('/') != std::string::npos) {
    c.path = source.substr(0, source.rfind('/') + 1) + c.path;
  }
  if (job.training.sync != Sync::kBsp) {
    // A snapshot is every chunk at one version: only BSP has such a version.
    dir->fail("checkpoints need training.sync bsp (training.sync is " +
              std::string(to_string(job.training.sync)) +
              "): a checkpoint holds every chunk at one version");
  }
  if (versions) c.every_versions = static_cast<uint32_t>(versions->integer(1, 1u << 30));
  if (seconds) {
    c.every_s = positive(*seconds);
    const size_t servers = job.servers().size();
    if (servers > 1) {
      seconds->fail("with " + std::to_string(servers) +
                    " server nodes each would pick its checkpoint's version by its own clock; "
                    "use checkpoint.every_versions (every server snapshots the same versions "
                    "without talking)");
    }
  }
  if (!versions && !seconds) {
    dir->fail("checkpoint needs every_versions or every_s: when to write one");
  }
  if (keep) c.keep = static_cast<uint32_t>(keep->integer(1, 1000));
}

void check_worker_loss(const Section& root, JobConfig& job) {
  Section s = optional_section(root, "training", MERCURY_TRAINING_KEYS);
  if (auto v = s.get("spare_grace_s")) {
    // How long a removed rank's own new process has before a spare takes
    // the rank (docs/membership.md, "Spare workers").
    if (job.spares().empty()) v->fail("only used with a spare worker (a node with spare: true)");
    const double grace = v->number();
    if (grace < 0 || grace > 86400) v->fail("expected 0..86400 seconds, got " + v->text());
    job.training.spare_grace_s = grace;
  }
  if (job.training.on_worker_loss != OnWorkerLoss::kWait) return;
  const size_t servers = job.servers().size();
  if (servers > 1) {
    // The round in progress is the least version over every chunk, which
    // one server node knows alone (docs/membership.md, "A BSP job that waits").
    s.require("on_worker_loss")
        .fail("wait with " + std::to_string(servers) +
              " server nodes is not built: one server node only");
  }
}

void parse_server_loss(const Section& root, JobConfig& job) {
  Section s = optional_section(root, "network", MERCURY_NETWORK_KEYS);
  NetworkConfig& net = job.network;
  const std::optional<Value> loss = s.get("on_server_loss");
  if (loss) {
    net.on_server_loss =
        loss->choice<OnServerLoss>({{"fail", OnServerLoss::kFail}, {"wait", OnServerLoss::kWait}});
  }
  if (auto v = s.get("server_wait_s")) {
    if (net.on_server_loss != OnServerLoss::kWait) {
      v->fail("only used with network.on_server_loss wait");
    }
    net.server_wait_s = positive(*v);
  }
  if (net.on_server_loss != OnServerLoss::kWait) return;
  if (job.training.on_worker_loss != OnWorkerLoss::kFail) {
    // The server started again from its checkpoint knows nothing of the
    // ranks removed or waited for.
    loss->fail("wait with training.on_worker_loss " +
               std::string(loss_name(job.training.on_worker_loss)) +
               " is not built: a server started again knows nothing of the lost ranks");
  }
  // What a worker waits for: its server started again with --resume, the
  // same versions for every rank to roll back to.
  if (job.training.sync != Sync::kBsp) {
    loss->fail("wait needs training.sync bsp (training.sync is " +
               std::string(to_string(job.training.sync)) +
               "): the workers roll back to the version the server resumes at");
  }
  if (!job.checkpoint.enabled()) {
    loss->fail("wait needs checkpoint.dir: a server started again resumes from its checkpoint");
  }
  // Several servers: the ones still running roll back too, each from its
  // own checkpoint (docs/durability.md, "Several servers"); a store-and-
  // forward unit held half sent is not taken back.
  const size_t servers = job.servers().size();
  if (servers > 1 && job.training.aggregation != Aggregation::kChunk) {
    loss->fail("wait with " + std::to_string(servers) + " server nodes and training.aggregation " +
               std::string(to_string(job.training.aggregation)) +
               " is not built: the running servers roll back with aggregation chunk only");
  }
  for (const NodeConfig& n : job.nodes) {
    if (servers > 1 && n.role == Role::kServer && !n.standby.empty()) {
      // A primary that rolls back would leave its standby's copy ahead.
      loss->fail("wait with " + std::to_string(servers) + " server nodes and a standby (" + n.name +
                 "'s " + n.standby +
                 ") is not built: a server that rolls back does not roll its standby back");
    }
  }
}

}  // namespace mercury::config::detail
