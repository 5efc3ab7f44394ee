#include "server/server_node.h"

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

namespace mercury::server {

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
  void on_peer_restarted(uint16_t peer) override { node_.on_worker_restarted_st(ranks_[peer]); }

 private:
  ServerNode& node_;
  uint32_t port_;
  std::vector<uint16_t> ranks_;  // peer index -> rank
};

ServerNode::ServerNode(std::vector<net::Interface*> ports, std::vector<JobWorker> workers,
                       const ServerNodeConfig& config, transport::Tick now)
    : config_(config), now_(now) {
  const job::ShardLayout& layout = config.layout;
  if (config.server_index >= layout.servers()) {
    throw std::invalid_argument("server: server_index " + std::to_string(config.server_index) +
                                " is not among the job's " + std::to_string(layout.servers()) +
                                " server nodes");
  }
  for (uint32_t i = 0; i < layout.servers(); ++i) {
    if (layout.count(i) == 0) {
      throw std::invalid_argument("server: server node " + std::to_string(i) + " has no shards");
    }
  }
  total_shards_ = layout.total;
  for (uint32_t i = 0; i < layout.count(config.server_index); ++i) {
    own_shards_.push_back(layout.first[config.server_index] + i);
  }
  shard_slot_.assign(total_shards_, -1);
  check_config(static_cast<uint32_t>(workers.size()));
  open_ports(std::move(ports), workers, now);
  control_.emplace(
      rank_name_, total_shards_, config.server_index == 0,
      [this](const agg::Placement& p) { return start_shards(p); }, now, config.placement);
  launch_cores();
}

void ServerNode::check_config(uint32_t workers) const {
  if (workers == 0 || workers > agg::kMaxWorkers) {
    throw std::invalid_argument("server: 1.." + std::to_string(agg::kMaxWorkers) +
                                " workers, got " + std::to_string(workers));
  }
  if (config_.chunk_bytes == 0 || config_.chunk_bytes % 4 != 0) {
    throw std::invalid_argument("server: chunk_bytes " + std::to_string(config_.chunk_bytes) +
                                " is not a positive multiple of 4");
  }
  if (config_.shard_lcores.size() > own_shards_.size()) {
    throw std::invalid_argument("server: " + std::to_string(config_.shard_lcores.size()) +
                                " shard lcores for " + std::to_string(own_shards_.size()) +
                                " shards (one lcore runs one shard)");
  }
  const std::unique_ptr<agg::SyncPolicy> policy =
      config_.sync_policy ? config_.sync_policy() : nullptr;
  if (!policy) throw std::invalid_argument("server: no sync policy");
  if (!fanout_fits(config_.fanout, *policy)) {
    // Fan-out from the table's memory needs every rank in each update
    // (bsp); a quorum of 1 needs the asynchronous rules' snapshots.
    throw std::invalid_argument("server: training.sync " + std::string(policy->name()) +
                                " does not match the fan-out rule");
  }
}

void ServerNode::open_ports(std::vector<net::Interface*> ports,
                            const std::vector<JobWorker>& workers, transport::Tick now) {
  rank_at_.resize(workers.size());
  rank_name_.resize(workers.size());
  for (size_t p = 0; p < ports.size(); ++p) {
    if (ports[p] == nullptr) {
      throw std::invalid_argument("server: port " + std::to_string(p) + " has no interface");
    }
    transport::EndpointConfig ec = config_.endpoint;
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
    PortLeave leave;
    for (uint16_t r : ranks) leave.ranks |= uint64_t{1} << r;
    leave.memif = ports[p]->port().driver() == "net_memif";
    leaves_.push_back(leave);
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
  ifaces_ = std::move(ports);
}

void ServerNode::launch_cores() {
  for (size_t i = 0; i < config_.shard_lcores.size(); ++i) {
    cores_.push_back(
        std::make_unique<ShardCore>(config_.shard_lcores[i], own_shards_[i], config_.shard_core));
  }
  stages_.resize(cores_.size());
}

void ServerNode::check_levels(const agg::Placement& placement) {
  for (const agg::Block& p : placement.blocks()) {
    if (p.priority >= sched::kPriorityLevels) {
      // Updates go out at the block's priority, which must be a scheduler
      // level: build the placement from worker::TensorTable::declarations().
      throw std::invalid_argument("server: block " + std::to_string(p.key) + " has priority " +
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
    // Flow control copies what a port over its limit would hold (docs/server.md).
    sc.staging_chunks = config_.staging_chunks;
    // max_held stays 0 (no cap beyond the structural one): the transport has
    // acknowledged a packet before the table sees it, so a kHoldLimit refusal
    // would lose the contribution for good (docs/agg.md).
    shard_slot_[id] = static_cast<int32_t>(shards_.size());
    shards_.push_back(std::make_unique<Shard>(
        placement, sc, config_.sync_policy(), fanout, config_.fanout_backlog, config_.fanout,
        config_.snapshots, config_.unit_chunks, config_.staleness_bound));
    started_.push_back(&shards_.back()->started());
  }
}

// The control plane's Starter: called when every rank declared the same list.
std::string ServerNode::start_shards(const agg::Placement& placement) {
  try {
    check_levels(placement);
    build_shards(placement);
  } catch (const std::exception& e) {
    started_.clear();
    shards_.clear();
    shard_slot_.assign(total_shards_, -1);
    return e.what();
  }
  for (size_t i = 0; i < cores_.size(); ++i) cores_[i]->attach(shards_[i].get());
  return {};
}

ServerNode::~ServerNode() {
  stop();
  // Shards hold mbufs of the endpoints' interfaces: they go first, then the
  // endpoints (which still reference the receivers and complete into outbox_).
  started_.clear();
  shards_.clear();
  endpoints_.clear();
}

void ServerNode::stop() {
  for (auto& c : cores_) c->stop();
  for (Stage& s : stages_) {
    for (uint32_t i = 0; i < s.count; ++i) releases_.free_st(s.items[i].mbuf);
    s.count = 0;
  }
  // The shard cores are gone: nothing may be queued to them any more.
  if (!cores_.empty()) {
    control_->on_stopped_st(now_);
    sync_state();
  }
}

void ServerNode::sync_state() {
  running_ = control_->state() == NodeState::kRunning;
  if (running_ && !link_schedule_started_) {
    // The job has started: link.rate_steps count from here, on every port.
    link_schedule_started_ = true;
    for (net::Interface* i : ifaces_) i->start_link_schedule_st(now_);
  }
  any_left_ = control_->left() != 0;
  placement_ = control_->placement();
  if (any_left_) {
    for (PortLeave& l : leaves_) {
      if (l.memif && l.state == PortLeave::kPolled && !l.attached_again &&
          (control_->left() & l.ranks) == l.ranks) {
        l.state = PortLeave::kLeaving;
        l.since = now_;
        detach_pending_ = true;
      }
    }
  }
}

void ServerNode::detach_left_ports_st() {
  // A memif port whose every worker left is detached once the answers to
  // their leaves are out of the interface (every ACK owed sent, the stage
  // and the link emulator empty), or kDetachWaitMs after the last leave
  // whatever else is queued: its workers' processes close the link soon
  // after (docs/server.md, "The end of a job").
  const transport::Tick wait = config_.endpoint.transport.tsc_hz / 1000 * kDetachWaitMs;
  detach_pending_ = false;
  for (uint32_t p = 0; p < leaves_.size(); ++p) {
    PortLeave& l = leaves_[p];
    if (l.state != PortLeave::kLeaving) continue;
    if ((endpoints_[p]->owes_acks_st() || ifaces_[p]->tx_pending() != 0) && now_ - l.since < wait) {
      detach_pending_ = true;
      continue;
    }
    ifaces_[p]->set_detached_st(true);
    l.state = PortLeave::kDetached;
    l.saw_down = false;
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
  const bool staging = std::any_of(shards_.begin(), shards_.end(), [](const auto& sh) {
    return sh->table().staging_chunks() != 0;
  });
  if (config_.flow_limit != 0) {
    f.limit = config_.flow_limit;
    f.copies = staging ? net::Interface::kBurst : 0;
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
  // pool. One worker per port: depth 1, the whole share. So does a node
  // whose shards can stage every set: over the limit it copies every packet
  // a set would hold, and none joins as an mbuf.
  const bool staged = std::all_of(shards_.begin(), shards_.end(),
                                  [](const auto& sh) { return sh->stages_every_set(); });
  // Marked copies wait in a shard core's ring until it copies them: a
  // quarter of the share is kept for them (inline shards free them at once).
  const uint64_t share = usable / sharing;
  const uint64_t copies = !staging ? 0 : cores_.empty() ? net::Interface::kBurst : share / 4;
  for (PortFlow& q : flow_) {
    if (q.pool != f.pool) continue;
    const uint64_t depth =
        staged ? 1
               : std::max<uint64_t>(
                     1, std::min<uint64_t>(q.workers, workers() > 1 ? workers() - 1 : 1));
    q.limit = std::max<uint64_t>(1, (share - std::min(share, copies)) / depth);
    q.copies = copies;
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
  if (!running_ || h.type != wire::PacketType::kData) return true;
  const PortFlow& f = flow_[port];
  if (f.limit == 0) return true;
  const uint64_t owned = aggregation_mbufs_st(port);
  if (owned < f.limit) return true;
  if (h.block_key >= placement_->blocks().size()) return true;
  const int32_t slot = shard_slot_[placement_->at(h.block_key).shard];
  if (slot < 0) return true;
  // Over the limit, a packet is admitted if its shard can stage a copy
  // (on_packet_st marks it and takes the credit): its mbuf is freed once
  // copied. At most f.copies such mbufs wait for a shard core.
  if (owned < f.limit + f.copies && shards_[slot]->staging_room_st() > 0) return true;
  // Otherwise only if it joins a set other ranks have started: with two
  // workers it completes it, and in general refusing it could leave every
  // rank waiting for the others. The shard publishes which sets are started
  // (StartedSets: why a stale read can only refuse).
  return started_[slot]->others_started(h.block_key, h.offset, rank);
}

bool ServerNode::on_packet_st(uint32_t port, uint16_t rank, const wire::HeaderFields& h,
                              std::span<const std::byte> payload, rte_mbuf* mbuf) {
  if (!running_) {
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
  if (any_left_ && config_.fanout == Fanout::kEvery) {
    // BSP: a rank left after its last round, so this gradient's set can
    // never be complete. The slow path ends the job for every rank. (The
    // asynchronous modes apply it: they need no one else.)
    if (push_after_leave_ == 0) push_after_leave_ = uint32_t{rank} + 1;
    count(ServerDrop::kAfterLeave);
    return false;
  }
  if (h.block_key >= placement_->blocks().size()) {
    count(ServerDrop::kNotOurs);
    return false;
  }
  const int32_t slot = shard_slot_[placement_->at(h.block_key).shard];
  if (slot < 0) {
    count(ServerDrop::kNotOurs);
    return false;
  }
  PortFlow& flow = flow_[port];
  if (flow.pool == nullptr) derive_flow_limit(flow, mbuf);
  // Counted under the receiving port (net_ring leaves mbuf->port unset).
  mbuf->port = flow.port_id;
  Shard& shard = *shards_[slot];
  // Over the limit, a gradient the shard has a staging credit for is marked
  // to be copied rather than held (admit_st let it in on that credit, or as
  // a join; the room can only have grown since).
  bool copy = false;
  if (!init && flow.limit != 0) {
    const uint64_t owned = aggregation_mbufs_st(port);
    copy = owned >= flow.limit && owned < flow.limit + flow.copies && shard.staging_room_st() > 0;
  }
  if (copy) shard.reserve_staging_st();
  if (static_cast<size_t>(slot) >= cores_.size()) {  // this shard runs inline
    if (init) {
      shard.initialize_st(h.block_key, h.offset, payload);
      return false;  // copied
    }
    // Counted before the call: a completed set releases its mbufs inside it.
    ++flow.handed;
    if (shard.contribute_st(rank, h, payload, mbuf, copy)) return true;
    --flow.handed;
    return false;
  }
  ++flow.handed;
  Stage& stage = stages_[slot];
  ShardItem& it = stage.items[stage.count++];
  it.mbuf = mbuf;
  it.key = h.block_key;
  it.offset = h.offset;
  it.iteration = h.iteration;
  it.clock = h.param_version;
  it.payload_at =
      static_cast<uint16_t>(payload.data() - static_cast<const std::byte*>(mbuf->buf_addr));
  it.payload_len = static_cast<uint16_t>(payload.size());
  it.rank = rank;
  it.init = init ? 1 : 0;
  it.copy = copy ? 1 : 0;
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
    if (stage.items[i].copy != 0) shards_[slot]->unreserve_staging_st();
    count(ServerDrop::kShardRingFull);
  }
  stage.count = 0;
}

uint32_t ServerNode::poll_st(transport::Tick now) {
  now_ = now;
  uint32_t work = 0;
  // Inline shards' slices an endpoint refused, oldest first.
  for (size_t i = cores_.size(); i < shards_.size(); ++i) {
    if (shards_[i]->fanout_pending()) work += shards_[i]->retry_fanout_st();
  }
  uint64_t marks = 0;  // marked copies queued to shard cores, not yet taken
  for (size_t i = 0; i < cores_.size() && i < shards_.size(); ++i) {
    marks += shards_[i]->marks_in_flight_st();
  }
  for (uint32_t p = 0; p < endpoints_.size(); ++p) {
    // A port whose copy budget a burst could exceed while its copies wait
    // for a shard core leaves its packets in its RX queue for this pass
    // rather than have them refused (they drain: a shard core always takes
    // its ring). Held mbufs alone never pause a port: completing packets
    // must get in.
    const PortFlow& f = flow_[p];
    const bool receive = marks == 0 || f.limit == 0 ||
                         aggregation_mbufs_st(p) + net::Interface::kBurst < f.limit + f.copies;
    work += endpoints_[p]->poll_st(now, receive);
    for (uint32_t s = 0; s < stages_.size(); ++s) flush_st(s);
  }
  if (restarted_ != 0) handle_restarts_st();
  if (detach_pending_) detach_left_ports_st();
  if (push_after_leave_ != 0 && running_) {
    control_->on_push_after_leave_st(static_cast<uint16_t>(push_after_leave_ - 1), now_);
    push_after_leave_ = 0;
    sync_state();
    send_replies();
  }
  if (running_ && (++passes_ & (kLivenessEvery - 1)) == 0) {
    check_liveness_st();
    if (running_ && now >= heartbeat_at_) send_heartbeats_st();
  }
  return work;
}

void ServerNode::handle_restarts_st() {
  // Lowest rank first; each one's answers are queued before the next.
  while (restarted_ != 0) {
    const auto rank = static_cast<uint16_t>(std::countr_zero(restarted_));
    restarted_ &= restarted_ - 1;
    control_->on_worker_restarted_st(rank, now_);
  }
  sync_state();
  send_replies();
}

void ServerNode::send_heartbeats_st() {
  heartbeat_at_ = now_ + transport::keepalive_interval(config_.endpoint.transport);
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kHeartbeat;
  for (uint32_t rank = 0; rank < workers(); ++rank) {
    // A rank that left stops polling once its leave is acknowledged: nothing
    // more is sent to it, so nothing waits for its acknowledgement.
    if (!control_->has_left(rank)) send_control_st(rank, m);
  }
}

void ServerNode::check_liveness_st() {
  for (uint32_t rank = 0; rank < workers(); ++rank) {
    const Address a = rank_at_[rank];
    if (control_->has_left(rank)) continue;  // it left: it owes nothing more
    if (!endpoints_[a.port]->peer_stats_st(a.peer).dead) continue;
    // Under BSP every other rank waits for this one's gradients: the
    // control plane ends the job for all of them, with the reason.
    control_->on_worker_lost_st(static_cast<uint16_t>(rank), now_);
    sync_state();
    send_replies();
    return;
  }
}

ServerCounters ServerNode::counters_st() const {
  ServerCounters c;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (i >= cores_.size()) {
      c.shards += shards_[i]->counters();
      c.table += shards_[i]->table().counters();
      c.held += shards_[i]->table().held();
    } else {
      const ShardStats s = cores_[i]->stats();
      c.shards += s.shard;
      c.table += s.table;
      c.held += s.held;
    }
  }
  c.drops = drops_;
  c.control = control_->counters();
  for (uint32_t p = 0; p < flow_.size(); ++p) c.aggregation_mbufs += aggregation_mbufs_st(p);
  for (const auto& e : endpoints_) c.net += e->counters_st();
  for (const net::Interface* i : ifaces_) {
    base::add_array(c.port_drops, i->counters().drops);
    c.pmd_drops += i->pmd_drops();
  }
  return c;
}

void ServerNode::refresh_port_stats_st() {
  for (net::Interface* i : ifaces_) i->refresh_port_stats_st();
  // A detached port is attached again when a new peer has connected: its
  // link went down (the workers that left closed it) and is up again.
  for (uint32_t p = 0; p < leaves_.size(); ++p) {
    PortLeave& l = leaves_[p];
    if (l.state != PortLeave::kDetached) continue;
    if (ifaces_[p]->link_up() == 0) {
      l.saw_down = true;
    } else if (l.saw_down) {
      ifaces_[p]->set_detached_st(false);
      l.state = PortLeave::kPolled;
      // Its ranks left for good (a job cannot take one back): whoever came
      // is refused, and the port stays attached from now on.
      l.attached_again = true;
    }
  }
}

transport::PeerCounters ServerNode::peer_totals_st() const {
  transport::PeerCounters t;
  for (const auto& e : endpoints_) {
    for (uint16_t p = 0; p < e->num_peers(); ++p) t += e->peer_stats_st(p).transport;
  }
  return t;
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

// ---- control messages -----------------------------------------------------

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
  // A restart the endpoint saw before this message (perhaps on its very
  // packet) comes first: the message may be the new incarnation's declare.
  if (restarted_ != 0) handle_restarts_st();
  // What arrived is acknowledged before the message is handled, in order
  // with the packets around it: the job's start builds the shards on this
  // core for a few hundred milliseconds, and the workers would resend
  // declarations whose ACK waited for the ACK delay meanwhile.
  for (auto& e : endpoints_) e->flush_acks_st(now_);
  agg::ControlMessage m;
  try {
    m = agg::decode_control({owned.get(), len});
  } catch (const std::invalid_argument&) {
    count(ServerDrop::kBadControl);
    return;
  }
  switch (control_->on_message_st(rank, std::move(m), now_)) {
    case ControlVerdict::kTaken:
      break;
    case ControlVerdict::kWrongRank:
      count(ServerDrop::kWrongRank);
      break;
    case ControlVerdict::kBarrierNotHere:
      count(ServerDrop::kBarrierNotHere);
      break;
    case ControlVerdict::kBadControl:
      count(ServerDrop::kBadControl);
      break;
  }
  sync_state();
  send_replies();
}

void ServerNode::send_replies() {
  for (const ControlReply& r : control_->take_replies_st()) send_control_st(r.rank, r.message);
}

void ServerNode::send_control_st(uint32_t rank, const agg::ControlMessage& m) {
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
  }
}

void ServerNode::on_reply_done(void* self, const transport::SendResult& r) {
  static_cast<ServerNode*>(self)->outbox_.erase(r.cookie);
}

}  // namespace mercury::server
