// A parameter server node: its ports towards the workers (net::PacketPort:
// a DPDK Interface in ps-server, a MemoryPort in unit tests; one transport
// endpoint per port, one transport peer per worker behind it), the job's
// control plane (server::ControlPlane, fed through a node::ControlChannel),
// and the node's shards (server::Shard), run inline on the net core or each
// on a shard core of its own (server::ShardCore). The node runs as a set of
// pollers on its net core's node::Loop (attach()): one per port (its
// endpoint's pass and the dispatch of what arrived), one for the inline
// shards' deferred fan-out, one for the control plane's pending work, and a
// slow task (liveness and heartbeats, every kSlowMs).
//
// Life of a node: the ControlPlane's (control_plane.h). Built from the job
// (its workers, ports and shard layout), the node waits for every rank's
// declare; when the lists agree it builds its shards on the placement (the
// job's global shard count is layout.total; this node runs the
// layout.count(server_index) shards from layout.first[server_index]) and
// runs. Running: rank 0's kInit packets give each chunk its initial values
// (version 0, sent to every worker); kData packets (gradients) aggregate;
// each update goes to every worker. Server 0 also runs the job's barrier.
//
// Ranks. A worker's rank is its index in the job's worker list; the node
// maps (port, transport peer) to it, so several workers may sit behind one
// port (one endpoint with several peers, e.g. a bridge) and a worker per
// port works as well. Spare workers (ServerNodeConfig::spares, asynchronous
// jobs) are transport peers after the ranks, the control plane's peers
// workers()..: a spare holds no rank until one is given to it
// (ControlPlane, "Spare workers"); then its peer speaks for that rank
// (packets, control messages, the shards' fan-out) and the rank's own node
// for none (its packets dropped, counted kNoRank).
//
// Threads. Everything ending in _st, and the control plane, belong to the
// net core whose loop runs the node's pollers (asserted: base/owner.h).
// With shard lcores configured, gradient and
// init packets go to each shard's core through an SP/SC ring (ShardCore); the
// shards fan out from there (Endpoint::send_slice is lock-free). The
// constructors and stop() are control path: with shard lcores they must run
// on the EAL main lcore. Construction throws std::invalid_argument naming
// what is wrong; building the shards when the last declare arrives never
// throws (a failure refuses the job, with the reason).
//
// Flow control. A worker's gradient packet is admitted by the transport
// (PacketReceiver::admit, before it is acknowledged) while the mbufs its
// port's packets keep in the aggregation path are below flow_limit; over
// it, when its shard has a free staging chunk (the packet is then copied
// into the chunk table and its mbuf freed), or when it joins a chunk's set
// that other ranks have started (completing it, with two workers): those
// never wait, so every started set can complete and free its mbufs. A
// refused packet is resent by its worker later. So a worker running ahead
// cannot exhaust the pool the slower ones' packets need. The net core reads
// only what each shard publishes for it (its MbufReleases, StartedSets and
// staging credits), never a shard's table (docs/server.md, "Flow control").
//
// Costs per packet on the net core: the endpoint's, a rank lookup, a
// block lookup, then either the shard's contribute (inline) or a 32-byte
// ring item (shard cores); admitting a gradient reads the releases of every
// shard of the node (one relaxed load each) and, over the limit, the chunk's
// byte in its shard's StartedSets (a lookup, a multiply, one relaxed load).
// Nothing on the datapath allocates, locks, throws or logs; every drop is
// counted by reason (ServerDrop, the chunk table's outcomes, the endpoints'
// and the ports' drops). Control messages allocate (control path).
// Memory beyond the endpoints and chunk tables: per shard a fan-out backlog
// of 16 B x fanout_backlog (default chunks x workers: 2.3 MB for half of
// ResNet-50 with 4 workers) and a StartedSets (1 B per chunk), per shard
// core a ring of 32 B x ring_entries (rounded up to a power of two).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "base/owner.h"
#include "job/job.h"
#include "net/packet_port.h"
#include "node/control_channel.h"
#include "node/loop.h"
#include "server/checkpoint.h"
#include "server/control_plane.h"
#include "server/counters.h"
#include "server/job_state.h"
#include "server/shard.h"
#include "server/shard_core.h"
#include "transport/endpoint.h"

namespace mercury::server {

/// A worker of the job, as the job file names it: its rank is its index in
/// the list given to ServerNode, `port` the index of the node's interface
/// it is reached through.
struct JobWorker {
  transport::PeerSpec peer;  ///< its address; `name` appears in messages ("w2")
  uint32_t port = 0;
};

/// Which of a hot-standby pair a node is (docs/durability.md, "A hot
/// standby"): the primary replicates every chunk update to its standby
/// before the workers get it; the standby holds the copy and serves it
/// once it has named the primary lost (promoted), until a worker refuses
/// the promotion (it still reaches the primary: then it serves nothing).
/// A primary that names its standby lost tells every worker before any
/// update goes out unreplicated.
enum class Standby : uint8_t { kNone, kPrimary, kStandby };

/// How a server node runs. server::node_config() (node_config.h) builds it
/// from the job file, as ps-server does; tests may fill it by hand.
struct ServerNodeConfig {
  uint32_t chunk_bytes = 0;        ///< net::payload_per_packet(mtu), as on every node
  agg::OptimizerConfig optimizer;  ///< applied to every chunk update
  /// training.sync: makes each shard's policy (job::sync_policy). The
  /// default is the job file's default (training.sync bsp).
  std::function<std::unique_ptr<agg::SyncPolicy>()> sync_policy = [] {
    return job::sync_policy(config::TrainingConfig{});
  };
  /// Who gets each update (server/shard.h): kEvery for bsp, whose quorum is
  /// every worker; the asynchronous modes' rule for a quorum of 1.
  /// Construction refuses a mismatch.
  Fanout fanout = Fanout::kEvery;
  /// training.staleness_bound: while a worker is that far ahead of the
  /// slowest clock, kSlowest (ssp) holds its answers (SspAnswers).
  uint32_t staleness_bound = 0;
  /// training.on_worker_loss shrink (BSP only): a lost or restarted rank
  /// but rank 0 is removed and the job goes on with the others
  /// (docs/membership.md, "A BSP job that shrinks"). Construction refuses
  /// it with another fan-out rule, store-and-forward or a standby.
  bool shrink = false;
  /// training.on_worker_loss wait (BSP only): a lost or restarted rank is
  /// waited for, at most worker_wait_s, and its new process joins at the
  /// iteration in progress (docs/membership.md, "A BSP job that waits").
  /// Every shard keeps its chunks' two newest versions. Construction
  /// refuses it with another fan-out rule, store-and-forward, a standby,
  /// more than one server node or shrink.
  bool wait_for_workers = false;
  double worker_wait_s = 60;
  /// Spare workers (asynchronous modes; docs/membership.md, "Spare
  /// workers"): each a transport peer of its port after the ranks there,
  /// taken in for a rank removed for spare_grace_s. Construction refuses
  /// them under bsp or with a standby.
  std::vector<JobWorker> spares;
  double spare_grace_s = 2;
  /// Asynchronous modes: snapshot chunks per shard (Shard); 0 = two per chunk.
  uint64_t snapshots = 0;
  /// training.aggregation: 0 sends each updated chunk at once (chunk);
  /// else the store-and-forward unit in chunks (Shard): UINT32_MAX for a
  /// whole tensor, the partition's packets under scheduler partition.
  uint32_t unit_chunks = 0;
  /// How tensors are cut into blocks: the workers' (job::placement_options).
  agg::PlacementOptions placement;
  /// Control-plane constructor: the job's shard layout (job::shard_layout,
  /// or job::ShardLayout::of({counts...}) by hand) and this node's index
  /// among the job's servers. Server 0 also runs the barrier.
  job::ShardLayout layout;
  uint32_t server_index = 0;
  transport::EndpointConfig endpoint;  ///< per port; its peers are set from the workers
  uint64_t shard_memory_limit = uint64_t{4} << 30;
  /// EAL lcores for the shards this node runs, in shard order: shard i runs
  /// on shard_lcores[i], the shards beyond the list (all, when it is empty)
  /// inline on the net core. Each shard core's ring has
  /// shard_core.ring_entries items, which must be at least the mbufs of
  /// every RX pool of the node's ports (then it can never be full).
  std::vector<unsigned> shard_lcores;
  ShardCoreOptions shard_core;
  /// Per shard: slices kept for a retry when an endpoint refuses them
  /// (Shard); 0 = the shard's chunks x workers, which BSP never exceeds.
  uint64_t fanout_backlog = 0;
  /// Largest control message accepted (a declare of a big model is ~50 B per tensor).
  uint32_t max_control_bytes = 16 << 20;
  /// Flow control (docs/server.md): per port, the mbufs of its packets the
  /// aggregation path may own (queued to a shard core or held by a table)
  /// before the node admits only gradients that join a set other ranks have
  /// started. 0 = derived from the pool the port's first gradient or init
  /// packet arrived in (flow_limit_st() gives the value).
  uint64_t flow_limit = 0;
  /// Per shard, staging chunks (agg::ShardConfig::staging_chunks): over a
  /// port's limit, a gradient its set would hold is copied into one and its
  /// mbuf freed, instead of being refused. The default stages every set
  /// (chunks x (N - 1)) within shard_memory_limit; 0 = none (refusals).
  uint64_t staging_chunks = agg::kStagingMost;
  /// The buffers of the RX pools of the node's ports, when known (0: not
  /// known): what node_config() sizes the shard rings by, and what the
  /// runner's warning about small pools compares with.
  uint64_t rx_pool_mbufs = 0;
  /// Background checkpoints (docs/server.md, "Durability"): the shards
  /// snapshot every multiple of `every_versions` (or, with `by_time`, the
  /// version the writer arms when every_s has passed); a CheckpointWriter
  /// (the Runner's) writes them. Off unless `enabled`.
  /// `dir` and `node` name the files: a running server of several rolls
  /// back from its own checkpoint there when another resumed
  /// (docs/durability.md, "Several servers"); empty: it cannot.
  struct Checkpoints {
    bool enabled = false;
    uint32_t every_versions = 0;
    std::string dir;
    std::string node;
  } checkpoints;
  /// ps-server --resume: this server's checkpoint (checkpoint.h,
  /// load_checkpoint), checked in itself and against the job file's
  /// optimizer. When every worker declared, it is checked against the
  /// placement (agg::check_server_state; a mismatch refuses the job naming
  /// it), kReady carries its version, no kInit is taken, and once every rank
  /// acknowledged its kReady each shard restores its chunks at that version
  /// and sends them to every worker. Null: the job starts from rank 0's
  /// initial values (or rank 0's state).
  std::shared_ptr<const CheckpointFile> resume;
  /// A hot standby: which of the pair this node is, and the other one (a
  /// transport peer of port 0, after the workers there). A standby runs
  /// the shards of server `server_index`. Both run their shards inline
  /// (shard_lcores must be empty) and need Fanout::kEvery without
  /// store-and-forward (unit_chunks 0); construction refuses otherwise.
  Standby standby = Standby::kNone;
  transport::PeerSpec partner;
};

// The node's gauges (values now, not totals).
#define MERCURY_SERVER_GAUGES(X)                     \
  X(held, "contributions the chunk tables hold now") \
  X(aggregation_mbufs, "received buffers the aggregation path owns now (queued or held)")

/// Everything the node counts, every field a 64-bit counter (so that it can
/// go through base::Published). for_each() walks them all, with a
/// prefix per part: net_ (the endpoints, summed), port_drop_ (the ports'
/// drops by net::DropReason, then their PMDs' own, rx_nombuf, imissed,
/// ierrors and oerrors, summed), drop_ (the node's own, by
/// ServerDrop), shard_ (the shards, summed), table_ (the chunk tables,
/// summed), control_, and the gauges without one.
struct ServerCounters {
  transport::EndpointCounters net;
  std::array<uint64_t, net::kDropReasonCount> port_drops{};
  /// The PMDs' drops as of the last refresh_port_stats_st().
  net::PortDrops pmd_drops;
  std::array<uint64_t, kServerDropCount> drops{};
  ShardCounters shards;
  agg::ChunkTableCounters table;
  ControlCounters control;
  MERCURY_SERVER_GAUGES(MERCURY_COUNTER_DECLARE)

  [[nodiscard]] uint64_t drop(ServerDrop d) const { return drops[static_cast<size_t>(d)]; }
  [[nodiscard]] uint64_t packets_in() const { return net.rx_packets; }
  [[nodiscard]] uint64_t packets_out() const {
    return net.tx_data + net.tx_retransmits + net.tx_pure_acks;
  }

  /// f(prefix, name, value) for every counter (base/counter_list.h);
  /// a part's prefix comes before its own ("net_drop_", ...).
  template <class F>
  void for_each(F&& f) const {
    auto in = [&f](std::string_view part) {
      return [&f, part](std::string_view prefix, std::string_view name, uint64_t v) {
        const std::string joined = std::string(part).append(prefix);
        f(std::string_view(joined), name, v);
      };
    };
    net.for_each(in("net_"));
    base::visit_array(f, "port_drop_", port_drops, [](size_t i) {
      return net::drop_reason_name(static_cast<net::DropReason>(i));
    });
    pmd_drops.for_each(in("port_drop_"));
    base::visit_array(f, "drop_", drops,
                      [](size_t i) { return server_drop_name(static_cast<ServerDrop>(i)); });
    shards.for_each(in("shard_"));
    table.for_each(in("table_"));
    control.for_each(in("control_"));
    MERCURY_SERVER_GAUGES(MERCURY_COUNTER_VISIT)
  }
  ServerCounters& operator+=(const ServerCounters& o) {
    net += o.net;
    base::add_array(port_drops, o.port_drops);
    pmd_drops += o.pmd_drops;
    base::add_array(drops, o.drops);
    shards += o.shards;
    table += o.table;
    control += o.control;
    MERCURY_SERVER_GAUGES(MERCURY_COUNTER_ADD)
    return *this;
  }
};

class ServerNode final : private node::ControlChannel::Handler {
 public:
  /// Between two runs of the node's slow task (liveness, heartbeats).
  static constexpr uint64_t kSlowMs = 1;

  /// Control plane: waits for every worker's declare. `ports` must outlive
  /// the node and be of one kind (the same net::BufferOps); workers[r] is
  /// rank r (1..agg::kMaxWorkers of them), and every port has at least one
  /// worker. config.layout and config.server_index say which shards this
  /// node runs. Throws std::invalid_argument naming what is wrong.
  ServerNode(std::vector<net::PacketPort*> ports, std::vector<JobWorker> workers,
             const ServerNodeConfig& config, transport::Tick now);
  ~ServerNode();
  ServerNode(const ServerNode&) = delete;
  ServerNode& operator=(const ServerNode&) = delete;

  /// Control path, before `loop` runs: adds the node's pollers (the inline
  /// shards' deferred fan-out, each port, the control plane's pending work
  /// with the slow work on its period) to the net core's loop. A node is
  /// attached to one loop, and leaves it when destroyed.
  void attach(node::Loop& loop);

  /// Control path: the net core's loop has ended on another thread (joined
  /// since); the node's _st functions belong to the next thread that calls
  /// one (base/owner.h), e.g. the one reading the final counters.
  void hand_over();

  /// Control path, the thread that owns the shard cores (the EAL main
  /// lcore): stops the shard cores (joins them, frees the buffers queued to
  /// them). The node serves nothing afterwards; the destructor also does
  /// it. Idempotent.
  void stop();

  [[nodiscard]] NodeState state_st() const {
    MERCURY_OWNED(owner_);
    return control_->state();
  }
  /// Why the node is kRefused ("" otherwise).
  [[nodiscard]] const std::string& refusal_st() const {
    MERCURY_OWNED(owner_);
    return control_->refusal();
  }
  /// The placement once running (null before).
  [[nodiscard]] const agg::Placement* placement_st() const {
    MERCURY_OWNED(owner_);
    return control_->placement();
  }
  /// Lines for the node's output since the last call: a rank removed from
  /// an asynchronous job (docs/membership.md). Runner prints them.
  std::vector<std::string> take_notices_st() {
    MERCURY_OWNED(owner_);
    std::vector<std::string> out = control_->take_notices_st();
    out.insert(out.end(), notices_.begin(), notices_.end());
    notices_.clear();
    return out;
  }
  /// A hot standby: whether this standby was promoted (it named its server
  /// lost); it serves unless a worker refused that since.
  [[nodiscard]] bool promoted_st() const {
    MERCURY_OWNED(owner_);
    return promoted_;
  }
  [[nodiscard]] ServerCounters counters_st() const;
  /// Reads every port's device counters and gauges
  /// (net::PacketPort::refresh_port_stats_st) for counters_st() and the
  /// ports' readers, and attaches a detached port whose link came back.
  /// Net core, slow path (Runner: every 100 ms): a few microseconds per port.
  void refresh_port_stats_st();
  /// Every worker's transport counters (both directions), summed.
  [[nodiscard]] transport::PeerCounters peer_totals_st() const;
  [[nodiscard]] const ServerNodeConfig& config() const { return config_; }
  [[nodiscard]] uint32_t workers() const { return static_cast<uint32_t>(rank_at_.size()); }
  [[nodiscard]] uint32_t ports() const { return static_cast<uint32_t>(endpoints_.size()); }
  /// The endpoint of port `i` (its peers are the workers of that port, in
  /// rank order). Its _st functions belong to the net core.
  [[nodiscard]] transport::Endpoint& endpoint(uint32_t port) { return *endpoints_[port]; }
  /// Port `i`. Its gauges may be read from any thread.
  [[nodiscard]] net::PacketPort& port(uint32_t i) { return *ports_[i]; }
  /// The global shard ids this node runs, in shard order.
  [[nodiscard]] const std::vector<uint32_t>& own_shards() const { return own_shards_; }
  /// The shard with global id `global_id` if this node runs it (null otherwise,
  /// or before the placement). With shard cores, read its table only after stop().
  [[nodiscard]] const Shard* shard(uint32_t global_id) const;
  /// Background checkpoints (ServerNodeConfig::checkpoints): what a
  /// CheckpointWriter reads, from any thread; null when off.
  [[nodiscard]] CheckpointSources* checkpoint_sources() { return checkpoints_.get(); }
  /// The lcore running shard `global_id` (-1 inline or not ours).
  [[nodiscard]] int shard_lcore(uint32_t global_id) const;
  /// Flow control of port `port`: the buffers of its packets the
  /// aggregation path owns now, and the limit (0 until derived, see
  /// ServerNodeConfig).
  [[nodiscard]] uint64_t aggregation_mbufs_st(uint32_t port) const;
  [[nodiscard]] uint64_t flow_limit_st(uint32_t port) const {
    MERCURY_OWNED(owner_);
    return flow_[port].limit;
  }
  /// Over a port's limit, the most buffers marked to be copied that may be
  /// owned on top of it, waiting for a shard core (inline shards copy and
  /// free each at once).
  [[nodiscard]] uint64_t copy_budget_st(uint32_t port) const {
    MERCURY_OWNED(owner_);
    return flow_[port].copies;
  }

 private:
  class PortReceiver;
  class PortPoller;
  class ShardsPoller;
  class ControlPoller;
  struct Stage {
    std::array<ShardItem, 32> items;
    uint32_t count = 0;
  };
  struct Address {
    uint16_t port;
    uint16_t peer;
  };
  // Flow control of one port (net core): buffers handed to the aggregation
  // path so far, and the limit.
  struct PortFlow {
    uint64_t handed = 0;
    uint64_t limit = 0;          // 0: not derived yet
    uint64_t copies = 0;         // marked copies allowed over the limit
    const void* pool = nullptr;  // where its packets arrive, once seen
    uint32_t workers = 1;        // workers behind the port
    net::QueueFacts queues;      // its descriptor rings
  };

  void check_config(uint32_t workers) const;
  void open_ports(std::vector<net::PacketPort*> ports, const std::vector<JobWorker>& workers,
                  transport::Tick now);
  void launch_cores();
  std::string start_shards(const agg::Placement& placement);
  // A checkpoint of this server against the placement (agg::check_server_state):
  // throws std::invalid_argument naming the file and what differs.
  void check_checkpoint(const CheckpointFile& f, const agg::Placement& placement) const;
  void build_shards(const agg::Placement& placement);
  static void check_levels(const agg::Placement& placement);

  // The pollers' passes (net core).
  uint32_t poll_shards_st();
  uint32_t poll_port_st(uint32_t port, transport::Tick now);
  uint32_t poll_control_st(transport::Tick now);
  void slow_st(transport::Tick now);

  // Datapath (net core).
  bool admit_st(uint32_t port, uint16_t peer, const wire::HeaderFields& h);
  bool on_packet_st(uint32_t port, uint16_t peer, const wire::HeaderFields& h,
                    std::span<const std::byte> payload, net::PacketBuf* buf);
  void derive_flow_limit_st(uint32_t port, net::PacketBuf* buf);
  // The index in shards_ of the shard owning block `key`, or -1 (counted
  // kNotOurs) for no block or another node's.
  int32_t slot_of_st(uint32_t key);
  void flush_st(uint32_t slot);
  void count(ServerDrop d) { ++drops_[static_cast<size_t>(d)]; }
  // Settings and the job's state (job_state.h): runs `task` on the shard in
  // `slot`, inline at once or through its core's ring.
  void submit_task_st(uint32_t slot, ShardTask& task);
  void poll_job_state_st();

  // Control messages (net core, allocates): node::ControlChannel's handler.
  void on_control_st(uint32_t rank, agg::ControlMessage&& m) override;
  void on_control_failed_st(uint32_t peer, const transport::SendResult&) override;
  void on_control_delivered_st(uint32_t peer, agg::ControlKind kind) override;
  void check_liveness_st();
  // A worker's transport came back with a new epoch (its process restarted):
  // noted here on the datapath (a bit, nothing else), handed to the control
  // plane by handle_restarts_st() after the endpoints' pass, or before the
  // next control message, whichever comes first.
  void on_worker_restarted_st(uint16_t peer) {
    if (peer < control_->peers()) restarted_ |= uint64_t{1} << peer;
  }
  // A hot standby (docs/durability.md): the other node of the pair is the
  // control channel's peer after the ranks, `partner_rank()`, reached
  // through port 0 as transport peer partner_peer_.
  [[nodiscard]] uint32_t partner_rank() const { return static_cast<uint32_t>(rank_at_.size()); }
  // Peer `peer` of the control plane (a rank's, a spare's, or the partner):
  // sent heartbeats and judged by liveness.
  [[nodiscard]] bool active_st(uint32_t peer) const {
    if (peer >= rank_at_.size() && config_.standby != Standby::kNone) {
      return partner_alive_ && pair_started_;
    }
    const std::optional<uint32_t> rank = control_->rank_of_peer(peer);
    return rank ? control_->in_job(*rank) : control_->spare_waits(peer);
  }
  // The rank control-plane peer `peer` speaks for now (kNoRank: none).
  static constexpr uint16_t kNoRank = UINT16_MAX;
  [[nodiscard]] uint16_t rank_of_peer_st(uint16_t peer) const {
    return peer < speaks_for_.size() ? speaks_for_[peer] : kNoRank;
  }
  // A spare took rank `rank` over: its peer `peer` speaks for it.
  void take_over_st(uint16_t rank, uint32_t peer);
  // speaks_for_ from the control plane's map (at the start, after a takeover).
  void map_peers_st();
  // Where control-plane peer `peer` (a rank's node or a spare) is reached.
  [[nodiscard]] Address address_of_peer(uint32_t peer) const {
    return peer < rank_at_.size() ? rank_at_[peer] : spare_at_[peer - rank_at_.size()];
  }
  bool on_partner_packet_st(const wire::HeaderFields& h, std::span<const std::byte> payload);
  void on_partner_lost_st();
  void promote_st();
  // Primary: a worker has the kStandbyLost sent to it (or is gone); once
  // every one has, the updates go out unreplicated.
  void standby_notice_settled_st(uint32_t peer);
  void send_standby_notices_st();
  // A worker refused this standby's promotion (it still reaches the
  // server): from then on it serves nothing (server_node.cpp).
  void on_promotion_refused_st(uint32_t peer, const agg::ControlMessage& m);
  // Whether rank's control message `kind` is one a standby whose promotion
  // was refused drops: all but heartbeats, settings and the leave.
  [[nodiscard]] static bool served_only_st(agg::ControlKind kind);
  // Tells each rank that sent this standby something to serve since its
  // promotion was refused (kRefused, once each).
  void tell_not_serving_st();
  void handle_restarts_st();
  // Detaches the ports whose workers all left (PortLeave).
  void detach_left_ports_st();
  static constexpr uint64_t kDetachWaitMs = 100;
  // After every control-plane call: the state the datapath reads, and the
  // control plane's answers sent.
  void sync_state_st();
  void send_replies_st();
  // The job's start builds the shards inside a port's receive pass, for
  // seconds on a loaded machine, and that pass's time is as stale: what it
  // sent would be stamped with it, the transport's liveness clock started
  // that far in the past, and a worker named lost before its
  // acknowledgement could arrive. The start's replies (kReady) wait for the
  // control poller, after the ports' passes; the next pass stamps them.
  bool replies_wait_ = false;
  // Each rank that went out of an asynchronous job (or a BSP job that
  // shrinks) or joined it, in order:
  // a kRemove or kJoin task to every shard, run on its thread
  // (Shard::remove_rank_st, join_rank_st; docs/membership.md).
  void change_membership_st(const std::vector<ControlPlane::MembershipChange>& changes);

  base::Owner owner_;  // the net core
  ServerNodeConfig config_;
  std::vector<uint32_t> own_shards_;  // the global ids this node runs
  uint32_t total_shards_ = 0;
  transport::Tick now_ = 0;              // the current pass's time
  std::optional<ControlPlane> control_;  // set by the constructors
  // The control plane's state as the datapath reads it per packet (after
  // every control-plane call, sync_state_st()).
  bool running_ = false;
  bool link_schedule_started_ = false;
  bool any_left_ = false;     // a rank left: under BSP no push can be aggregated any more
  uint64_t removed_bsp_ = 0;  // ranks removed from a BSP job that shrank: their pushes dropped
  const agg::Placement* placement_ = nullptr;
  // A push came after a leave: rank + 1 (0: none), ended by the control poller.
  uint32_t push_after_leave_ = 0;
  // Bit p: control-plane peer p (a rank's or a spare's) restarted, not yet
  // handed to the control plane.
  uint64_t restarted_ = 0;
  static_assert(agg::kMaxWorkers <= 64, "restarted_ holds a bit per peer, spares included");
  // Per control-plane peer, the rank it speaks for (kNoRank: a spare that
  // waits, or a rank's node after a spare took the rank): what the
  // datapath reads per packet (ControlPlane::rank_of_peer, after every
  // takeover).
  std::vector<uint16_t> speaks_for_;

  std::vector<net::PacketPort*> ports_;
  const net::BufferOps* buffers_ = nullptr;  // the ports' (all of one kind)
  std::vector<std::unique_ptr<PortReceiver>> receivers_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::optional<node::ControlChannel> control_channel_;  // after the endpoints it sends through
  std::vector<Address> rank_at_;                         // rank -> (port, peer), as started
  std::vector<Address> spare_at_;                        // spare -> (port, peer)
  std::vector<std::string> rank_name_;                   // rank -> peer name
  std::vector<std::unique_ptr<ShardCore>> cores_;        // before the shards: stopped first
  std::vector<std::unique_ptr<Shard>> shards_;           // after the endpoints they send through
  std::vector<const StartedSets*> started_;  // per shard: what it publishes for admit_st
  std::vector<int32_t> shard_slot_;          // global shard id -> index in shards_, or -1
  // Settings and the job's state; its tasks run on the shards (after them:
  // destroyed first, once stop() has finished what the cores held).
  std::optional<JobState> job_state_;
  std::vector<ControlReply> job_state_unsent_;  // answers the endpoint did not queue yet
  // Asynchronous jobs: a rank out of the job or joining it, one kRemove or
  // kJoin task per shard (kept until the shard ran it; docs/membership.md).
  std::vector<std::unique_ptr<ShardTask>> removals_;
  // BSP, on_worker_loss wait: a new process joining. Each shard's least
  // version first (kLeast); their least is the iteration in progress,
  // which kJoined carries; once the process has it (acknowledged), each
  // shard sends it that version and the next (kRejoin).
  struct BspJoin {
    uint16_t rank = 0;
    uint32_t version = 0;
    enum class Phase : uint8_t { kLeast, kAnswered, kSending } phase = Phase::kLeast;
    std::vector<std::unique_ptr<ShardTask>> tasks;
  };
  std::vector<BspJoin> bsp_joins_;
  void poll_bsp_joins_st();
  // One task of `kind` for rank `rank` on every shard, into `into`.
  void task_every_shard_st(std::vector<std::unique_ptr<ShardTask>>& into, ShardTask::Kind kind,
                           uint16_t rank, uint32_t version);
  // Several servers, another one resumed from its checkpoint
  // (docs/durability.md, "Several servers"; server_node_rollback.cpp): every
  // rank asks this one to roll back to the version it resumed at
  // (kRollback). From the first ask the node drops every gradient
  // (kRollingBack) and each shard drops what it holds and owes (kRewind).
  // The node's version is the newest it has a checkpoint of at or before
  // every version asked (`file`, read at once); a rank that asked for a
  // newer one is told it (kRollback back), and asks every server for it.
  // Once every rank asked for it, the rewinds are done and the endpoints
  // have nothing in flight (no update of a version past it can still reach
  // a worker), each shard restores its chunks from the file (kRollBack) and
  // sends them to every worker.
  struct Rollback {
    uint32_t version = 0;  // the node's version, once `file` is read
    uint64_t asked = 0;    // bit r: rank r asked for it
    std::shared_ptr<const CheckpointFile> file;
    std::vector<std::unique_ptr<ShardTask>> rewinds;
  };
  std::optional<Rollback> rollback_;
  bool rolling_back_ = false;  // what the datapath reads: gradients dropped
  void on_rollback_st(uint16_t rank, const agg::ControlMessage& m);
  void poll_rollback_st();
  // This server's newest checkpoint at or before `version`, read and
  // checked; throws std::exception naming what is wrong (none: the versions
  // it has).
  std::shared_ptr<const CheckpointFile> rollback_file(uint32_t version) const;
  void refuse_st(std::string why);
  bool seeded_ = false;  // the job resumes from a checkpoint: no kInit
  // Background checkpoints: the plan and the shards' snapshots the
  // Runner's writer reads (null when off).
  std::unique_ptr<CheckpointSources> checkpoints_;
  // --resume: the shards restore config_.resume once every kReady is acknowledged.
  bool own_resume_pending_ = false;
  std::vector<Stage> stages_;   // per shard core: items not yet enqueued
  std::vector<PortFlow> flow_;  // per port
  // Per port: its workers' ranks, and whether it is detached because they
  // all left (a port that detaches then: net_memif; docs/server.md, "The end
  // of a job"). kLeaving until the answers to their leaves are out; back to
  // kPolled when the link went down and came up (a new peer).
  struct PortLeave {
    enum State : uint8_t { kPolled, kLeaving, kDetached };
    uint64_t ranks = 0;
    transport::Tick since = 0;  // kLeaving: when the last of them left
    State state = kPolled;
    bool detaches = false;
    bool saw_down = false;        // kDetached: the link went down since
    bool attached_again = false;  // detached once, attached again: stays polled
  };
  std::vector<PortLeave> leaves_;
  // A hot standby: the partner's transport peer on port 0, whether it is
  // alive (liveness has not named it), whether the pair heartbeat each
  // other yet, whether this standby serves, and the lines for the node's
  // output. The two build their shards each on its own time, for seconds
  // when the machine is loaded, and a node that builds acknowledges nothing:
  // a heartbeat to a partner still building would name it lost. So each
  // heartbeats (and judges) the other from the job's first data on, when
  // both have answered every worker: the primary from rank 0's first
  // initial value or a gradient, the standby from its primary's first
  // replica or heartbeat (docs/durability.md, "Start").
  uint16_t partner_peer_ = 0;
  bool partner_alive_ = false;
  bool pair_started_ = false;
  bool promoted_ = false;
  // A worker refused the promotion: nothing served from then on; per rank,
  // 1 = sent something to serve (to be told, on the slow path), 2 = told.
  bool promotion_refused_ = false;
  std::vector<uint8_t> not_served_;
  uint64_t promotions_refused_ = 0;
  // Primary, its standby lost: per control peer, 2 while its kStandbyLost
  // is to be sent, 1 while unacknowledged; how many are either.
  std::vector<uint8_t> notice_waits_;
  uint32_t notices_unsettled_ = 0;
  uint64_t promotions_ = 0, standbys_lost_ = 0, rollbacks_ = 0;
  std::vector<std::string> notices_;
  bool detach_pending_ = false;             // a port is kLeaving
  std::optional<BufferReleases> releases_;  // the node's own frees of handed buffers
  std::array<uint64_t, kServerDropCount> drops_{};
  // The node's pollers, once attached, and their loop.
  std::vector<std::unique_ptr<node::Poller>> pollers_;
  node::Loop* loop_ = nullptr;
};

}  // namespace mercury::server
