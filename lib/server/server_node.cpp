#include "server/server_node.h"

#include <stdexcept>
#include <string>

namespace mercury::server {

class ServerNode::RankReceiver final : public transport::PacketReceiver {
 public:
  RankReceiver(ServerNode& node, uint16_t rank) : node_(node), rank_(rank) {}
  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 rte_mbuf* mbuf) override {
    return node_.contribute_st(rank_, h, payload, mbuf);
  }

 private:
  ServerNode& node_;
  uint16_t rank_;
};

ServerNode::ServerNode(const agg::Placement& placement, std::vector<WorkerLink> links,
                       const ServerNodeConfig& config, transport::Tick now)
    : placement_(placement), shard_slot_(placement.shards(), -1) {
  if (links.empty() || links.size() > agg::kMaxWorkers) {
    throw std::invalid_argument("server: 1.." + std::to_string(agg::kMaxWorkers) +
                                " worker links, got " + std::to_string(links.size()));
  }
  if (config.shard_ids.empty()) throw std::invalid_argument("server: no shards to run");
  for (const agg::Partition& p : placement.partitions()) {
    if (p.priority >= sched::kPriorityLevels) {
      // Updates go out at the partition's priority, which must be a scheduler
      // level: build the placement from worker::TensorTable::declarations().
      throw std::invalid_argument("server: partition " + std::to_string(p.key) + " has priority " +
                                  std::to_string(p.priority) + ", not a scheduler level (< " +
                                  std::to_string(sched::kPriorityLevels) + ")");
    }
  }
  for (size_t r = 0; r < links.size(); ++r) {
    if (links[r].iface == nullptr) {
      throw std::invalid_argument("server: worker link " + std::to_string(r) + " has no interface");
    }
    receivers_.push_back(std::make_unique<RankReceiver>(*this, static_cast<uint16_t>(r)));
    transport::EndpointConfig ec = config.endpoint;
    ec.peers = {links[r].worker};
    endpoints_.push_back(
        std::make_unique<transport::Endpoint>(*links[r].iface, ec, *receivers_.back(), now));
  }
  std::vector<FanOut> fanout;
  for (auto& e : endpoints_) fanout.push_back(FanOut{e.get(), 0});
  for (uint32_t id : config.shard_ids) {
    if (id >= placement.shards() || shard_slot_[id] >= 0) {
      throw std::invalid_argument("server: shard " + std::to_string(id) +
                                  " is out of range or listed twice (the placement has " +
                                  std::to_string(placement.shards()) + ")");
    }
    agg::ShardConfig sc;
    sc.shard = id;
    sc.workers = static_cast<uint32_t>(links.size());
    sc.chunk_bytes = config.chunk_bytes;
    sc.optimizer = config.optimizer;
    sc.memory_limit_bytes = config.shard_memory_limit;
    shard_slot_[id] = static_cast<int32_t>(shards_.size());
    shards_.push_back(std::make_unique<Shard>(placement, sc, agg::make_bsp(), fanout));
  }
}

ServerNode::~ServerNode() {
  // Shards hold mbufs of the endpoints' interfaces: they go first, then the
  // endpoints (which still reference the receivers).
  shards_.clear();
  endpoints_.clear();
}

bool ServerNode::contribute_st(uint16_t rank, const wire::HeaderFields& h,
                               std::span<const std::byte> payload, rte_mbuf* mbuf) {
  if (h.tensor_key >= placement_.partitions().size()) {
    ++not_ours_;
    return false;
  }
  const int32_t slot = shard_slot_[placement_.at(h.tensor_key).shard];
  if (slot < 0) {
    ++not_ours_;
    return false;
  }
  return shards_[slot]->contribute_st(rank, h, payload, mbuf);
}

uint32_t ServerNode::poll_st(transport::Tick now) {
  uint32_t work = 0;
  for (auto& e : endpoints_) work += e->poll_st(now);
  return work;
}

ServerCounters ServerNode::counters_st() const {
  ServerCounters c;
  for (const auto& s : shards_) {
    c.shards.contributions += s->counters().contributions;
    c.shards.refused += s->counters().refused;
    c.shards.updates += s->counters().updates;
    c.shards.fanout_refused += s->counters().fanout_refused;
  }
  c.not_ours = not_ours_;
  for (const auto& e : endpoints_) {
    const transport::EndpointCounters n = e->counters_st();
    c.net.rx_packets += n.rx_packets;
    c.net.tx_data += n.tx_data;
    c.net.tx_retransmits += n.tx_retransmits;
    c.net.tx_pure_acks += n.tx_pure_acks;
    c.net.packets_delivered += n.packets_delivered;
    c.net.slices_submitted += n.slices_submitted;
  }
  return c;
}

const Shard* ServerNode::shard(uint32_t global_id) const {
  if (global_id >= shard_slot_.size() || shard_slot_[global_id] < 0) return nullptr;
  return shards_[shard_slot_[global_id]].get();
}

}  // namespace mercury::server
