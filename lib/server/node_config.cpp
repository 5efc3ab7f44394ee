#include "server/node_config.h"

#include <algorithm>
#include <bit>
#include <set>
#include <string>

#include "job/job.h"

namespace mercury::server {

namespace {

Fanout fanout_rule(config::Sync sync) {
  switch (sync) {
    case config::Sync::kBsp:
      return Fanout::kEvery;
    case config::Sync::kAsp:
      return Fanout::kContributor;
    case config::Sync::kSsp:
      return Fanout::kSlowest;
    case config::Sync::kPsPlus:
      return Fanout::kEveryVersion;
  }
  return Fanout::kEvery;
}

}  // namespace

std::vector<unsigned> shard_core_lcores(const config::NodeConfig& node,
                                        const std::function<unsigned(unsigned)>& cpu_of_lcore) {
  std::vector<unsigned> out;
  std::set<unsigned> taken;
  if (cpu_of_lcore) taken.insert(cpu_of_lcore(node.net_lcore()));
  for (const uint32_t lcore : node.shard_lcores()) {
    if (out.size() == node.shards) break;
    if (cpu_of_lcore && !taken.insert(cpu_of_lcore(lcore)).second) break;
    out.push_back(lcore);
  }
  return out;
}

ServerNodeConfig node_config(const config::JobConfig& job, const config::NodeConfig& node,
                             const NodeStart& start) {
  if (node.role == config::Role::kWorker) {
    throw config::ConfigError(job.source, "node " + node.name + " is a worker, not a server");
  }
  if (job.workers().empty()) throw config::ConfigError(job.source, "the job has no worker nodes");
  if (node.shards == 0 && node.role != config::Role::kStandby) {
    throw config::ConfigError(job.source, 0, "nodes[" + std::to_string(node.index) + "].shards",
                              "server " + node.name + " has no shards");
  }
  ServerNodeConfig c;
  c.chunk_bytes = job.payload_bytes_per_packet();
  c.optimizer = job::optimizer_config(job.training);
  c.sync_policy = [training = job.training] { return job::sync_policy(training); };
  c.fanout = fanout_rule(job.training.sync);
  c.staleness_bound = job.training.staleness_bound;
  c.shrink = job.training.on_worker_loss == config::OnWorkerLoss::kShrink;
  c.wait_for_workers = job.training.on_worker_loss == config::OnWorkerLoss::kWait;
  c.worker_wait_s = job.training.worker_wait_s;
  c.unit_chunks = job::store_forward_unit(job);
  c.placement = job::placement_options(job);
  c.layout = job::shard_layout(job);
  c.server_index = job.rank_of(node.name);
  c.endpoint =
      job::endpoint_config(job, static_cast<uint16_t>(node.index), start.epoch, start.tsc_hz);
  c.endpoint.max_messages = kServerEndpointMessages;
  c.endpoint.ingress_capacity = kServerEndpointMessages;
  c.shard_core.idle.mode = node.poll;
  c.shard_lcores = shard_core_lcores(node, start.cpu_of_lcore);
  // A shard core's ring must hold every mbuf the node's RX pools have: an
  // item the net core hands over has been acknowledged already, so the ring
  // may never refuse one.
  if (start.rx_pool_mbufs != 0) {
    c.shard_core.ring_entries = static_cast<uint32_t>(std::bit_ceil(start.rx_pool_mbufs + 1));
  }
  c.rx_pool_mbufs = start.rx_pool_mbufs;
  c.flow_limit = 0;  // derived from the pool the packets arrive in
  // Spare workers: peers after the ranks, on the ports the job file gives
  // them (docs/membership.md, "Spare workers").
  if (const auto spares = job.spares(); !spares.empty()) {
    const std::vector<uint32_t> port = job::port_of_worker(job, node);
    const size_t ranks = job.workers().size();
    for (size_t s = 0; s < spares.size(); ++s) {
      c.spares.push_back(JobWorker{job::peer_of(*spares[s]), port[ranks + s]});
    }
  }
  c.spare_grace_s = job.training.spare_grace_s;
  c.checkpoints.enabled = job.checkpoint.enabled();
  c.checkpoints.every_versions = job.checkpoint.every_versions;
  c.checkpoints.dir = job.checkpoint.path;
  c.checkpoints.node = node.name;
  if (!node.standby.empty()) {
    // A hot standby (docs/durability.md): the pair's shards run inline (the
    // loader allows them one lcore), the partner is a peer of port 0.
    c.standby = node.role == config::Role::kStandby ? Standby::kStandby : Standby::kPrimary;
    c.partner = job::peer_of(job.node(node.standby));
    c.shard_lcores.clear();
    if (c.standby == Standby::kStandby) {
      // A standby writes no checkpoints of its own until it serves; its
      // server writes them.
      c.checkpoints.enabled = false;
    }
  }
  return c;
}

std::vector<JobWorker> job_workers(const config::JobConfig& job, const config::NodeConfig& node) {
  const std::vector<uint32_t> port = job::port_of_worker(job, node);
  const auto workers = job.workers();
  std::vector<JobWorker> out;
  for (size_t r = 0; r < workers.size(); ++r) {
    out.push_back(JobWorker{job::peer_of(*workers[r]), port[r]});
  }
  return out;
}

}  // namespace mercury::server
