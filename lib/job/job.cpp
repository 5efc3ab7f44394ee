#include "job/job.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace mercury::job {

transport::EndpointConfig endpoint_config(const config::JobConfig& job, uint16_t sender_id,
                                          uint32_t epoch, uint64_t tsc_hz) {
  if (epoch == 0)
    throw config::ConfigError(job.source, "internal: a node's epoch must be non-zero");
  transport::EndpointConfig c;
  c.transport.tsc_hz = tsc_hz;
  c.transport.window_packets = job.network.window;  // 0: derived from rate x RTT
  // Ethernet header + FCS + preamble/IFG on top of the IP MTU.
  c.transport.packet_bytes = job.network.mtu + 38;
  if (job.link.rate_gbps > 0) {
    c.transport.link_bits_per_sec = static_cast<uint64_t>(job.link.rate_gbps * 1e9);
  }
  c.transport.peer_timeout_us = uint64_t{job.network.peer_timeout_ms} * 1000;
  if (std::any_of(job.nodes.begin(), job.nodes.end(),
                  [](const config::NodeConfig& n) { return n.poll == config::Poll::kAdaptive; })) {
    c.transport.min_rto_us = kAdaptiveMinRtoUs;
    c.transport.initial_rto_us = std::max(c.transport.initial_rto_us, kAdaptiveMinRtoUs);
  }
  switch (job.network.scheduler) {
    case config::Scheduler::kStrict:
      c.mode = sched::Mode::kStrict;
      break;
    case config::Scheduler::kFifo:
      c.mode = sched::Mode::kFifo;
      break;
    case config::Scheduler::kPartition:
      c.mode = sched::Mode::kPartition;
      c.partition_bytes = job.network.partition_bytes;
      c.credit_bytes = job.network.credit_bytes;
      break;
  }
  c.job_id = job.id;
  c.sender_id = sender_id;
  c.local_epoch = epoch;
  if (job.network.auth_key) {
    c.auth_key = job.network.auth_key;
    // Initial sequence numbers that only the job's nodes can compute.
    c.transport.seq_salt = transport::derive_seq_salt(*job.network.auth_key);
  }
  return c;
}

uint32_t store_forward_unit(const config::JobConfig& job) {
  if (job.training.aggregation == config::Aggregation::kChunk) return 0;
  if (job.network.scheduler != config::Scheduler::kPartition) return UINT32_MAX;
  return std::max<uint32_t>(1, job.network.partition_bytes / job.payload_bytes_per_packet());
}

agg::PlacementOptions placement_options(const config::JobConfig& job) {
  agg::PlacementOptions o;
  if (job.training.aggregation == config::Aggregation::kTensor) {
    o.max_block_bytes = agg::PlacementOptions::kMaxMessageBytes;
  }
  return o;
}

agg::OptimizerConfig optimizer_config(const config::TrainingConfig& t) {
  agg::OptimizerConfig o;
  switch (t.optimizer) {
    case config::Optimizer::kSum:
      o.kind = agg::OptimizerKind::kSumOnly;
      break;
    case config::Optimizer::kSgd:
      o.kind = agg::OptimizerKind::kSgd;
      break;
    case config::Optimizer::kMomentum:
      o.kind = agg::OptimizerKind::kMomentum;
      break;
    case config::Optimizer::kAdam:
      o.kind = agg::OptimizerKind::kAdam;
      break;
    case config::Optimizer::kAdamW:
      o.kind = agg::OptimizerKind::kAdam;
      o.decoupled_weight_decay = true;
      break;
  }
  o.learning_rate = static_cast<float>(t.learning_rate);
  o.momentum = static_cast<float>(t.momentum);
  o.beta1 = static_cast<float>(t.beta1);
  o.beta2 = static_cast<float>(t.beta2);
  o.epsilon = static_cast<float>(t.epsilon);
  o.weight_decay = static_cast<float>(t.weight_decay);
  return o;
}

std::unique_ptr<agg::SyncPolicy> sync_policy(const config::TrainingConfig& t) {
  switch (t.sync) {
    case config::Sync::kBsp:
      return agg::make_bsp();
    case config::Sync::kAsp:
      return agg::make_asp();
    case config::Sync::kSsp:
      // The bound is kept by the workers, which wait rather than push a
      // gradient too far ahead (docs/worker.md); the server applies what comes.
      return agg::make_asp();
    case config::Sync::kPsPlus: {
      agg::StalenessLr lr = agg::StalenessLr::kInverse;
      if (t.staleness_lr == config::StalenessLr::kInverseSqrt) lr = agg::StalenessLr::kInverseSqrt;
      if (t.staleness_lr == config::StalenessLr::kNone) lr = agg::StalenessLr::kNone;
      return agg::make_staleness_scaled(UINT32_MAX, lr);
    }
  }
  return agg::make_bsp();
}

uint32_t ShardLayout::server_of(uint32_t shard) const {
  uint32_t s = 0;
  while (s + 1 < first.size() && first[s + 1] <= shard) ++s;
  return s;
}

uint32_t ShardLayout::count(uint32_t server) const {
  if (server >= first.size()) return 0;
  return (server + 1 < first.size() ? first[server + 1] : total) - first[server];
}

ShardLayout ShardLayout::of(const std::vector<uint32_t>& shards_per_server) {
  ShardLayout l;
  for (uint32_t n : shards_per_server) {
    l.first.push_back(l.total);
    l.total += n;
  }
  return l;
}

ShardLayout shard_layout(const config::JobConfig& job) {
  std::vector<uint32_t> counts;
  for (const config::NodeConfig* s : job.servers()) counts.push_back(s->shards);
  ShardLayout l = ShardLayout::of(counts);
  if (l.total == 0) throw config::ConfigError(job.source, "the job has no server shards");
  return l;
}

const config::NodeConfig& worker_node(const config::JobConfig& job, std::string_view name) {
  const config::NodeConfig& n = job.node(name);
  if (n.role != config::Role::kWorker) {
    throw config::ConfigError(job.source, "node " + n.name + " is a server, not a worker");
  }
  if (n.ports.empty()) throw config::ConfigError(job.source, "worker " + n.name + " has no port");
  return n;
}

transport::PeerSpec peer_of(const config::NodeConfig& n) {
  return transport::PeerSpec{n.name, n.ipv4.value, n.udp_port, 0, static_cast<uint16_t>(n.index)};
}

std::vector<uint32_t> port_of_worker(const config::JobConfig& job,
                                     const config::NodeConfig& server) {
  auto workers = job.workers();
  for (const config::NodeConfig* s : job.spares()) workers.push_back(s);
  const auto& ports = server.ports;
  std::vector<uint32_t> out(workers.size());
  for (size_t r = 0; r < workers.size(); ++r) {
    bool found = false;
    for (size_t p = 0; p < ports.size() && !found; ++p) {
      if (ports[p].kind == config::PortSpec::kRing && ports[p].ring_peer == workers[r]->name) {
        out[r] = static_cast<uint32_t>(p);
        found = true;
      }
    }
    if (found) continue;
    if (ports.size() == 1) {
      out[r] = 0;
    } else if (ports.size() == workers.size() && ports[r].kind != config::PortSpec::kRing) {
      out[r] = static_cast<uint32_t>(r);
    } else {
      throw config::ConfigError(
          job.source, 0, "nodes[" + std::to_string(server.index) + "].ports",
          "server " + server.name + ": no port leads to worker " + workers[r]->name +
              " (give the server one port for all workers, one port per worker in rank order, "
              "or a ring: link to it)");
    }
  }
  return out;
}

uint32_t fresh_epoch() {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  // Mod 2^32 (the wrap every 49.7 days is what epoch_newer's serial compare
  // is for); 0 is no sender's epoch, so the one millisecond in 2^32 that
  // maps there takes 1.
  const auto e = static_cast<uint32_t>(ms);
  return e == 0 ? 1 : e;
}

}  // namespace mercury::job
