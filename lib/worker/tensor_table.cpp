#include "worker/tensor_table.h"

#include <algorithm>
#include <string>

#include "sched/message.h"

namespace mercury::worker {

namespace {

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

}  // namespace

void TensorTable::check_live(std::string_view call) const {
  if (is_shut_down()) throw UsageError(std::string(call) + ": the worker has been shut down");
}

void TensorTable::check_frozen(std::string_view call) const {
  check_live(call);
  if (!frozen()) {
    throw UsageError(std::string(call) + ": tensors are not frozen yet (call freeze() first)");
  }
}

TensorId TensorTable::declare(std::string_view name, std::span<float> params, int priority,
                              agg::UpdateRule update) {
  return declare(name, wire::Dtype::kFloat32, std::as_writable_bytes(params), priority, update);
}

TensorId TensorTable::declare(std::string_view name, wire::Dtype dtype, std::span<std::byte> buffer,
                              int priority, agg::UpdateRule update) {
  std::lock_guard lock(mutex_);
  check_live("declare");
  if (frozen()) {
    throw UsageError("declare: tensor " + quoted(name) +
                     " declared after freeze(); declare every tensor before the first push, "
                     "pull or freeze");
  }
  if (name.empty()) throw UsageError("declare: a tensor needs a non-empty name");
  if (name.size() > agg::kMaxTensorNameBytes) {
    throw UsageError("declare: a tensor name of " + std::to_string(name.size()) +
                     " bytes; at most " + std::to_string(agg::kMaxTensorNameBytes));
  }
  if (static_cast<uint8_t>(update) >= agg::kUpdateRules) {
    throw UsageError("declare: tensor " + quoted(name) + " has update rule " +
                     std::to_string(static_cast<int>(update)) +
                     " (0 optimizer, 1 average, 2 rank 0, 3 optimizer on rank 0's push)");
  }
  if (!wire::is_tensor_dtype(dtype)) {
    throw UsageError("declare: tensor " + quoted(name) + " has dtype " +
                     std::string(wire::dtype_name(dtype)) +
                     "; a tensor is float32, bfloat16 or float16");
  }
  if (update == agg::UpdateRule::kOptimizerRank0 && dtype != wire::Dtype::kFloat32) {
    // Its skipped-step marker (kSkipStepBits) is a float32 bit pattern.
    throw UsageError("declare: tensor " + quoted(name) + " is " +
                     std::string(wire::dtype_name(dtype)) +
                     "; the update rule optimizer on rank 0's push takes float32 tensors only");
  }
  const uint32_t size = wire::element_bytes(dtype);
  if (buffer.size() % size != 0) {
    throw UsageError("declare: tensor " + quoted(name) + " is " +
                     std::string(wire::dtype_name(dtype)) + " but its buffer has " +
                     std::to_string(buffer.size()) + " bytes, not a whole number of " +
                     std::to_string(size) + "-byte elements");
  }
  const uint64_t elements = buffer.size() / size;
  if (elements == 0) throw UsageError("declare: tensor " + quoted(name) + " has no elements");
  if (elements > agg::kMaxTensorElements) {
    throw UsageError("declare: tensor " + quoted(name) + " has " + std::to_string(elements) +
                     " elements; at most 2^36 (" + std::to_string(agg::kMaxTensorElements) + ")");
  }
  if (priority < -1) {
    throw UsageError("declare: tensor " + quoted(name) + " has priority " +
                     std::to_string(priority) + "; use >= 0 (0 = most urgent) or -1 (default)");
  }
  if (auto it = by_name_.find(std::string(name)); it != by_name_.end()) {
    throw UsageError("declare: tensor " + quoted(name) + " is already declared (id " +
                     std::to_string(it->second) + ")");
  }
  const auto id = static_cast<TensorId>(tensors_.size());
  TensorInfo info;
  info.name = std::string(name);
  info.dtype = dtype;
  info.buffer = buffer;
  info.elements = elements;
  if (dtype == wire::Dtype::kFloat32) {
    info.params = {reinterpret_cast<float*>(buffer.data()), static_cast<size_t>(elements)};
  }
  info.priority = priority == -1 ? static_cast<int>(id) : priority;
  info.update = update;
  tensors_.push_back(std::move(info));
  by_name_.emplace(std::string(name), id);
  return id;
}

std::vector<uint8_t> TensorTable::levels_for(std::span<const int> priorities) {
  std::vector<int> distinct(priorities.begin(), priorities.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const uint64_t d = std::max<uint64_t>(distinct.size(), sched::kPriorityLevels);
  std::vector<uint8_t> levels;
  levels.reserve(priorities.size());
  for (int p : priorities) {
    const auto rank = static_cast<uint64_t>(std::lower_bound(distinct.begin(), distinct.end(), p) -
                                            distinct.begin());
    levels.push_back(static_cast<uint8_t>(rank * sched::kPriorityLevels / d));
  }
  return levels;
}

void TensorTable::freeze(uint32_t shards, uint32_t chunk_bytes,
                         const agg::PlacementOptions& options) {
  std::lock_guard lock(mutex_);
  check_live("freeze");
  if (frozen()) throw UsageError("freeze: the tensors are already frozen");
  if (tensors_.empty()) throw UsageError("freeze: no tensor has been declared");
  if (shards == 0) throw UsageError("freeze: the job needs at least one shard");
  if (chunk_bytes < 4 || chunk_bytes > 65532 || chunk_bytes % 4 != 0) {
    throw UsageError("freeze: chunk_bytes " + std::to_string(chunk_bytes) +
                     " must be a multiple of 4 in [4, 65532] (net::payload_per_packet(mtu))");
  }
  std::vector<int> priorities;
  priorities.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) priorities.push_back(t.priority);
  const std::vector<uint8_t> levels = levels_for(priorities);

  std::vector<agg::TensorDecl> decls;
  decls.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    decls.push_back({.name = tensors_[i].name,
                     .elements = tensors_[i].elements,
                     .priority = levels[i],
                     .dtype = tensors_[i].dtype,
                     .update = tensors_[i].update});
  }
  std::optional<agg::Placement> placement;
  try {
    placement.emplace(agg::Placement::compute(decls, shards, options));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("freeze: the placement refused the tensors: ") + e.what());
  }

  std::vector<BlockGeometry> geometry;
  geometry.reserve(placement->blocks().size());
  for (uint32_t t = 0; t < tensors_.size(); ++t) {
    TensorInfo& info = tensors_[t];
    const auto blocks = placement->tensor_blocks(t);
    info.level = levels[t];
    info.first_key = blocks.front().key;
    info.blocks = static_cast<uint32_t>(blocks.size());
    info.first_block_geometry = static_cast<uint32_t>(geometry.size());
    uint64_t chunks = 0;
    for (const agg::Block& p : blocks) {
      const uint64_t n = (p.bytes() + chunk_bytes - 1) / chunk_bytes;
      geometry.push_back({.key = p.key,
                          .shard = p.shard,
                          .first_element = p.first_element,
                          .elements = p.elements,
                          .chunks = static_cast<uint32_t>(n),
                          .first_chunk = static_cast<uint32_t>(chunks),
                          .dtype = p.dtype});
      chunks += n;
    }
    if (chunks > UINT32_MAX) {
      throw UsageError("freeze: tensor " + quoted(info.name) + " has more than 2^32 chunks");
    }
    info.chunks = static_cast<uint32_t>(chunks);
  }
  geometry_ = std::move(geometry);
  decls_ = std::move(decls);
  placement_ = std::move(placement);
  chunk_bytes_ = chunk_bytes;
  shards_ = shards;
  // Release: every field above happens-before a reader's acquire of frozen_.
  frozen_.store(true, std::memory_order_release);
}

void TensorTable::shutdown() {
  std::lock_guard lock(mutex_);
  shut_down_.store(true, std::memory_order_release);
}

uint32_t TensorTable::size() const {
  std::lock_guard lock(mutex_);
  return static_cast<uint32_t>(tensors_.size());
}

const TensorInfo& TensorTable::checked(TensorId id, std::string_view call) const {
  check_frozen(call);
  if (id >= tensors_.size()) {
    throw UsageError(std::string(call) + ": unknown tensor id " + std::to_string(id) + " (" +
                     std::to_string(tensors_.size()) + " tensors declared)");
  }
  return tensors_[id];
}

const TensorInfo& TensorTable::tensor(TensorId id) const { return checked(id, "tensor"); }

TensorId TensorTable::find(std::string_view name) const {
  check_frozen("find");
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) throw UsageError("find: no tensor is declared as " + quoted(name));
  return it->second;
}

std::span<const BlockGeometry> TensorTable::blocks(TensorId id) const {
  const TensorInfo& t = checked(id, "blocks");
  return std::span<const BlockGeometry>(geometry_).subspan(t.first_block_geometry, t.blocks);
}

wire::Dtype TensorTable::dtype(TensorId id) const {
  if (frozen()) return checked(id, "dtype").dtype;
  std::lock_guard lock(mutex_);
  check_live("dtype");
  if (id >= tensors_.size()) {
    throw UsageError("dtype: no tensor with key " + std::to_string(id) + " (" +
                     std::to_string(tensors_.size()) + " declared)");
  }
  return tensors_[id].dtype;
}

void TensorTable::check_buffer(TensorId id, wire::Dtype dtype, uint64_t elements,
                               std::string_view call) const {
  const TensorInfo& t = checked(id, call);
  if (dtype != t.dtype) {
    // No conversion on the worker: half precision travels as it is.
    throw UsageError(std::string(call) + ": tensor " + quoted(t.name) + " is " +
                     std::string(wire::dtype_name(t.dtype)) + " but the buffer is " +
                     std::string(wire::dtype_name(dtype)));
  }
  if (elements != t.elements) {
    throw UsageError(std::string(call) + ": tensor " + quoted(t.name) + " has " +
                     std::to_string(t.elements) + " elements but the buffer has " +
                     std::to_string(elements));
  }
}

void TensorTable::check_push(TensorId id, std::span<const float> grad) const {
  check_buffer(id, wire::Dtype::kFloat32, grad.size(), "push");
}

void TensorTable::check_pull(TensorId id, std::span<const float> out) const {
  check_buffer(id, wire::Dtype::kFloat32, out.size(), "pull");
}

void TensorTable::check_push(TensorId id, wire::Dtype dtype, uint64_t elements) const {
  check_buffer(id, dtype, elements, "push");
}

void TensorTable::check_pull(TensorId id, wire::Dtype dtype, uint64_t elements) const {
  check_buffer(id, dtype, elements, "pull");
}

const agg::Placement& TensorTable::placement() const {
  check_frozen("placement");
  return *placement_;
}

const std::vector<agg::TensorDecl>& TensorTable::declarations() const {
  check_frozen("declarations");
  return decls_;
}

uint32_t TensorTable::chunk_bytes() const {
  check_frozen("chunk_bytes");
  return chunk_bytes_;
}

uint32_t TensorTable::shards() const {
  check_frozen("shards");
  return shards_;
}

uint32_t TensorTable::tensors() const {
  check_frozen("tensors");
  return static_cast<uint32_t>(tensors_.size());
}

std::optional<TensorId> TensorTable::tensor_of_key(uint32_t key) const {
  check_frozen("tensor_of_key");
  if (key >= placement_->blocks().size()) return std::nullopt;
  return placement_->at(key).tensor;
}

}  // namespace mercury::worker
