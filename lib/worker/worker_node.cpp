#include "worker/worker_node.h"

#include <stdexcept>
#include <string>

namespace mercury::worker {

WorkerNode::WorkerNode(const TensorTable& table, net::Interface& iface,
                       const WorkerNodeConfig& config, transport::Tick now)
    : table_(table), shard_peer_(config.shard_peer), tracker_(table, config.pulls) {
  const uint32_t shards = table.placement().shards();
  if (shard_peer_.empty()) shard_peer_.assign(shards, 0);
  if (shard_peer_.size() != shards) {
    throw std::invalid_argument("worker: shard_peer names " + std::to_string(shard_peer_.size()) +
                                " shards, the placement has " + std::to_string(shards));
  }
  for (uint16_t p : shard_peer_) {
    if (p >= config.endpoint.peers.size()) {
      throw std::invalid_argument("worker: shard mapped to server peer " + std::to_string(p) +
                                  ", which does not exist");
    }
  }
  endpoint_ = std::make_unique<transport::Endpoint>(
      iface, config.endpoint, transport::Receivers{config.control, this}, now);
}

WorkerNode::~WorkerNode() = default;

uint32_t WorkerNode::push(TensorId tensor, std::span<const float> grad, uint32_t iteration) {
  table_.check_push(tensor, grad);
  const TensorInfo& info = table_.tensor(tensor);
  uint32_t refused = 0;
  for (const PartitionGeometry& p : table_.partitions(tensor)) {
    transport::MessageMeta meta;
    meta.type = wire::PacketType::kData;
    meta.dtype = wire::Dtype::kFloat32;
    meta.tensor_key = p.key;
    meta.iteration = iteration;
    const auto* data = reinterpret_cast<const std::byte*>(grad.data() + p.first_element);
    if (endpoint_->send(shard_peer_[p.shard], data, static_cast<uint32_t>(p.bytes()), info.level,
                        meta, {}) == transport::SubmitStatus::kQueued) {
      partitions_pushed_.fetch_add(1, std::memory_order_relaxed);
    } else {
      push_refused_.fetch_add(1, std::memory_order_relaxed);
      ++refused;
    }
  }
  return refused;
}

uint32_t WorkerNode::push_partitions_st(TensorId tensor, const float* grad, uint32_t iteration,
                                        wire::PacketType type, uint32_t first,
                                        const transport::Completion& done) {
  const TensorInfo& info = table_.tensor(tensor);
  const std::span<const PartitionGeometry> parts = table_.partitions(tensor);
  uint32_t i = first;
  for (; i < parts.size(); ++i) {
    const PartitionGeometry& p = parts[i];
    transport::MessageMeta meta;
    meta.type = type;
    meta.dtype = wire::Dtype::kFloat32;
    meta.tensor_key = p.key;
    meta.iteration = iteration;
    transport::Completion c = done;
    c.cookie = p.key;
    const auto* data = reinterpret_cast<const std::byte*>(grad + p.first_element);
    if (endpoint_->send(shard_peer_[p.shard], data, static_cast<uint32_t>(p.bytes()), info.level,
                        meta, c) != transport::SubmitStatus::kQueued) {
      push_refused_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    partitions_pushed_.fetch_add(1, std::memory_order_relaxed);
  }
  return i;
}

transport::SubmitStatus WorkerNode::send_control_st(uint16_t server,
                                                    std::span<const std::byte> bytes,
                                                    const transport::Completion& done) {
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kControl;
  meta.dtype = wire::Dtype::kBytes;
  return endpoint_->send(server, bytes.data(), static_cast<uint32_t>(bytes.size()), 0, meta, done);
}

bool WorkerNode::on_packet(uint16_t, const wire::HeaderFields& h,
                           std::span<const std::byte> payload, net::PacketBuf*) {
  ++chunks_received_;
  tracker_.deliver_st(h.tensor_key, h.offset, h.param_version, payload);
  return false;  // copied into the trainer's buffer: the endpoint frees the mbuf
}

WorkerNodeCounters WorkerNode::counters_st() const {
  WorkerNodeCounters c;
  c.chunks_received = chunks_received_;
  c.partitions_pushed = partitions_pushed_.load(std::memory_order_relaxed);
  c.push_refused = push_refused_.load(std::memory_order_relaxed);
  c.net = endpoint_->counters_st();
  return c;
}

}  // namespace mercury::worker
