#include "job/job.h"

#include <chrono>

namespace mercury::job {

transport::EndpointConfig endpoint_config(const config::JobConfig& job, uint16_t sender_id,
                                          uint16_t epoch, uint64_t tsc_hz) {
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
  return c;
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
  }
  o.learning_rate = static_cast<float>(t.learning_rate);
  o.momentum = static_cast<float>(t.momentum);
  o.beta1 = static_cast<float>(t.beta1);
  o.beta2 = static_cast<float>(t.beta2);
  o.epsilon = static_cast<float>(t.epsilon);
  return o;
}

std::unique_ptr<agg::SyncPolicy> sync_policy(const config::TrainingConfig& t) {
  switch (t.sync) {
    case config::Sync::kBsp:
      return agg::make_bsp();
    case config::Sync::kAsp:
      return agg::make_asp();
    case config::Sync::kSsp:
      return agg::make_ssp(t.staleness);
    case config::Sync::kPsPlus:
      return agg::make_staleness_scaled(t.staleness);
  }
  return agg::make_bsp();
}

uint32_t ShardLayout::server_of(uint32_t shard) const {
  uint32_t s = 0;
  while (s + 1 < first.size() && first[s + 1] <= shard) ++s;
  return s;
}

ShardLayout shard_layout(const config::JobConfig& job) {
  ShardLayout l;
  for (const config::NodeConfig* s : job.servers()) {
    l.first.push_back(l.total);
    l.total += s->shards;
  }
  if (l.total == 0) throw config::ConfigError(job.source, "the job has no server shards");
  return l;
}

uint16_t fresh_epoch() {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  const auto e = static_cast<uint16_t>(s);
  return e == 0 ? 1 : e;
}

}  // namespace mercury::job
