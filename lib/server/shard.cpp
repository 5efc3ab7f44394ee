#include "server/shard.h"

namespace mercury::server {

Shard::Shard(const agg::Placement& placement, const agg::ShardConfig& config,
             std::unique_ptr<agg::SyncPolicy> policy, std::vector<FanOut> fanout)
    : placement_(placement), fanout_(std::move(fanout)) {
  table_ = std::make_unique<agg::ChunkTable>(placement, config, std::move(policy), *this);
}

bool Shard::contribute_st(uint16_t rank, uint32_t key, uint32_t offset, uint32_t iteration,
                          std::span<const std::byte> payload, rte_mbuf* mbuf) {
  const agg::Outcome o = table_->contribute(agg::Contribution{
      key, offset, iteration, rank, payload.data(), static_cast<uint32_t>(payload.size()), mbuf});
  if (agg::taken(o)) {
    ++counters_.contributions;
    return true;
  }
  ++counters_.refused;
  return false;
}

bool Shard::initialize_st(uint32_t key, uint32_t offset, std::span<const std::byte> payload) {
  const agg::Outcome o =
      table_->initialize(key, offset, payload.data(), static_cast<uint32_t>(payload.size()));
  if (agg::taken(o)) {
    ++counters_.initialized;
    return true;
  }
  ++counters_.init_refused;
  return false;
}

void Shard::on_update(const agg::Update& u) {
  ++counters_.updates;
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kAggData;
  meta.dtype = wire::Dtype::kFloat32;
  meta.tensor_key = u.key;
  meta.param_version = u.version;
  const auto logical = static_cast<uint32_t>(placement_.at(u.key).bytes());
  for (const FanOut& f : fanout_) {
    if (f.endpoint->send_slice(f.peer, u.data, u.bytes, u.offset, logical, u.priority, meta, {}) !=
        transport::SubmitStatus::kQueued) {
      ++counters_.fanout_refused;
    }
  }
}

void Shard::release(void* const* tokens, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) rte_pktmbuf_free(static_cast<rte_mbuf*>(tokens[i]));
}

}  // namespace mercury::server
