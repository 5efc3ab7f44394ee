#include "server/server_node.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <stdexcept>
#include <string>

namespace mercury::server {

std::string_view node_state_name(NodeState s) {
  switch (s) {
    case NodeState::kWaiting:
      return "waiting";
    case NodeState::kRunning:
      return "running";
    case NodeState::kRefused:
      return "refused";
    case NodeState::kStopped:
      return "stopped";
  }
  return "?";
}

std::string_view server_drop_name(ServerDrop d) {
  switch (d) {
    case ServerDrop::kNotRunning:
      return "not_running";
    case ServerDrop::kNotOurs:
      return "not_ours";
    case ServerDrop::kInitNotRank0:
      return "init_not_rank0";
    case ServerDrop::kBadType:
      return "bad_type";
    case ServerDrop::kShardRingFull:
      return "shard_ring_full";
    case ServerDrop::kControlTooBig:
      return "control_too_big";
    case ServerDrop::kBadControl:
      return "bad_control";
    case ServerDrop::kWrongRank:
      return "wrong_rank";
    case ServerDrop::kBarrierNotHere:
      return "barrier_not_here";
    case ServerDrop::kReplyNotQueued:
      return "reply_not_queued";
    case ServerDrop::kCount:
      break;
  }
  return "?";
}

// One port's receiver: the workers behind it, by transport peer index.
// Gradient and init packets arrive one by one (PacketReceiver); control
// messages whole (MessageReceiver): see transport::Receivers.
class ServerNode::PortReceiver final : public transport::PacketReceiver,
                                       public transport::MessageReceiver {
 public:
  PortReceiver(ServerNode& node, uint32_t port, std::vector<uint16_t> ranks)
      : node_(node), port_(port), ranks_(std::move(ranks)) {}

  bool admit(uint16_t peer, const wire::HeaderFields& h) override {
    return node_.admit_st(port_, ranks_[peer], h);
  }
  bool on_packet(uint16_t peer, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    return node_.on_packet_st(port_, ranks_[peer], h, payload, net::mbuf_of(buf));
  }
  std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) override {
    return node_.control_begin(ranks_[peer], h);
  }
  void on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte* buffer) override {
    node_.control_complete(ranks_[peer], buffer, h.msg_len);
  }
  void on_message_abandoned(uint16_t, uint32_t, std::byte* buffer) override {
    node_.control_abandoned(buffer);
  }

 private:
  ServerNode& node_;
  uint32_t port_;
  std::vector<uint16_t> ranks_;  // peer index -> rank
};

ServerNode::ServerNode(std::vector<net::Interface*> ports, std::vector<JobWorker> workers,
                       const ServerNodeConfig& config, transport::Tick now)
    : config_(config) {
  if (config.job_shards.empty() || config.server_index >= config.job_shards.size()) {
    throw std::invalid_argument("server: server_index " + std::to_string(config.server_index) +
                                " is not among the job's " +
                                std::to_string(config.job_shards.size()) + " server nodes");
  }
  for (size_t i = 0; i < config.job_shards.size(); ++i) {
    if (config.job_shards[i] == 0) {
      throw std::invalid_argument("server: server node " + std::to_string(i) + " has no shards");
    }
  }
  const uint32_t first = std::accumulate(config.job_shards.begin(),
                                         config.job_shards.begin() + config.server_index, 0u);
  total_shards_ = std::accumulate(config.job_shards.begin(), config.job_shards.end(), 0u);
  for (uint32_t i = 0; i < config.job_shards[config.server_index]; ++i) {
    own_shards_.push_back(first + i);
  }
  shard_slot_.assign(total_shards_, -1);
  open_ports(std::move(ports), workers, config, now);
  launch_cores();
}

ServerNode::ServerNode(const agg::Placement& placement, std::vector<WorkerLink> links,
                       const ServerNodeConfig& config, transport::Tick now)
    : config_(config), own_shards_(config.shard_ids), total_shards_(placement.shards()) {
  if (links.empty() || links.size() > agg::kMaxWorkers) {
    throw std::invalid_argument("server: 1.." + std::to_string(agg::kMaxWorkers) +
                                " worker links, got " + std::to_string(links.size()));
  }
  if (own_shards_.empty()) throw std::invalid_argument("server: no shards to run");
  check_levels(placement);
  shard_slot_.assign(total_shards_, -1);
  for (uint32_t id : own_shards_) {
    if (id >= total_shards_ || shard_slot_[id] >= 0) {
      throw std::invalid_argument("server: shard " + std::to_string(id) +
                                  " is out of range or listed twice (the placement has " +
                                  std::to_string(total_shards_) + ")");
    }
    shard_slot_[id] = 0;
  }
  shard_slot_.assign(total_shards_, -1);
  std::vector<net::Interface*> ports;
  std::vector<JobWorker> workers;
  for (size_t r = 0; r < links.size(); ++r) {
    ports.push_back(links[r].iface);
    workers.push_back(JobWorker{links[r].worker, static_cast<uint32_t>(r)});
  }
  open_ports(std::move(ports), workers, config, now);
  launch_cores();
  build_shards(placement);
  placement_ = &placement;
  for (size_t i = 0; i < cores_.size(); ++i) cores_[i]->attach(shards_[i].get());
  state_ = NodeState::kRunning;
}

void ServerNode::open_ports(std::vector<net::Interface*> ports,
                            const std::vector<JobWorker>& workers, const ServerNodeConfig& config,
                            transport::Tick now) {
  if (workers.empty() || workers.size() > agg::kMaxWorkers) {
    throw std::invalid_argument("server: 1.." + std::to_string(agg::kMaxWorkers) +
                                " workers, got " + std::to_string(workers.size()));
  }
  if (config.chunk_bytes == 0 || config.chunk_bytes % 4 != 0) {
    throw std::invalid_argument("server: chunk_bytes " + std::to_string(config.chunk_bytes) +
                                " is not a positive multiple of 4");
  }
  if (config.shard_lcores.size() > own_shards_.size()) {
    throw std::invalid_argument("server: " + std::to_string(config.shard_lcores.size()) +
                                " shard lcores for " + std::to_string(own_shards_.size()) +
                                " shards (one lcore runs one shard)");
  }
  rank_at_.resize(workers.size());
  rank_name_.resize(workers.size());
  declared_.resize(workers.size());
  for (size_t p = 0; p < ports.size(); ++p) {
    if (ports[p] == nullptr) {
      throw std::invalid_argument("server: port " + std::to_string(p) + " has no interface");
    }
    transport::EndpointConfig ec = config.endpoint;
    ec.peers.clear();
    std::vector<uint16_t> ranks;
    for (size_t r = 0; r < workers.size(); ++r) {
      if (workers[r].port != p) continue;
      rank_at_[r] = Address{static_cast<uint16_t>(p), static_cast<uint16_t>(ec.peers.size())};
      rank_name_[r] =
          workers[r].peer.name.empty() ? "rank " + std::to_string(r) : workers[r].peer.name;
      ranks.push_back(static_cast<uint16_t>(r));
      ec.peers.push_back(workers[r].peer);
    }
    if (ranks.empty()) {
      throw std::invalid_argument("server: no worker is reached through port " + std::to_string(p));
    }
    flow_.push_back(
        PortFlow{.port_id = ports[p]->port().id(), .workers = static_cast<uint32_t>(ranks.size())});
    receivers_.push_back(
        std::make_unique<PortReceiver>(*this, static_cast<uint32_t>(p), std::move(ranks)));
    endpoints_.push_back(std::make_unique<transport::Endpoint>(
        *ports[p], ec, transport::Receivers{receivers_.back().get(), receivers_.back().get()},
        now));
  }
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r].port >= ports.size()) {
      throw std::invalid_argument(
          "server: worker " + std::to_string(r) + " (" + workers[r].peer.name + ") is on port " +
          std::to_string(workers[r].port) + ", the node has " + std::to_string(ports.size()));
    }
  }
}

void ServerNode::launch_cores() {
  for (size_t i = 0; i < config_.shard_lcores.size(); ++i) {
    cores_.push_back(
        std::make_unique<ShardCore>(config_.shard_lcores[i], own_shards_[i], config_.shard_core));
  }
  stages_.resize(cores_.size());
}

void ServerNode::check_levels(const agg::Placement& placement) {
  for (const agg::Partition& p : placement.partitions()) {
    if (p.priority >= sched::kPriorityLevels) {
      // Updates go out at the partition's priority, which must be a scheduler
      // level: build the placement from worker::TensorTable::declarations().
      throw std::invalid_argument("server: partition " + std::to_string(p.key) + " has priority " +
                                  std::to_string(p.priority) + ", not a scheduler level (< " +
                                  std::to_string(sched::kPriorityLevels) + ")");
    }
  }
}

void ServerNode::build_shards(const agg::Placement& placement) {
  if (placement.shards() != total_shards_) {
    throw std::invalid_argument("server: the placement has " + std::to_string(placement.shards()) +
                                " shards, the job " + std::to_string(total_shards_));
  }
  std::vector<FanOut> fanout;
  for (const Address& a : rank_at_) fanout.push_back(FanOut{endpoints_[a.port].get(), a.peer});
  for (uint32_t id : own_shards_) {
    agg::ShardConfig sc;
    sc.shard = id;
    sc.workers = workers();
    sc.chunk_bytes = config_.chunk_bytes;
    sc.optimizer = config_.optimizer;
    sc.memory_limit_bytes = config_.shard_memory_limit;
    // max_held stays 0 (no cap beyond the structural one): the transport has
    // acknowledged a packet before the table sees it, so a kHoldLimit refusal
    // would lose the contribution for good (docs/agg.md).
    shard_slot_[id] = static_cast<int32_t>(shards_.size());
    shards_.push_back(
        std::make_unique<Shard>(placement, sc, agg::make_bsp(), fanout, config_.fanout_backlog));
  }
}

ServerNode::~ServerNode() {
  stop();
  // Shards hold mbufs of the endpoints' interfaces: they go first, then the
  // endpoints (which still reference the receivers and complete into outbox_).
  shards_.clear();
  endpoints_.clear();
}

void ServerNode::stop() {
  for (auto& c : cores_) c->stop();
  for (Stage& s : stages_) {
    for (uint32_t i = 0; i < s.count; ++i) releases_.free_st(s.items[i].mbuf);
    s.count = 0;
  }
  if (state_ == NodeState::kRunning && !cores_.empty()) {
    // The shard cores are gone: nothing may be queued to them any more.
    state_ = NodeState::kStopped;
  }
}

// ---- flow control (docs/server.md) ---------------------------------------

void ServerNode::derive_flow_limit(PortFlow& f, const rte_mbuf* mbuf) {
  // The pool the port's packets arrive in (the port's own for a NIC,
  // net_af_packet or net_memif; the sender's for net_ring), less what the
  // rest of the path may have out of it at once: per port using the pool,
  // its RX and TX descriptor rings when the PMD says (a NIC's RX ring holds
  // its mbufs) and its Interface's TX stage and spares; then four RX bursts
  // and every lcore's mempool cache (mbufs freed on a shard core wait
  // there). Ports whose packets come from one pool share what is left
  // equally. A config value (ServerNodeConfig::flow_limit) is kept as is.
  f.pool = mbuf->pool;
  if (config_.flow_limit != 0) {
    f.limit = config_.flow_limit;
    return;
  }
  uint64_t headroom = 4 * uint64_t{net::Interface::kBurst} +
                      uint64_t{f.pool->cache_size} * 3 / 2 * rte_lcore_count();
  uint64_t sharing = 0;
  for (const PortFlow& q : flow_) {
    if (q.pool != f.pool) continue;
    ++sharing;
    headroom += net::Interface::kStage + net::Interface::kBurst;
    rte_eth_rxq_info rxq{};
    if (rte_eth_rx_queue_info_get(q.port_id, 0, &rxq) == 0) headroom += rxq.nb_desc;
    rte_eth_txq_info txq{};
    if (rte_eth_tx_queue_info_get(q.port_id, 0, &txq) == 0) headroom += txq.nb_desc;
  }
  const uint64_t usable = f.pool->size > headroom ? f.pool->size - headroom : 0;
  // Packets that join a started set are admitted over the limit (refusing
  // them can deadlock, see admit_st): each set started under the limit may
  // still take one packet from each other worker behind the port, up to
  // N - 1 in all. Dividing by that depth keeps starts plus joins within the
  // pool. One worker per port: depth 1, the whole share.
  for (PortFlow& q : flow_) {
    if (q.pool != f.pool) continue;
    const uint64_t depth =
        std::max<uint64_t>(1, std::min<uint64_t>(q.workers, workers() > 1 ? workers() - 1 : 1));
    q.limit = std::max<uint64_t>(1, usable / sharing / depth);
  }
}

uint64_t ServerNode::aggregation_mbufs_st(uint32_t port) const {
  const PortFlow& f = flow_[port];
  uint64_t freed = releases_.freed(f.port_id);
  for (const auto& sh : shards_) freed += sh->releases().freed(f.port_id);
  // A stale read of a shard's count shows fewer frees, never more.
  return f.handed > freed ? f.handed - freed : 0;
}

bool ServerNode::admit_st(uint32_t port, uint16_t rank, const wire::HeaderFields& h) {
  // Only gradients stay in the aggregation path; everything else is judged
  // by on_packet_st (init packets are copied and freed at once).
  if (state_ != NodeState::kRunning || h.type != wire::PacketType::kData) return true;
  const PortFlow& f = flow_[port];
  if (f.limit == 0 || aggregation_mbufs_st(port) < f.limit) return true;
  if (h.tensor_key >= placement_->partitions().size()) return true;
  const int32_t slot = shard_slot_[placement_->at(h.tensor_key).shard];
  if (slot < 0) return true;
  // Over the limit, a packet is admitted only if it joins a set other ranks
  // have started: with two workers it completes it, and in general refusing
  // it could leave every rank waiting for the others. Read on this core
  // while a shard core owns the table, the bitmap may be stale, but only
  // towards fewer of the other ranks (their bits clear when the set
  // completes, which needs this rank's contribution; and the clearing of
  // the previous set happened before its update was sent through this
  // core's endpoint, whose ingress ordered it before this read). So a stale
  // read can only refuse a packet, which its worker resends.
  const uint64_t others =
      shards_[slot]->table().held_ranks(h.tensor_key, h.offset) & ~(uint64_t{1} << rank);
  return others != 0;
}

bool ServerNode::on_packet_st(uint32_t port, uint16_t rank, const wire::HeaderFields& h,
                              std::span<const std::byte> payload, rte_mbuf* mbuf) {
  if (state_ != NodeState::kRunning) {
    count(ServerDrop::kNotRunning);
    return false;
  }
  const bool init = h.type == wire::PacketType::kInit;
  if (!init && h.type != wire::PacketType::kData) {
    count(ServerDrop::kBadType);
    return false;
  }
  if (init && rank != 0) {
    count(ServerDrop::kInitNotRank0);
    return false;
  }
  if (h.tensor_key >= placement_->partitions().size()) {
    count(ServerDrop::kNotOurs);
    return false;
  }
  const int32_t slot = shard_slot_[placement_->at(h.tensor_key).shard];
  if (slot < 0) {
    count(ServerDrop::kNotOurs);
    return false;
  }
  PortFlow& flow = flow_[port];
  if (flow.pool == nullptr) derive_flow_limit(flow, mbuf);
  // Counted under the receiving port (net_ring leaves mbuf->port unset).
  mbuf->port = flow.port_id;
  if (static_cast<size_t>(slot) >= cores_.size()) {  // this shard runs inline
    Shard& shard = *shards_[slot];
    if (init) {
      shard.initialize_st(h.tensor_key, h.offset, payload);
      return false;  // copied
    }
    // Counted before the call: a completed set releases its mbufs inside it.
    ++flow.handed;
    if (shard.contribute_st(rank, h, payload, mbuf)) return true;
    --flow.handed;
    return false;
  }
  ++flow.handed;
  Stage& stage = stages_[slot];
  ShardItem& it = stage.items[stage.count++];
  it.mbuf = mbuf;
  it.key = h.tensor_key;
  it.offset = h.offset;
  it.iteration = h.iteration;
  it.payload_at =
      static_cast<uint16_t>(payload.data() - static_cast<const std::byte*>(mbuf->buf_addr));
  it.payload_len = static_cast<uint16_t>(payload.size());
  it.rank = rank;
  it.init = init ? 1 : 0;
  if (stage.count == stage.items.size()) flush_st(static_cast<uint32_t>(slot));
  return true;
}

void ServerNode::flush_st(uint32_t slot) {
  Stage& stage = stages_[slot];
  if (stage.count == 0) return;
  const uint32_t n = cores_[slot]->enqueue_st(stage.items.data(), stage.count);
  for (uint32_t i = n; i < stage.count; ++i) {
    // Already acknowledged: this contribution is lost, and its chunk's set
    // will not complete. Only an undersized ring gets here.
    releases_.free_st(stage.items[i].mbuf);
    count(ServerDrop::kShardRingFull);
  }
  stage.count = 0;
}

uint32_t ServerNode::poll_st(transport::Tick now) {
  uint32_t work = 0;
  // Inline shards' slices an endpoint refused, oldest first.
  for (size_t i = cores_.size(); i < shards_.size(); ++i) {
    if (shards_[i]->fanout_pending()) work += shards_[i]->retry_fanout_st();
  }
  for (auto& e : endpoints_) {
    work += e->poll_st(now);
    for (uint32_t s = 0; s < stages_.size(); ++s) flush_st(s);
  }
  if (state_ == NodeState::kRunning && (++passes_ & (kLivenessEvery - 1)) == 0) {
    check_liveness_st();
  }
  return work;
}

void ServerNode::check_liveness_st() {
  for (uint32_t rank = 0; rank < workers(); ++rank) {
    const Address a = rank_at_[rank];
    if (!endpoints_[a.port]->peer_stats_st(a.peer).dead) continue;
    // Under BSP every other rank waits for this one's gradients: end the job
    // for all of them, with the reason, rather than let them wait for ever
    // (control path: allocates, once).
    ++control_.workers_lost;
    refuse_job("worker " + rank_name_[rank] + " (rank " + std::to_string(rank) +
                   ") stopped answering and its transport gave up on it (network.peer_timeout_ms): "
                   "the job cannot continue without its gradients",
               false);
    return;
  }
}

namespace {
void add(ServerCounters& c, const ShardCounters& s, const agg::ChunkTableCounters& t,
         uint64_t held) {
  c.shards.contributions += s.contributions;
  c.shards.refused += s.refused;
  c.shards.initialized += s.initialized;
  c.shards.init_refused += s.init_refused;
  c.shards.updates += s.updates;
  c.shards.fanout_refused += s.fanout_refused;
  c.shards.fanout_retried += s.fanout_retried;
  c.shards.fanout_lost += s.fanout_lost;
  for (size_t i = 0; i < c.outcomes.size(); ++i) c.outcomes[i] += t.outcomes[i];
  c.held += held;
}
}  // namespace

ServerCounters ServerNode::counters_st() const {
  ServerCounters c;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (i >= cores_.size()) {
      add(c, shards_[i]->counters(), shards_[i]->table().counters(), shards_[i]->table().held());
    } else {
      const ShardStats s = cores_[i]->stats();
      add(c, s.shard, s.table, s.held);
    }
  }
  c.drops = drops_;
  c.control = control_;
  for (uint32_t p = 0; p < flow_.size(); ++p) c.aggregation_mbufs += aggregation_mbufs_st(p);
  for (const auto& e : endpoints_) c.net += e->counters_st();
  return c;
}

const Shard* ServerNode::shard(uint32_t global_id) const {
  if (global_id >= shard_slot_.size() || shard_slot_[global_id] < 0) return nullptr;
  return shards_[shard_slot_[global_id]].get();
}

int ServerNode::shard_lcore(uint32_t global_id) const {
  if (global_id >= shard_slot_.size() || shard_slot_[global_id] < 0 ||
      static_cast<size_t>(shard_slot_[global_id]) >= cores_.size()) {
    return -1;
  }
  return static_cast<int>(cores_[shard_slot_[global_id]]->lcore());
}

// ---- control plane --------------------------------------------------------

std::byte* ServerNode::control_begin(uint16_t, const wire::HeaderFields& h) {
  if (h.msg_len > config_.max_control_bytes) {
    count(ServerDrop::kControlTooBig);
    return nullptr;
  }
  auto buffer = std::make_unique<std::byte[]>(h.msg_len == 0 ? 1 : h.msg_len);
  std::byte* p = buffer.get();
  inbox_.emplace(p, std::move(buffer));
  return p;
}

void ServerNode::control_abandoned(std::byte* buffer) { inbox_.erase(buffer); }

void ServerNode::control_complete(uint16_t rank, std::byte* buffer, uint32_t len) {
  auto it = inbox_.find(buffer);
  if (it == inbox_.end()) return;
  const std::unique_ptr<std::byte[]> owned = std::move(it->second);
  inbox_.erase(it);
  agg::ControlMessage m;
  try {
    m = agg::decode_control({owned.get(), len});
  } catch (const std::invalid_argument&) {
    count(ServerDrop::kBadControl);
    return;
  }
  switch (m.kind) {
    case agg::ControlKind::kDeclare:
      on_declare(rank, m);
      break;
    case agg::ControlKind::kBarrier:
      on_barrier(rank, m);
      break;
    default:
      count(ServerDrop::kBadControl);  // kReady, kRefused, kBarrierDone go to workers
      break;
  }
}

bool ServerNode::sender_is(uint16_t rank, uint32_t claimed, const char* what) {
  if (claimed == rank) return true;
  count(ServerDrop::kWrongRank);
  const uint32_t n = workers();
  std::string text = "server: " + rank_name_[rank] + " is rank " + std::to_string(rank) +
                     " in the job file, but its " + what + " says rank " + std::to_string(claimed);
  if (claimed >= n) {
    text += ", which is not in this job (" + std::to_string(n) + " workers: ranks 0.." +
            std::to_string(n - 1) + ")";
  }
  agg::ControlMessage r;
  r.kind = agg::ControlKind::kRefused;
  r.text = std::move(text);
  reply(rank, r);
  return false;
}

void ServerNode::on_declare(uint16_t rank, agg::ControlMessage& m) {
  ++control_.declares;
  if (!sender_is(rank, m.rank, "declare")) {
    ++control_.declares_refused;
    return;
  }
  if (declared_[rank].has_value()) ++control_.declares_repeated;
  switch (state_) {
    case NodeState::kStopped:
      return;
    case NodeState::kRefused: {
      ++control_.declares_refused;
      agg::ControlMessage r;
      r.kind = agg::ControlKind::kRefused;
      r.text = refusal_;
      reply(rank, r);
      return;
    }
    case NodeState::kRunning: {
      // A repeat (the worker restarted its control exchange): the same list
      // is answered again; another list cannot join a running job.
      const std::string diff =
          job_tensors_ ? agg::first_difference(*job_tensors_, m.tensors) : std::string();
      if (!diff.empty()) {
        ++control_.declares_refused;
        agg::ControlMessage r;
        r.kind = agg::ControlKind::kRefused;
        r.text = "server: rank " + std::to_string(rank) +
                 " declared a different tensor list after the job started (the job's vs its "
                 "new one): " +
                 diff;
        reply(rank, r);
        return;
      }
      reply_ready(rank);
      return;
    }
    case NodeState::kWaiting:
      // The latest list from a rank counts (a worker restarted before the
      // job started may have changed it); the answer comes when all are in.
      declared_[rank] = std::move(m.tensors);
      for (const auto& d : declared_) {
        if (!d.has_value()) return;
      }
      start_job();
      return;
  }
}

void ServerNode::start_job() {
  for (uint32_t r = 1; r < workers(); ++r) {
    const std::string diff = agg::first_difference(*declared_[0], *declared_[r]);
    if (!diff.empty()) {
      refuse_job("server: rank " + std::to_string(r) +
                 "'s tensor list differs from rank 0's (rank 0's vs rank " + std::to_string(r) +
                 "'s): " + diff);
      return;
    }
  }
  try {
    owned_placement_.emplace(agg::Placement::compute(*declared_[0], total_shards_));
    check_levels(*owned_placement_);
    build_shards(*owned_placement_);
  } catch (const std::exception& e) {
    shards_.clear();
    shard_slot_.assign(total_shards_, -1);
    owned_placement_.reset();
    refuse_job(std::string("server: cannot start the job: ") + e.what());
    return;
  }
  placement_ = &*owned_placement_;
  job_tensors_ = *declared_[0];
  for (size_t i = 0; i < cores_.size(); ++i) cores_[i]->attach(shards_[i].get());
  state_ = NodeState::kRunning;
  for (uint32_t r = 0; r < workers(); ++r) reply_ready(static_cast<uint16_t>(r));
}

void ServerNode::refuse_job(std::string why, bool answering_declares) {
  state_ = NodeState::kRefused;
  refusal_ = std::move(why);
  agg::ControlMessage r;
  r.kind = agg::ControlKind::kRefused;
  r.text = refusal_;
  for (uint32_t rank = 0; rank < workers(); ++rank) {
    if (answering_declares) ++control_.declares_refused;
    reply(static_cast<uint16_t>(rank), r);
  }
}

void ServerNode::on_barrier(uint16_t rank, const agg::ControlMessage& m) {
  ++control_.barriers;
  if (config_.server_index != 0) {
    count(ServerDrop::kBarrierNotHere);
    return;
  }
  if (!sender_is(rank, m.rank, "barrier")) return;
  agg::ControlMessage done;
  done.kind = agg::ControlKind::kBarrierDone;
  done.generation = m.generation;
  if (m.generation < barrier_floor_ || barrier_completed_.contains(m.generation)) {
    // Already complete: the rank asks again; it gets the answer again.
    ++control_.barriers_repeated;
    reply(rank, done);
    return;
  }
  uint64_t& arrived = barrier_arrived_[m.generation];
  const uint64_t bit = uint64_t{1} << rank;
  if ((arrived & bit) != 0) {
    ++control_.barriers_repeated;
    return;
  }
  arrived |= bit;
  if (static_cast<uint32_t>(std::popcount(arrived)) < workers()) return;
  barrier_arrived_.erase(m.generation);
  // Generations may complete out of order (a process's trainer threads can
  // be in two barriers at once): remember each, and fold the ones below the
  // first incomplete generation into the floor, so the set stays small.
  barrier_completed_.insert(m.generation);
  while (barrier_completed_.erase(barrier_floor_) != 0) ++barrier_floor_;
  ++control_.barriers_completed;
  for (uint32_t r = 0; r < workers(); ++r) reply(static_cast<uint16_t>(r), done);
}

void ServerNode::reply_ready(uint16_t rank) {
  agg::ControlMessage r;
  r.kind = agg::ControlKind::kReady;
  r.fingerprint = placement_->fingerprint();
  r.shards = total_shards_;
  reply(rank, r);
}

void ServerNode::reply(uint16_t rank, const agg::ControlMessage& m) {
  const uint64_t cookie = next_cookie_++;
  std::vector<std::byte>& bytes = outbox_[cookie] = agg::encode_control(m);
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kControl;
  meta.dtype = wire::Dtype::kBytes;
  const Address a = rank_at_[rank];
  const transport::SubmitStatus st =
      endpoints_[a.port]->send(a.peer, bytes.data(), static_cast<uint32_t>(bytes.size()), 0, meta,
                               transport::Completion{&ServerNode::on_reply_done, this, cookie});
  if (st != transport::SubmitStatus::kQueued) {
    outbox_.erase(cookie);
    count(ServerDrop::kReplyNotQueued);
    return;
  }
  ++control_.replies;
}

void ServerNode::on_reply_done(void* self, const transport::SendResult& r) {
  static_cast<ServerNode*>(self)->outbox_.erase(r.cookie);
}

}  // namespace mercury::server
