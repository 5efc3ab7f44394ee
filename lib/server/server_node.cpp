#include "server/server_node.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "server/flow_control.h"

namespace mercury::server {

// One port's receiver: the workers behind it, by transport peer index (the
// control plane's peer of each: a rank, a spare, or a standby's partner).
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
    return node_.on_packet_st(port_, ranks_[peer], h, payload, buf);
  }
  std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) override {
    return node_.control_channel_->begin_st(ranks_[peer], h);
  }
  void on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte*) override {
    // A restart the endpoint saw before this message (perhaps on its very
    // packet) comes first: the message may be the new incarnation's declare.
    if (node_.restarted_ != 0) node_.handle_restarts_st();
    node_.control_channel_->complete_st(ranks_[peer], h);
  }
  void on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte*) override {
    node_.control_channel_->abandon_st(ranks_[peer], msg_id);
  }
  void on_peer_restarted(uint16_t peer) override { node_.on_worker_restarted_st(ranks_[peer]); }

 private:
  ServerNode& node_;
  uint32_t port_;
  std::vector<uint16_t> ranks_;  // peer index -> rank
};

// The node's pollers on its net core's loop (attach()).
class ServerNode::ShardsPoller final : public node::Poller {
 public:
  explicit ShardsPoller(ServerNode& n) : node_(n) {}
  uint32_t poll_st(node::Tick) override { return node_.poll_shards_st(); }

 private:
  ServerNode& node_;
};

class ServerNode::PortPoller final : public node::Poller {
 public:
  PortPoller(ServerNode& n, uint32_t port) : node_(n), port_(port) {}
  uint32_t poll_st(node::Tick now) override { return node_.poll_port_st(port_, now); }
  // Frames staged or in the link emulator's delay line are due at a time
  // of their own: the loop's sleeps stay short while any are.
  bool may_sleep_long_st() override { return node_.ports_[port_]->tx_pending() == 0; }

 private:
  ServerNode& node_;
  uint32_t port_;
};

class ServerNode::ControlPoller final : public node::Poller {
 public:
  ControlPoller(ServerNode& n, node::Tick slow_period) : node_(n), slow_period_(slow_period) {}
  uint32_t poll_st(node::Tick now) override { return node_.poll_control_st(now); }
  [[nodiscard]] node::Tick slow_period() const override { return slow_period_; }
  void slow_st(node::Tick now) override { node_.slow_st(now); }

 private:
  ServerNode& node_;
  node::Tick slow_period_;
};

ServerNode::ServerNode(std::vector<net::PacketPort*> ports, std::vector<JobWorker> workers,
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
  std::vector<node::ControlPeer> peers;
  for (const Address& a : rank_at_) peers.push_back({endpoints_[a.port].get(), a.peer});
  for (const Address& a : spare_at_) peers.push_back({endpoints_[a.port].get(), a.peer});
  if (config.standby != Standby::kNone) {
    // The partner after the ranks: heartbeats both ways keep the liveness
    // of each in the other's view (docs/durability.md, "A hot standby").
    peers.push_back({endpoints_[0].get(), partner_peer_});
    partner_alive_ = true;
  }
  control_channel_.emplace(
      std::move(peers), static_cast<node::ControlChannel::Handler&>(*this),
      node::ControlChannel::Options{
          .max_bytes = config.max_control_bytes,
          .heartbeat_every = transport::keepalive_interval(config.endpoint.transport)});
  control_channel_->share_owner(owner_);
  control_.emplace(
      rank_name_, total_shards_, config.server_index == 0,
      [this](const agg::Placement& p) { return start_shards(p); }, now, config.placement,
      config.fanout != Fanout::kEvery, config.shrink);
  job_state_.emplace([this](uint32_t slot, ShardTask& t) { submit_task_st(slot, t); });
  if (config.checkpoints.enabled) {
    checkpoints_ = std::make_unique<CheckpointSources>();
    checkpoints_->plan.every_versions = config.checkpoints.every_versions;
  }
  if (!config.spares.empty()) {
    std::vector<std::string> names;
    for (const JobWorker& s : config.spares) names.push_back(s.peer.name);
    control_->add_spares(
        std::move(names),
        static_cast<transport::Tick>(config.spare_grace_s *
                                     static_cast<double>(config.endpoint.transport.tsc_hz)));
  }
  speaks_for_.resize(control_->peers());
  map_peers_st();
  if (config.resume) control_->resume_at(config.resume->version);
  if (config.wait_for_workers) {
    char limit[64];
    std::snprintf(limit, sizeof limit, "training.worker_wait_s %g s", config.worker_wait_s);
    control_->wait_for_lost(
        static_cast<transport::Tick>(config.worker_wait_s *
                                     static_cast<double>(config.endpoint.transport.tsc_hz)),
        limit);
  }
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
  if (config_.shrink && (config_.fanout != Fanout::kEvery || config_.unit_chunks != 0 ||
                         config_.standby != Standby::kNone)) {
    throw std::invalid_argument(
        "server: training.on_worker_loss shrink needs bsp with chunk aggregation and no standby");
  }
  if (config_.wait_for_workers &&
      (config_.fanout != Fanout::kEvery || config_.unit_chunks != 0 ||
       config_.standby != Standby::kNone || config_.layout.servers() != 1 || config_.shrink ||
       !(config_.worker_wait_s > 0))) {
    throw std::invalid_argument(
        "server: training.on_worker_loss wait needs bsp with chunk aggregation, no standby, one "
        "server node and a worker_wait_s > 0");
  }
  if (!config_.spares.empty() &&
      (config_.fanout == Fanout::kEvery || config_.standby != Standby::kNone ||
       workers + config_.spares.size() > agg::kMaxWorkers || !(config_.spare_grace_s >= 0))) {
    throw std::invalid_argument(
        "server: spare workers need an asynchronous sync mode (asp, ssp, psplus), no standby, at "
        "most " +
        std::to_string(agg::kMaxWorkers) + " workers with them and a spare_grace_s >= 0");
  }
  if (config_.standby != Standby::kNone) {
    if (!config_.shard_lcores.empty()) {
      throw std::invalid_argument(
          "server: a server with a standby and its standby run their shards inline (no shard "
          "lcores): the standby's acknowledgements arrive on the net core");
    }
    if (config_.fanout != Fanout::kEvery || config_.unit_chunks != 0) {
      throw std::invalid_argument(
          "server: a standby needs bsp with chunk aggregation (training.aggregation chunk)");
    }
  }
}

void ServerNode::open_ports(std::vector<net::PacketPort*> ports,
                            const std::vector<JobWorker>& workers, transport::Tick now) {
  rank_at_.resize(workers.size());
  rank_name_.resize(workers.size());
  spare_at_.resize(config_.spares.size());
  if (ports.empty()) throw std::invalid_argument("server: the node has no port");
  if (ports.size() > BufferReleases::kMaxPorts) {
    throw std::invalid_argument("server: " + std::to_string(ports.size()) + " ports, at most " +
                                std::to_string(BufferReleases::kMaxPorts));
  }
  for (size_t p = 0; p < ports.size(); ++p) {
    if (ports[p] == nullptr) {
      throw std::invalid_argument("server: port " + std::to_string(p) + " has no interface");
    }
    if (buffers_ == nullptr) buffers_ = &ports[p]->buffer_ops();
    if (&ports[p]->buffer_ops() != buffers_) {
      throw std::invalid_argument("server: port " + std::to_string(p) +
                                  " is of another kind than port 0 (their buffers differ)");
    }
    transport::EndpointConfig ec = config_.endpoint;
    ec.peers.clear();
    std::vector<uint16_t> ranks;  // the control plane's peer of each transport peer
    for (size_t r = 0; r < workers.size(); ++r) {
      if (workers[r].port != p) continue;
      rank_at_[r] = Address{static_cast<uint16_t>(p), static_cast<uint16_t>(ec.peers.size())};
      rank_name_[r] =
          workers[r].peer.name.empty() ? "rank " + std::to_string(r) : workers[r].peer.name;
      ranks.push_back(static_cast<uint16_t>(r));
      ec.peers.push_back(workers[r].peer);
    }
    PortLeave leave;
    for (uint16_t r : ranks) leave.ranks |= uint64_t{1} << r;
    for (size_t s = 0; s < config_.spares.size(); ++s) {
      if (config_.spares[s].port != p) continue;
      spare_at_[s] = Address{static_cast<uint16_t>(p), static_cast<uint16_t>(ec.peers.size())};
      ranks.push_back(static_cast<uint16_t>(workers.size() + s));
      ec.peers.push_back(config_.spares[s].peer);
    }
    if (ranks.empty()) {
      throw std::invalid_argument("server: no worker is reached through port " + std::to_string(p));
    }
    flow_.push_back(PortFlow{.workers = static_cast<uint32_t>(ranks.size()),
                             .queues = ports[p]->queue_facts()});
    leave.detaches = ports[p]->detach_when_peers_leave();
    leaves_.push_back(leave);
    if (p == 0 && config_.standby != Standby::kNone) {
      // The other node of a standby pair: a peer of port 0 after the
      // workers, numbered after the ranks.
      partner_peer_ = static_cast<uint16_t>(ec.peers.size());
      ec.peers.push_back(config_.partner);
      ranks.push_back(static_cast<uint16_t>(workers.size()));
    }
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
  for (const JobWorker& s : config_.spares) {
    if (s.port >= ports.size()) {
      throw std::invalid_argument("server: spare " + s.peer.name + " is on port " +
                                  std::to_string(s.port) + ", the node has " +
                                  std::to_string(ports.size()));
    }
  }
  ports_ = std::move(ports);
  releases_.emplace(*buffers_);
}

void ServerNode::launch_cores() {
  for (size_t i = 0; i < config_.shard_lcores.size(); ++i) {
    cores_.push_back(std::make_unique<ShardCore>(config_.shard_lcores[i], own_shards_[i],
                                                 config_.shard_core, *buffers_));
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
        placement, sc, config_.sync_policy(), fanout, *buffers_, config_.fanout_backlog,
        config_.fanout, config_.snapshots, config_.unit_chunks, config_.staleness_bound));
    started_.push_back(&shards_.back()->started());
    if (config_.standby == Standby::kPrimary) {
      shards_.back()->replicate_to(FanOut{endpoints_[0].get(), partner_peer_});
    } else if (config_.standby == Standby::kStandby) {
      shards_.back()->stand_by();
    }
    if (config_.wait_for_workers) shards_.back()->keep_versions();
    if (checkpoints_) {
      checkpoints_->snapshots.push_back(std::make_unique<ShardSnapshot>(
          shards_.back()->table(), checkpoints_->plan, placement.fingerprint()));
      shards_.back()->set_snapshot(checkpoints_->snapshots.back().get());
    }
  }
  if (checkpoints_) {
    checkpoints_->job = placement.fingerprint();
    checkpoints_->running.store(true, std::memory_order_release);  // the writer's acquire
  }
}

// The control plane's Starter: called when every rank declared the same list.
std::string ServerNode::start_shards(const agg::Placement& placement) {
  if (control_->seeded() && config_.fanout != Fanout::kEvery) {
    // The versions of an asynchronous job's chunks are not one step boundary.
    return "rank 0 resumes the job from a checkpoint, which needs training.sync bsp";
  }
  if (config_.resume && control_->seeded()) {
    return "rank 0 resumes the job from its state file, and this server from its checkpoint " +
           config_.resume->path + " (ps-server --resume): one or the other";
  }
  try {
    // Before anything is built: this job's tensors and shards against the file.
    if (config_.resume) check_checkpoint(*config_.resume, placement);
    check_levels(placement);
    if (config_.standby != Standby::kNone) {
      for (const agg::Block& b : placement.blocks()) {
        if (b.dtype == wire::Dtype::kFloat32) continue;
        // The replicas and the answers again are sent from the float32
        // master values, which are a float32 block's wire form only.
        throw std::invalid_argument("a standby replicates float32 tensors only: block " +
                                    std::to_string(b.key) + " is of another dtype");
      }
    }
    build_shards(placement);
  } catch (const std::exception& e) {
    if (checkpoints_) checkpoints_->snapshots.clear();
    started_.clear();
    shards_.clear();
    shard_slot_.assign(total_shards_, -1);
    return e.what();
  }
  for (size_t i = 0; i < cores_.size(); ++i) {
    shards_[i]->hand_over();  // built here, run there
    cores_[i]->attach(shards_[i].get());
  }
  seeded_ = control_->seeded() || config_.resume != nullptr;
  job_state_->start_st(placement, shard_slot_, static_cast<uint32_t>(shards_.size()),
                       control_->start_version(), seeded_);
  own_resume_pending_ = config_.resume != nullptr;
  return {};
}

void ServerNode::check_checkpoint(const CheckpointFile& f, const agg::Placement& placement) const {
  const job::ShardLayout& layout = config_.layout;
  try {
    agg::check_server_state(f.bytes, placement, layout.first[config_.server_index],
                            layout.count(config_.server_index), config_.chunk_bytes,
                            config_.optimizer.kind, config_.optimizer.decoupled_weight_decay);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("the checkpoint " + f.path + " is not this job's: " + e.what());
  }
}

void ServerNode::attach(node::Loop& loop) {
  if (!pollers_.empty()) throw std::logic_error("server: the node is attached to a loop already");
  pollers_.push_back(std::make_unique<ShardsPoller>(*this));
  for (uint32_t p = 0; p < ports(); ++p) pollers_.push_back(std::make_unique<PortPoller>(*this, p));
  pollers_.push_back(std::make_unique<ControlPoller>(*this, loop.tick_hz() / 1000 * kSlowMs));
  for (const auto& p : pollers_) loop.add(*p);
  loop_ = &loop;
}

ServerNode::~ServerNode() {
  if (loop_ != nullptr) {
    for (const auto& p : pollers_) loop_->remove(*p);
  }
  stop();
  // Shards hold buffers of the endpoints' ports: they go first, then the
  // endpoints (which still reference the receivers and complete into the
  // control channel's outbox).
  started_.clear();
  shards_.clear();
  endpoints_.clear();
}

void ServerNode::hand_over() {
  owner_.hand_over();
  control_->hand_over();
  releases_->hand_over();
  for (auto& e : endpoints_) e->hand_over();
  for (size_t i = cores_.size(); i < shards_.size(); ++i) shards_[i]->hand_over();
}

void ServerNode::stop() {
  for (auto& c : cores_) c->stop();
  for (Stage& s : stages_) {
    for (uint32_t i = 0; i < s.count; ++i) {
      if (s.items[i].kind == ShardItem::kTask) {
        s.items[i].task->finish("the node stopped");
      } else {
        releases_->free_st(s.items[i].buf);
      }
    }
    s.count = 0;
  }
  // The shard cores are gone: nothing may be queued to them any more.
  if (!cores_.empty()) {
    control_->on_stopped_st(now_);
    sync_state_st();
  }
}

void ServerNode::sync_state_st() {
  running_ = control_->state() == NodeState::kRunning;
  if (running_ && !link_schedule_started_) {
    // The job has started: link.rate_steps count from here, on every port.
    link_schedule_started_ = true;
    for (net::PacketPort* p : ports_) p->start_link_schedule_st(now_);
  }
  any_left_ = control_->left() != 0;
  if (config_.shrink) removed_bsp_ = control_->removed();
  placement_ = control_->placement();
  // A spare's peer speaks for its rank before the rank's kJoin tasks take
  // the peer's address.
  for (const ControlPlane::Takeover& t : control_->take_takeovers_st())
    take_over_st(t.rank, t.peer);
  if (const auto changes = control_->take_membership_st(); !changes.empty()) {
    change_membership_st(changes);
  }
  if (any_left_) {
    for (PortLeave& l : leaves_) {
      // A port of spares that hold no rank is not done with the job.
      if (l.detaches && l.state == PortLeave::kPolled && !l.attached_again && l.ranks != 0 &&
          (control_->left() & l.ranks) == l.ranks) {
        l.state = PortLeave::kLeaving;
        l.since = now_;
        detach_pending_ = true;
      }
    }
  }
}

void ServerNode::change_membership_st(const std::vector<ControlPlane::MembershipChange>& changes) {
  std::erase_if(removals_, [](const std::unique_ptr<ShardTask>& t) { return t->finished(); });
  // Stopped: the shard cores are gone, and with them what they kept.
  if (control_->state() == NodeState::kStopped) return;
  for (const ControlPlane::MembershipChange& c : changes) {
    if (config_.wait_for_workers) {
      // A lost rank is sent nothing until its new process joins; a joining
      // one waits for the iteration in progress (poll_bsp_joins_st).
      if (!c.joined) {
        task_every_shard_st(removals_, ShardTask::Kind::kSuspend, c.rank, 0);
        continue;
      }
      bsp_joins_.push_back(BspJoin{.rank = c.rank});
      task_every_shard_st(bsp_joins_.back().tasks, ShardTask::Kind::kLeast, c.rank, 0);
      continue;
    }
    // Where the rank is reached now: its own node, or the spare that took it.
    const Address at = address_of_peer(control_->peer_of(c.rank));
    for (uint32_t slot = 0; slot < shards_.size(); ++slot) {
      removals_.push_back(std::make_unique<ShardTask>());
      ShardTask& t = *removals_.back();
      t.kind = c.joined ? ShardTask::Kind::kJoin : ShardTask::Kind::kRemove;
      t.first = c.rank;
      t.endpoint = endpoints_[at.port].get();
      t.peer = at.peer;
      submit_task_st(slot, t);
    }
  }
}

void ServerNode::map_peers_st() {
  for (uint32_t p = 0; p < speaks_for_.size(); ++p) {
    const std::optional<uint32_t> r = control_->rank_of_peer(p);
    speaks_for_[p] = r ? static_cast<uint16_t>(*r) : kNoRank;
  }
}

void ServerNode::take_over_st(uint16_t rank, uint32_t peer) {
  // The datapath's map, and the ports' ranks (a port whose ranks all left
  // is detached: the rank is the spare's port's now).
  map_peers_st();
  const uint64_t bit = uint64_t{1} << rank;
  for (PortLeave& l : leaves_) l.ranks &= ~bit;
  leaves_[address_of_peer(peer).port].ranks |= bit;
}

void ServerNode::task_every_shard_st(std::vector<std::unique_ptr<ShardTask>>& into,
                                     ShardTask::Kind kind, uint16_t rank, uint32_t version) {
  for (uint32_t slot = 0; slot < shards_.size(); ++slot) {
    into.push_back(std::make_unique<ShardTask>());
    ShardTask& t = *into.back();
    t.kind = kind;
    t.first = rank;
    t.version = version;
    submit_task_st(slot, t);
  }
}

void ServerNode::poll_bsp_joins_st() {
  if (control_->state() == NodeState::kStopped) {
    bsp_joins_.clear();  // the shard cores are gone: no task of theirs runs
    return;
  }
  for (auto it = bsp_joins_.begin(); it != bsp_joins_.end();) {
    BspJoin& j = *it;
    const bool done =
        std::all_of(j.tasks.begin(), j.tasks.end(), [](const auto& t) { return t->finished(); });
    if (!done) {
      ++it;
      continue;
    }
    if (j.phase == BspJoin::Phase::kLeast) {
      // The iteration in progress: the least version of any chunk (each
      // chunk is at it or one past it).
      uint32_t least = UINT32_MAX;
      for (const auto& t : j.tasks) least = std::min(least, static_cast<uint32_t>(t->next));
      j.tasks.clear();
      j.version = least;
      if (!control_->finish_join_st(j.rank, least)) {  // a newer process, or the job ended
        it = bsp_joins_.erase(it);
        continue;
      }
      sync_state_st();
      send_replies_st();
      j.phase = BspJoin::Phase::kAnswered;
      ++it;
      continue;
    }
    if (j.phase == BspJoin::Phase::kAnswered) {
      // Its chunks once it has kJoined: before, its worker would not know
      // which versions to take.
      if (!control_channel_->settled_st(j.rank)) {
        ++it;
        continue;
      }
      if (control_->state() != NodeState::kRunning || !control_->in_job(j.rank)) {
        it = bsp_joins_.erase(it);
        continue;
      }
      task_every_shard_st(j.tasks, ShardTask::Kind::kRejoin, j.rank, j.version);
      j.phase = BspJoin::Phase::kSending;
      ++it;
      continue;
    }
    it = bsp_joins_.erase(it);
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
    if ((endpoints_[p]->owes_acks_st() || ports_[p]->tx_pending() != 0) && now_ - l.since < wait) {
      detach_pending_ = true;
      continue;
    }
    ports_[p]->set_detached_st(true);
    l.state = PortLeave::kDetached;
    l.saw_down = false;
  }
}

// ---- flow control (docs/server.md) ---------------------------------------

void ServerNode::derive_flow_limit_st(uint32_t port, net::PacketBuf* buf) {
  // The pool the port's packets arrive in (the port's own for a NIC,
  // net_af_packet or net_memif; the sender's for net_ring) decides, with the
  // facts of every port already seen using it (flow_control.h). A config
  // value (ServerNodeConfig::flow_limit) is kept as is.
  const net::PoolFacts pool = buffers_->pool(buf);
  flow_[port].pool = pool.id;
  FlowFacts facts;
  facts.pool = pool;
  for (const PortFlow& f : flow_) facts.ports.push_back({f.pool, f.workers, f.queues});
  facts.workers = workers();
  facts.configured = config_.flow_limit;
  facts.configured_port = port;
  facts.staging = std::any_of(shards_.begin(), shards_.end(),
                              [](const auto& sh) { return sh->table().staging_chunks() != 0; });
  facts.stages_every_set = std::all_of(shards_.begin(), shards_.end(),
                                       [](const auto& sh) { return sh->stages_every_set(); });
  facts.shard_cores = !cores_.empty();
  const std::vector<std::optional<FlowLimit>> limits = flow_limits(facts);
  for (size_t p = 0; p < limits.size(); ++p) {
    if (!limits[p]) continue;
    flow_[p].limit = limits[p]->limit;
    flow_[p].copies = limits[p]->copies;
  }
}

uint64_t ServerNode::aggregation_mbufs_st(uint32_t port) const {
  MERCURY_OWNED(owner_);
  const PortFlow& f = flow_[port];
  const auto id = static_cast<uint16_t>(port);
  uint64_t freed = releases_->freed(id);
  for (const auto& sh : shards_) freed += sh->releases().freed(id);
  // A stale read of a shard's count shows fewer frees, never more.
  return f.handed > freed ? f.handed - freed : 0;
}

int32_t ServerNode::slot_of_st(uint32_t key) {
  const int32_t slot =
      key < placement_->blocks().size() ? shard_slot_[placement_->at(key).shard] : -1;
  if (slot < 0) count(ServerDrop::kNotOurs);
  return slot;
}

bool ServerNode::admit_st(uint32_t port, uint16_t peer, const wire::HeaderFields& h) {
  if (peer >= rank_at_.size() && config_.standby != Standby::kNone) {
    // The partner's replicas wait (resent by its transport) until this
    // standby has its shards; after a promotion there is no primary.
    return h.type != wire::PacketType::kAggData ||
           (running_ && config_.standby == Standby::kStandby && !promoted_);
  }
  const uint16_t rank = rank_of_peer_st(peer);
  if (rank == kNoRank) return true;  // on_packet_st drops it, counted
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
  // (on_packet_st marks it and takes the credit): its buffer is freed once
  // copied. At most f.copies such buffers wait for a shard core.
  if (owned < f.limit + f.copies && shards_[slot]->staging_room_st() > 0) return true;
  // Otherwise only if it joins a set other ranks have started: with two
  // workers it completes it, and in general refusing it could leave every
  // rank waiting for the others. The shard publishes which sets are started
  // (StartedSets: why a stale read can only refuse).
  return started_[slot]->others_started(h.block_key, h.offset, rank);
}

bool ServerNode::on_packet_st(uint32_t port, uint16_t peer, const wire::HeaderFields& h,
                              std::span<const std::byte> payload, net::PacketBuf* buf) {
  if (peer >= rank_at_.size() && config_.standby != Standby::kNone) {
    return on_partner_packet_st(h, payload);
  }
  const uint16_t rank = rank_of_peer_st(peer);
  if (rank == kNoRank) {
    // A spare that holds no rank, or a rank's node after a spare took the
    // rank over: no gradient of theirs counts.
    count(ServerDrop::kNoRank);
    return false;
  }
  if (!running_) {
    count(ServerDrop::kNotRunning);
    return false;
  }
  if (config_.standby == Standby::kStandby && !promoted_) {
    count(ServerDrop::kNotPromoted);
    return false;
  }
  if (promotion_refused_) {
    // A worker that took the promotion: told on the slow path, once.
    count(ServerDrop::kNotServing);
    if (not_served_[rank] == 0) not_served_[rank] = 1;
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
  // Rank 0 sends its initial values (or a rank its gradients) once every
  // server and standby answered it: the pair may heartbeat each other.
  pair_started_ = true;
  if (init && seeded_) {  // the job's chunks come from rank 0's checkpoint
    count(ServerDrop::kInitResumed);
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
  if (rolling_back_) {
    // Another server resumed: the job goes back to its version, so no
    // gradient of the versions after it is applied (docs/durability.md).
    count(ServerDrop::kRollingBack);
    return false;
  }
  if (removed_bsp_ != 0 && (removed_bsp_ >> rank & 1) != 0) {
    // Removed from a BSP job that shrank: its sets complete without it
    // from the removal on (docs/membership.md).
    count(ServerDrop::kRemovedRank);
    return false;
  }
  const int32_t slot = slot_of_st(h.block_key);
  if (slot < 0) return false;
  PortFlow& flow = flow_[port];
  if (flow.pool == nullptr) derive_flow_limit_st(port, buf);
  // Counted under the receiving port when freed (BufferReleases).
  buffers_->set_mark(buf, static_cast<uint16_t>(port));
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
    // Counted before the call: a completed set releases its buffers inside it.
    ++flow.handed;
    if (shard.contribute_st(rank, h, payload, buf, copy)) return true;
    --flow.handed;
    return false;
  }
  ++flow.handed;
  Stage& stage = stages_[slot];
  ShardItem& it = stage.items[stage.count++];
  it.buf = buf;
  it.key = h.block_key;
  it.offset = h.offset;
  it.iteration = h.iteration;
  it.clock = h.param_version;
  it.payload_at = static_cast<uint16_t>(payload.data() - buffers_->data(buf));
  it.payload_len = static_cast<uint16_t>(payload.size());
  it.rank = rank;
  it.kind = init ? ShardItem::kInit : ShardItem::kGradient;
  it.copy = copy ? 1 : 0;
  if (stage.count == stage.items.size()) flush_st(static_cast<uint32_t>(slot));
  return true;
}

void ServerNode::flush_st(uint32_t slot) {
  Stage& stage = stages_[slot];
  if (stage.count == 0) return;
  const uint32_t n = cores_[slot]->enqueue_st(stage.items.data(), stage.count);
  for (uint32_t i = n; i < stage.count; ++i) {
    if (stage.items[i].kind == ShardItem::kTask) {
      stage.items[i].task->finish("shard ring full");
      continue;
    }
    // Already acknowledged: this contribution is lost, and its chunk's set
    // will not complete. Only an undersized ring gets here.
    releases_->free_st(stage.items[i].buf);
    if (stage.items[i].copy != 0) shards_[slot]->unreserve_staging_st();
    count(ServerDrop::kShardRingFull);
  }
  stage.count = 0;
}

uint32_t ServerNode::poll_shards_st() {
  MERCURY_OWNED(owner_);
  uint32_t work = 0;
  // Inline shards' slices an endpoint refused, oldest first.
  for (size_t i = cores_.size(); i < shards_.size(); ++i) {
    if (shards_[i]->fanout_pending()) work += shards_[i]->retry_fanout_st();
  }
  return work;
}

uint32_t ServerNode::poll_port_st(uint32_t p, transport::Tick now) {
  MERCURY_OWNED(owner_);
  now_ = now;
  uint64_t marks = 0;  // marked copies queued to shard cores, not yet taken
  for (size_t i = 0; i < cores_.size() && i < shards_.size(); ++i) {
    marks += shards_[i]->marks_in_flight_st();
  }
  // A port whose copy budget a burst could exceed while its copies wait for
  // a shard core leaves its packets in its RX queue for this pass rather
  // than have them refused (they drain: a shard core always takes its
  // ring). Held buffers alone never pause a port: completing packets must
  // get in.
  const PortFlow& f = flow_[p];
  const bool receive = marks == 0 || f.limit == 0 ||
                       aggregation_mbufs_st(p) + net::PacketPort::kBurst < f.limit + f.copies;
  const uint32_t work = endpoints_[p]->poll_st(now, receive);
  for (uint32_t s = 0; s < stages_.size(); ++s) flush_st(s);
  return work;
}

uint32_t ServerNode::poll_control_st(transport::Tick now) {
  MERCURY_OWNED(owner_);
  now_ = now;
  if (replies_wait_) {
    // The job started in a port's pass: its kReady go to the endpoints now,
    // after every port's transmit, and leave stamped by the next pass.
    replies_wait_ = false;
    send_replies_st();
  }
  if (own_resume_pending_ && running_ && control_channel_->settled_st()) {
    // Every rank has its kReady (the resumed version its pulls wait for):
    // the chunks may go out.
    own_resume_pending_ = false;
    job_state_->resume_st(config_.resume->bytes);
  }
  if (rollback_) poll_rollback_st();
  if (job_state_->pending_st() || !job_state_unsent_.empty()) poll_job_state_st();
  if (!bsp_joins_.empty()) poll_bsp_joins_st();
  if (restarted_ != 0) handle_restarts_st();
  if (detach_pending_) detach_left_ports_st();
  if (push_after_leave_ != 0 && running_) {
    control_->on_push_after_leave_st(static_cast<uint16_t>(push_after_leave_ - 1), now_);
    push_after_leave_ = 0;
    sync_state_st();
    send_replies_st();
  }
  return 0;
}

void ServerNode::slow_st(transport::Tick now) {
  MERCURY_OWNED(owner_);
  now_ = now;
  if (!running_) return;
  check_liveness_st();
  if (promotion_refused_) tell_not_serving_st();
  if (notices_unsettled_ != 0) send_standby_notices_st();
  if (partner_alive_ && config_.standby == Standby::kPrimary) {
    // A replica failed before liveness named the standby (the same dead
    // transport peer): lost all the same.
    for (const auto& sh : shards_) {
      if (!sh->standby_failed()) continue;
      on_partner_lost_st();
      break;
    }
  }
  if (running_ && config_.wait_for_workers && control_->check_waits_st(now_)) {
    sync_state_st();
    send_replies_st();
  }
  // Server 0 gives the spares that wait the ranks removed for the grace.
  if (running_ && !config_.spares.empty() && control_->check_spares_st(now_)) {
    sync_state_st();
    send_replies_st();
  }
  // A rank that left stops polling once its leave is acknowledged: nothing
  // more is sent to it, so nothing waits for its acknowledgement.
  if (running_) {
    control_channel_->heartbeat_st(now, [this](uint32_t rank) { return active_st(rank); });
  }
}

void ServerNode::handle_restarts_st() {
  // Lowest peer first; each one's answers are queued before the next.
  while (restarted_ != 0) {
    const auto peer = static_cast<uint32_t>(std::countr_zero(restarted_));
    restarted_ &= restarted_ - 1;
    control_->on_peer_restarted_st(peer, now_);
  }
  sync_state_st();
  send_replies_st();
}

void ServerNode::check_liveness_st() {
  // A rank out of the job (it left, or was removed) owes nothing more.
  const std::optional<uint32_t> lost =
      control_channel_->lost_st([this](uint32_t rank) { return active_st(rank); });
  if (!lost) return;
  if (*lost >= rank_at_.size() && config_.standby != Standby::kNone) {
    on_partner_lost_st();
    return;
  }
  // Under BSP every other rank waits for this one's gradients: the control
  // plane ends the job for all of them, with the reason. An asynchronous
  // job, or a BSP job that shrinks, goes on without it (docs/membership.md);
  // a spare that waits is forgotten.
  control_->on_peer_lost_st(*lost, now_);
  sync_state_st();
  send_replies_st();
}

ServerCounters ServerNode::counters_st() const {
  MERCURY_OWNED(owner_);
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
  // The control channel's drops, under the node's names for them.
  const node::ControlChannelCounters& ch = control_channel_->counters();
  c.drops[static_cast<size_t>(ServerDrop::kControlTooBig)] += ch.too_big;
  c.drops[static_cast<size_t>(ServerDrop::kBadControl)] += ch.malformed;
  c.drops[static_cast<size_t>(ServerDrop::kReplyNotQueued)] += ch.not_queued;
  c.control = control_->counters();
  c.control += job_state_->counters();
  c.control.promotions += promotions_;
  c.control.promotions_refused += promotions_refused_;
  c.control.rollbacks += rollbacks_;
  c.control.standbys_lost += standbys_lost_;
  for (uint32_t p = 0; p < flow_.size(); ++p) c.aggregation_mbufs += aggregation_mbufs_st(p);
  for (const auto& e : endpoints_) c.net += e->counters_st();
  for (const net::PacketPort* p : ports_) {
    base::add_array(c.port_drops, p->drops());
    c.pmd_drops += p->pmd_drops();
  }
  return c;
}

void ServerNode::refresh_port_stats_st() {
  MERCURY_OWNED(owner_);
  for (net::PacketPort* p : ports_) p->refresh_port_stats_st();
  // A detached port is attached again when a new peer has connected: its
  // link went down (the workers that left closed it) and is up again.
  for (uint32_t p = 0; p < leaves_.size(); ++p) {
    PortLeave& l = leaves_[p];
    if (l.state != PortLeave::kDetached) continue;
    if (ports_[p]->link_up() == 0) {
      l.saw_down = true;
    } else if (l.saw_down) {
      ports_[p]->set_detached_st(false);
      l.state = PortLeave::kPolled;
      // Its ranks left for good (a job cannot take one back): whoever came
      // is refused, and the port stays attached from now on.
      l.attached_again = true;
    }
  }
}

transport::PeerCounters ServerNode::peer_totals_st() const {
  MERCURY_OWNED(owner_);
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

void ServerNode::on_control_st(uint32_t peer, agg::ControlMessage&& m) {
  MERCURY_OWNED(owner_);
  // What arrived is acknowledged before the message is handled, in order
  // with the packets around it: the job's start builds the shards on this
  // core for a few hundred milliseconds, and the workers would resend
  // declarations whose ACK waited for the ACK delay meanwhile.
  for (auto& e : endpoints_) e->flush_acks_st(now_);
  if (peer >= rank_at_.size() && config_.standby != Standby::kNone) {
    // The other node of a standby pair sends heartbeats only, from the
    // job's first data on: heartbeat it too.
    if (m.kind != agg::ControlKind::kHeartbeat) count(ServerDrop::kBadControl);
    if (running_) pair_started_ = true;
    return;
  }
  // A restart the endpoint saw in this pass comes first: the message is the
  // new process's, and its declare must find the old one out of the job
  // (else the restart, handled after the pass, would remove the rank it
  // joined).
  if (peer < 64 && (restarted_ >> peer & 1) != 0) handle_restarts_st();
  if (m.kind == agg::ControlKind::kPromotionRefused) {
    on_promotion_refused_st(peer, m);
    return;
  }
  if (promotion_refused_ && !served_only_st(m.kind)) {
    const uint16_t rank = rank_of_peer_st(static_cast<uint16_t>(peer));
    count(ServerDrop::kNotServing);
    if (rank != kNoRank && not_served_[rank] == 0) not_served_[rank] = 1;
    tell_not_serving_st();
    return;
  }
  if (m.kind == agg::ControlKind::kRollback || JobState::handles(m.kind)) {
    // A rank's own: a peer that speaks for none (a spare that waits, a
    // rank's node after a spare took the rank) has none to send.
    const uint16_t rank = rank_of_peer_st(static_cast<uint16_t>(peer));
    if (rank == kNoRank) {
      count(ServerDrop::kNoRank);
    } else if (m.kind == agg::ControlKind::kRollback) {  // server_node_rollback.cpp
      on_rollback_st(rank, m);
    } else {
      // Settings and the job's state: the shards' work (job_state.h).
      job_state_->on_message_st(rank, std::move(m));
      poll_job_state_st();
    }
    return;
  }
  const bool was_running = running_;
  switch (control_->on_peer_message_st(peer, std::move(m), now_)) {
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
    case ControlVerdict::kNoRank:
      count(ServerDrop::kNoRank);
      break;
  }
  sync_state_st();
  // This declare started the job: its replies go out after the pass (replies_wait_).
  if (running_ && !was_running) replies_wait_ = true;
  send_replies_st();
}

void ServerNode::submit_task_st(uint32_t slot, ShardTask& task) {
  if (slot >= cores_.size()) {  // inline: this thread owns the shard
    shards_[slot]->run_task_st(task);
    return;
  }
  // Behind the packets staged for the core, and sent at once.
  Stage& stage = stages_[slot];
  ShardItem& it = stage.items[stage.count++];
  it.task = &task;
  it.kind = ShardItem::kTask;
  flush_st(slot);
}

void ServerNode::poll_job_state_st() {
  // A page is up to a MiB: an endpoint out of descriptors takes it on a
  // later pass (a worker waits for every answer).
  std::vector<ControlReply> replies = std::move(job_state_unsent_);
  job_state_unsent_.clear();
  std::string refusal;
  job_state_->poll_st(replies, refusal);
  for (ControlReply& r : replies) {
    // Its answers name ranks; a rank a spare took over is the spare's peer.
    if (!control_channel_->send_st(control_->peer_of(r.rank), r.message)) {
      job_state_unsent_.push_back(std::move(r));
    }
  }
  if (!refusal.empty()) {
    control_->refuse_st(std::move(refusal), now_);
    sync_state_st();
    send_replies_st();
  }
}

void ServerNode::send_replies_st() {
  if (replies_wait_) return;  // the control poller sends them, with what came since
  for (const ControlReply& r : control_->take_replies_st()) {
    control_channel_->send_st(r.rank, r.message);
  }
}

}  // namespace mercury::server

namespace mercury::server {

// ---- a hot standby (docs/durability.md) -----------------------------------

bool ServerNode::on_partner_packet_st(const wire::HeaderFields& h,
                                      std::span<const std::byte> payload) {
  if (config_.standby != Standby::kStandby || h.type != wire::PacketType::kAggData || !running_ ||
      promoted_) {
    count(ServerDrop::kFromPartner);
    return false;
  }
  pair_started_ = true;  // the primary runs: heartbeat it
  const int32_t slot = slot_of_st(h.block_key);
  if (slot < 0) return false;
  // Copied (or dropped and counted by the shard): the endpoint frees the buffer.
  shards_[slot]->take_replica_st(h.block_key, h.offset, h.param_version, h.iteration, payload);
  return false;
}

void ServerNode::on_partner_lost_st() {
  partner_alive_ = false;
  if (config_.standby == Standby::kPrimary) {
    ++standbys_lost_;
    notices_.push_back("standby " + config_.partner.name +
                       " lost: updates go out unreplicated once every worker knows");
    // No update goes out unreplicated before every worker has acknowledged
    // this: a worker that later follows the standby (this server dead
    // meanwhile) has then seen no version the standby lacks, and one that
    // has it refuses the standby's promotion (a partition between the two).
    notice_waits_.assign(control_channel_->peers(), 0);
    notices_unsettled_ = 0;
    for (uint32_t r = 0; r < rank_at_.size(); ++r) {
      if (control_->gone(r)) continue;
      notice_waits_[control_->peer_of(r)] = 2;
      ++notices_unsettled_;
    }
    send_standby_notices_st();
    if (notices_unsettled_ == 0) {
      for (auto& sh : shards_) sh->standby_lost_st();
    }
    return;
  }
  promote_st();
}

void ServerNode::promote_st() {
  promoted_ = true;
  ++promotions_;
  uint32_t version = 0;
  for (auto& sh : shards_) {
    sh->promote_st();
    version = std::max(version, sh->newest_version());
  }
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kPromoted;
  m.version = version;
  m.text = "the standby of " + config_.partner.name + " took over";
  for (uint32_t r = 0; r < rank_at_.size(); ++r) {
    if (!control_->gone(r)) control_channel_->send_st(control_->peer_of(r), m);
  }
  notices_.push_back("promoted: " + config_.partner.name +
                     " lost, serving its shards from version " + std::to_string(version));
}

void ServerNode::on_promotion_refused_st(uint32_t peer, const agg::ControlMessage& m) {
  const uint16_t rank = rank_of_peer_st(static_cast<uint16_t>(peer));
  if (rank == kNoRank) {
    count(ServerDrop::kNoRank);
    return;
  }
  if (config_.standby != Standby::kStandby || !promoted_) {
    count(ServerDrop::kBadControl);  // only a promoted standby asked for it
    return;
  }
  ++promotions_refused_;
  if (promotion_refused_) return;
  // The worker's server answered it after this standby named the server
  // lost: the server runs, and (having named this standby lost as well)
  // serves versions this standby never got. Serving would move the workers
  // that follow onto diverged parameters: nothing is served from now on.
  promotion_refused_ = true;
  not_served_.assign(rank_at_.size(), 0);
  notices_.push_back("promotion refused by " + rank_name_[rank] + " (rank " + std::to_string(rank) +
                     "): " + m.text + "; not serving " + config_.partner.name +
                     "'s shards, what comes for them is dropped until " + "the job ends");
}

bool ServerNode::served_only_st(agg::ControlKind kind) {
  return kind == agg::ControlKind::kHeartbeat || kind == agg::ControlKind::kLeave ||
         kind == agg::ControlKind::kSettings;
}

void ServerNode::tell_not_serving_st() {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kRefused;
  m.text = "the standby of " + config_.partner.name + " does not serve: a worker refused its " +
           "promotion (it still reaches " + config_.partner.name + ")";
  for (uint32_t r = 0; r < not_served_.size(); ++r) {
    if (not_served_[r] != 1) continue;
    not_served_[r] = 2;
    control_channel_->send_st(control_->peer_of(r), m);
  }
}

void ServerNode::on_control_failed_st(uint32_t peer, const transport::SendResult&) {
  standby_notice_settled_st(peer);  // a worker gone follows no one
}

void ServerNode::send_standby_notices_st() {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kStandbyLost;
  m.text = "it named its standby " + config_.partner.name + " lost";
  for (uint32_t peer = 0; peer < notice_waits_.size(); ++peer) {
    if (notice_waits_[peer] != 2) continue;
    const uint16_t rank = rank_of_peer_st(static_cast<uint16_t>(peer));
    if (rank == kNoRank || control_->gone(rank)) {
      standby_notice_settled_st(peer);  // out of the job: follows no one
    } else if (control_channel_->send_st(peer, m, true)) {
      notice_waits_[peer] = 1;
    }  // else not queued (the endpoint full): the slow work tries again
  }
}

void ServerNode::on_control_delivered_st(uint32_t peer, agg::ControlKind kind) {
  if (kind == agg::ControlKind::kStandbyLost) standby_notice_settled_st(peer);
}

void ServerNode::standby_notice_settled_st(uint32_t peer) {
  if (peer >= notice_waits_.size() || notice_waits_[peer] == 0) return;
  notice_waits_[peer] = 0;
  if (--notices_unsettled_ != 0) return;
  for (auto& sh : shards_) sh->standby_lost_st();
}

}  // namespace mercury::server
