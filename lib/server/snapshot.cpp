#include "server/snapshot.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "agg/optimizer.h"

namespace mercury::server {

ShardSnapshot::ShardSnapshot(const agg::ChunkTable& table, CheckpointPlan& plan, uint64_t job)
    : table_(table),
      plan_(plan),
      job_(job),
      chunk_bytes_(0),
      arrays_(agg::state_floats_per_element(table.optimizer().kind())) {
  chunks_.reserve(table.chunks());
  uint32_t keys = 0;
  for (uint64_t i = 0; i < table.chunks(); ++i) {
    const agg::ChunkTable::ChunkView v = table.chunk_view(i);
    chunks_.push_back(Meta{.first_element = elements_,
                           .key = v.key,
                           .offset = v.offset,
                           .elements = static_cast<uint32_t>(v.params.size()),
                           .taken = 0});
    elements_ += v.params.size();
    keys = std::max(keys, v.key + 1);
    // A block's chunks after its first are chunk_bytes apart.
    if (v.offset != 0 && chunk_bytes_ == 0) chunk_bytes_ = v.offset;
  }
  first_chunk_.assign(keys, ~uint64_t{0});
  for (uint64_t i = chunks_.size(); i-- > 0;) first_chunk_[chunks_[i].key] = i;
  params_ = std::make_unique<float[]>(elements_);
  if (arrays_ >= 1) state0_ = std::make_unique<float[]>(elements_);
  if (arrays_ >= 2) state1_ = std::make_unique<float[]>(elements_);
  hyper_ = std::make_unique<std::byte[]>(kHyperBytes);
}

void ShardSnapshot::on_update_st(uint32_t key, uint32_t offset, uint32_t version) {
  MERCURY_OWNED(owner_);
  // Whether this is the shard's first chunk at `version`: a fill can only
  // start there (one starting later would miss the chunks already past it).
  const bool first_at_version = static_cast<int32_t>(version - newest_) > 0;
  if (first_at_version) newest_ = version;
  if (!plan_.at_st(version)) return;
  uint8_t state = state_.load(std::memory_order_acquire);  // pairs with release()
  if (state == kFilling && version != version_) {
    // A fill that never completed: some chunk missed its version (not
    // under BSP). It starts again at this one.
    failed_.fetch_add(1, std::memory_order_relaxed);
    state = kFree;
  }
  if (state == kReady || (state == kFree && !first_at_version)) {
    // The writer still has the previous one (or gave it back after this
    // version began): this checkpoint is skipped.
    if (skipped_version_ != version) {
      skipped_version_ = version;
      skipped_.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (state == kFree) {
    version_ = version;
    ++generation_;
    taken_ = 0;
    state_.store(kFilling, std::memory_order_relaxed);  // the owner's own mark
  }
  if (key >= first_chunk_.size() || first_chunk_[key] == ~uint64_t{0}) return;
  const uint64_t index = first_chunk_[key] + (chunk_bytes_ == 0 ? 0 : offset / chunk_bytes_);
  if (index >= chunks_.size() || chunks_[index].key != key || chunks_[index].offset != offset) {
    return;
  }
  Meta& m = chunks_[index];
  if (m.taken == generation_) return;  // copied already (a version sent again)
  const agg::ChunkTable::ChunkView v = table_.chunk_view(index);
  const uint64_t e = m.first_element;
  std::memcpy(params_.get() + e, v.params.data(), v.params.size_bytes());
  if (state0_) std::memcpy(state0_.get() + e, v.state0.data(), v.state0.size_bytes());
  if (state1_) std::memcpy(state1_.get() + e, v.state1.data(), v.state1.size_bytes());
  m.taken = generation_;
  if (++taken_ == chunks_.size()) complete_st();
}

void ShardSnapshot::rewind_st(uint32_t version) {
  MERCURY_OWNED(owner_);
  // kFilling is the shard's own mark (the writer takes kReady only).
  if (state_.load(std::memory_order_relaxed) == kFilling) {
    state_.store(kFree, std::memory_order_relaxed);
  }
  newest_ = version;
}

void ShardSnapshot::complete_st() {
  const agg::HyperparameterTable& h = table_.optimizer().hyperparameters();
  const uint64_t bytes = agg::hyperparameter_record_bytes(h);
  if (bytes > kHyperBytes) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    state_.store(kFree, std::memory_order_relaxed);
    return;
  }
  hyper_bytes_ = agg::encode_hyperparameter_record(job_, h, {hyper_.get(), bytes});
  completed_.fetch_add(1, std::memory_order_relaxed);
  state_.store(kReady, std::memory_order_release);  // pairs with ready()'s acquire
}

bool ShardSnapshot::ready(uint32_t& version) const {
  if (state_.load(std::memory_order_acquire) != kReady) return false;
  version = version_;
  return true;
}

ShardSnapshot::Chunk ShardSnapshot::chunk(uint64_t i) const {
  const Meta& m = chunks_[i];
  const agg::ShardOptimizer& opt = table_.optimizer();
  auto array = [&](const std::unique_ptr<float[]>& a) {
    return a ? std::span<const float>(a.get() + m.first_element, m.elements)
             : std::span<const float>{};
  };
  return Chunk{.state = agg::ChunkState{.key = m.key,
                                        .offset = m.offset,
                                        .version = version_,
                                        .steps = version_,
                                        .kind = opt.kind(),
                                        .decoupled_weight_decay = opt.decoupled_weight_decay()},
               .params = array(params_),
               .state0 = array(state0_),
               .state1 = array(state1_)};
}

void ShardSnapshot::release() {
  state_.store(kFree, std::memory_order_release);  // pairs with on_update_st's acquire
}

}  // namespace mercury::server
