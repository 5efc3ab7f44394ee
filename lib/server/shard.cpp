#include "server/shard.h"

#include <algorithm>

namespace mercury::server {

Shard::Shard(const agg::Placement& placement, const agg::ShardConfig& config,
             std::unique_ptr<agg::SyncPolicy> policy, std::vector<FanOut> fanout,
             uint64_t fanout_backlog)
    : placement_(placement),
      fanout_(std::move(fanout)),
      chunk_bytes_(config.chunk_bytes),
      started_(placement, config.shard, config.chunk_bytes) {
  table_ = std::make_unique<agg::ChunkTable>(placement, config, std::move(policy), *this);
  staging_chunks_ = table_->staging_chunks();
  backlog_.resize(fanout_backlog != 0 ? fanout_backlog : table_->chunks() * fanout_.size());
}

bool Shard::contribute_st(uint16_t rank, uint32_t key, uint32_t offset, uint32_t iteration,
                          std::span<const std::byte> payload, rte_mbuf* mbuf, bool copy) {
  const uint64_t released = table_->staging_released();
  const agg::Outcome o =
      table_->contribute(agg::Contribution{key, offset, iteration, rank, payload.data(),
                                           static_cast<uint32_t>(payload.size()), mbuf, copy});
  if (copy) {
    marks_done_.store(marks_done_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (o != agg::Outcome::kCopied) ++marks_returned_;
  }
  if (copy || table_->staging_released() != released) {
    // The credits back: unused marks, and the staging chunks the update freed.
    staging_returned_.store(marks_returned_ + table_->staging_released(),
                            std::memory_order_relaxed);
  }
  if (agg::taken(o)) {
    // kApplied cleared the chunk's view in on_update, inside contribute().
    if (o == agg::Outcome::kHeld || o == agg::Outcome::kCopied) started_.held_st(key, offset, rank);
    ++counters_.contributions;
    return o != agg::Outcome::kCopied;
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

bool Shard::send_st(uint16_t rank, const std::byte* data, uint32_t bytes, uint32_t key,
                    uint32_t offset, uint32_t version, uint8_t priority) {
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kAggData;
  meta.dtype = wire::Dtype::kFloat32;
  meta.block_key = key;
  meta.param_version = version;
  const auto logical = static_cast<uint32_t>(placement_.at(key).bytes());
  const FanOut& f = fanout_[rank];
  return f.endpoint->send_slice(f.peer, data, bytes, offset, logical, priority, meta, {}) ==
         transport::SubmitStatus::kQueued;
}

void Shard::on_update(const agg::Update& u) {
  // Before the fan-out: the workers' next contributions, which need this
  // update, must find the chunk's set empty (server/started_sets.h).
  started_.cleared_st(u.key, u.offset);
  ++counters_.updates;
  for (size_t r = 0; r < fanout_.size(); ++r) {
    const auto rank = static_cast<uint16_t>(r);
    if (send_st(rank, u.data, u.bytes, u.key, u.offset, u.version, u.priority)) continue;
    ++counters_.fanout_refused;
    if (backlog_count_ == backlog_.size()) {
      ++counters_.fanout_lost;
      continue;
    }
    backlog_[(backlog_head_ + backlog_count_++) % backlog_.size()] =
        Deferred{u.key, u.offset, u.version, rank, u.priority};
  }
}

uint32_t Shard::retry_fanout_st() {
  uint32_t sent = 0;
  while (backlog_count_ != 0) {
    const Deferred& d = backlog_[backlog_head_];
    const std::span<const float> params = table_->parameters(d.key);
    const auto* base = reinterpret_cast<const std::byte*>(params.data());
    const uint64_t left = params.size_bytes() - d.offset;
    const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(left, chunk_bytes_));
    if (table_->version(d.key, d.offset) != d.version) {
      ++counters_.fanout_lost;  // cannot happen under BSP (see Deferred)
    } else if (!send_st(d.rank, base + d.offset, bytes, d.key, d.offset, d.version, d.priority)) {
      break;
    } else {
      ++counters_.fanout_retried;
      ++sent;
    }
    backlog_head_ = (backlog_head_ + 1) % backlog_.size();
    --backlog_count_;
  }
  return sent;
}

void Shard::release(void* const* tokens, uint32_t count) { releases_.free_st(tokens, count); }

}  // namespace mercury::server
