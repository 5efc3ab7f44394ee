// A parameter server node: its ports towards the workers (one transport
// endpoint per port, one transport peer per worker behind it), the job's
// control plane (declare, ready/refused, barrier: agg/control.h), and the
// node's shards (server::Shard), run inline on the polling core or each on a
// shard core of its own (server::ShardCore).
//
// Life of a node.
//  * Waiting: built from the job (its workers, ports, and every server
//    node's shard count), it answers nothing but control messages. Each
//    worker sends kDeclare (its rank and tensor list); when every rank has
//    declared and the lists agree, the node computes agg::Placement (global
//    shard count = sum of the job's server shard counts; this node runs the
//    global ids after those of the servers before it in the job file), builds
//    its shards, answers every worker kReady(fingerprint, shards) and runs.
//    Lists that differ, priorities that are not scheduler levels, or shards
//    that cannot be built put the node in Refused: every worker is answered
//    kRefused with the reason, now and whenever it declares again.
//  * Running: rank 0's kInit packets give each chunk its initial values
//    (version 0, sent to every worker); kData packets (gradients) aggregate;
//    each update goes to every worker. Server 0 (server_index 0) also runs
//    the job's barrier: kBarrier(rank, generation) from every rank, then
//    kBarrierDone(generation) to every rank.
// The placement-taking constructor starts in Running (tests, and jobs whose
// placement is known in advance).
//
// Ranks. A worker's rank is its index in the job's worker list; the node
// maps (port, transport peer) to it, so several workers may sit behind one
// port (one endpoint with several peers, e.g. a bridge) and a worker per
// port works as well. A declare or barrier whose rank field is not the
// sender's rank is refused (kRefused to that worker, naming both).
//
// Threads. Everything ending in _st, and the control plane, belong to the
// net core that calls poll_st(). With shard lcores configured, gradient and
// init packets go to each shard's core through an SP/SC ring (ShardCore); the
// shards fan out from there (Endpoint::send_slice is lock-free). The
// constructors and stop() are control path: with shard lcores they must run
// on the EAL main lcore. Construction throws std::invalid_argument naming
// what is wrong; building the shards when the last declare arrives never
// throws (a failure refuses the job, with the reason).
//
// Flow control. A worker's gradient packet is admitted by the transport
// (PacketReceiver::admit, before it is acknowledged) while the mbufs its
// port's packets keep in the aggregation path are below flow_limit, or when
// it joins a chunk's set that other ranks have started (completing it, with
// two workers): those never wait, so every started set can complete and
// free its mbufs. A refused packet is resent by its worker later. So a
// worker running ahead cannot exhaust the pool the slower ones' packets
// need (docs/server.md, "Flow control").
//
// Costs per packet on the net core: the endpoint's, a rank lookup, a
// partition lookup, then either the shard's contribute (inline) or a 32-byte
// ring item (shard cores); admitting a gradient reads the releases of every
// shard of the node (one relaxed load each) and, over the limit, the chunk's
// held-rank bitmap. Nothing on the datapath allocates, locks, throws
// or logs; every drop is counted by reason (ServerDrop, the chunk table's
// outcomes, the endpoints' drops). Control messages allocate (control path).
// Memory beyond the endpoints and chunk tables: per shard a fan-out backlog
// of 16 B x fanout_backlog (default chunks x workers: 2.3 MB for half of
// ResNet-50 with 4 workers), per shard core a ring of 32 B x ring_entries
// (rounded up to a power of two).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "agg/sync_policy.h"
#include "net/interface.h"
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

/// The interface towards one worker (rank = its index) and that worker: the
/// one-port-per-worker layout, for the placement-taking constructor.
struct WorkerLink {
  net::Interface* iface = nullptr;
  transport::PeerSpec worker;
};

struct ServerNodeConfig {
  uint32_t chunk_bytes = 0;        ///< net::payload_per_packet(mtu), as on every node
  agg::OptimizerConfig optimizer;  ///< applied to every chunk update
  /// Control-plane constructor: every server node's shard count, in job-file
  /// order (global shard count = the sum), and this node's index there.
  /// Server 0 also runs the barrier.
  std::vector<uint32_t> job_shards;
  uint32_t server_index = 0;
  /// Placement-taking constructor only: the global shards this node runs.
  std::vector<uint32_t> shard_ids;
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
};

enum class NodeState : uint8_t {
  kWaiting,  ///< waiting for every rank's declare
  kRunning,  ///< placement built, shards serving
  kRefused,  ///< the job cannot start: refusal_st() says why
  kStopped,  ///< stop() ran with shard cores: nothing is served any more
};
std::string_view node_state_name(NodeState s);

/// Why the node itself dropped a packet or a control message.
enum class ServerDrop : uint8_t {
  kNotRunning,      ///< a gradient or init packet while waiting or refused
  kNotOurs,         ///< a key of no partition, or of a shard this node does not run
  kInitNotRank0,    ///< a kInit packet from a rank other than 0
  kBadType,         ///< a packet type a server does not take (kAggData, ...)
  kShardRingFull,   ///< a shard core's ring was full (cannot happen when sized; the chunk is lost)
  kControlTooBig,   ///< a control message over max_control_bytes
  kBadControl,      ///< a control message that does not decode, or of a kind servers do not take
  kWrongRank,       ///< a declare/barrier whose rank is not the sender's (answered kRefused)
  kBarrierNotHere,  ///< a barrier sent to a server other than server 0
  kReplyNotQueued,  ///< the endpoint did not queue a control answer
  kCount,
};
inline constexpr size_t kServerDropCount = static_cast<size_t>(ServerDrop::kCount);
std::string_view server_drop_name(ServerDrop d);

struct ControlCounters {
  uint64_t declares = 0;            ///< declares received (all)
  uint64_t declares_repeated = 0;   ///< ... from a rank that had declared already
  uint64_t declares_refused = 0;    ///< ... answered kRefused
  uint64_t barriers = 0;            ///< barrier arrivals received (all)
  uint64_t barriers_repeated = 0;   ///< ... for a generation the rank had already reached
  uint64_t barriers_completed = 0;  ///< generations every rank reached
  uint64_t replies = 0;             ///< control messages queued to workers
  uint64_t workers_lost = 0;        ///< ranks the transport declared dead while running
};

struct ServerCounters {
  ShardCounters shards;                                 ///< summed over the node's shards
  std::array<uint64_t, agg::kOutcomeCount> outcomes{};  ///< chunk tables' outcomes, summed
  uint64_t held = 0;                                    ///< contributions held now
  uint64_t aggregation_mbufs = 0;  ///< mbufs the aggregation path owns now (queued or held)
  std::array<uint64_t, kServerDropCount> drops{};  ///< the node's own drops
  ControlCounters control;
  transport::EndpointCounters net;  ///< summed over the endpoints
  [[nodiscard]] uint64_t drop(ServerDrop d) const { return drops[static_cast<size_t>(d)]; }
  [[nodiscard]] uint64_t packets_in() const { return net.rx_packets; }
  [[nodiscard]] uint64_t packets_out() const {
    return net.tx_data + net.tx_retransmits + net.tx_pure_acks;
  }
};

class ServerNode {
 public:
  /// Control plane: waits for every worker's declare. `ports` must outlive
  /// the node; workers[r] is rank r (1..agg::kMaxWorkers of them), and every
  /// port has at least one worker. config.job_shards / server_index say
  /// which shards this node runs.
  ServerNode(std::vector<net::Interface*> ports, std::vector<JobWorker> workers,
             const ServerNodeConfig& config, transport::Tick now);
  /// Placement given: running at once, one port per worker, the shards of
  /// config.shard_ids. `placement` must outlive the node, and its
  /// partitions' priorities must be scheduler levels (< 64): compute it from
  /// the workers' worker::TensorTable::declarations(), which map priorities
  /// onto levels.
  ServerNode(const agg::Placement& placement, std::vector<WorkerLink> links,
             const ServerNodeConfig& config, transport::Tick now);
  ~ServerNode();
  ServerNode(const ServerNode&) = delete;
  ServerNode& operator=(const ServerNode&) = delete;

  /// Net core: one pass over every endpoint; returns the work done (0 = idle).
  uint32_t poll_st(transport::Tick now);

  /// Control path, main lcore: stops the shard cores (joins them, frees the
  /// mbufs queued to them). The node serves nothing afterwards; the
  /// destructor also does it. Idempotent.
  void stop();

  [[nodiscard]] NodeState state_st() const { return state_; }
  /// Why the node is kRefused ("" otherwise).
  [[nodiscard]] const std::string& refusal_st() const { return refusal_; }
  /// The placement once running (null before).
  [[nodiscard]] const agg::Placement* placement_st() const { return placement_; }
  [[nodiscard]] ServerCounters counters_st() const;
  [[nodiscard]] uint32_t workers() const { return static_cast<uint32_t>(rank_at_.size()); }
  [[nodiscard]] uint32_t ports() const { return static_cast<uint32_t>(endpoints_.size()); }
  /// The endpoint of port `i` (its peers are the workers of that port, in rank order).
  [[nodiscard]] transport::Endpoint& endpoint(uint32_t port) { return *endpoints_[port]; }
  /// The shard with global id `global_id` if this node runs it (null otherwise,
  /// or before the placement). With shard cores, read its table only after stop().
  [[nodiscard]] const Shard* shard(uint32_t global_id) const;
  /// The lcore running shard `global_id` (-1 inline or not ours).
  [[nodiscard]] int shard_lcore(uint32_t global_id) const;
  /// Flow control of port `port`: the mbufs of its packets the aggregation
  /// path owns now, and the limit (0 until derived, see ServerNodeConfig).
  [[nodiscard]] uint64_t aggregation_mbufs_st(uint32_t port) const;
  [[nodiscard]] uint64_t flow_limit_st(uint32_t port) const { return flow_[port].limit; }

 private:
  class PortReceiver;
  struct Stage {
    std::array<ShardItem, 32> items;
    uint32_t count = 0;
  };
  struct Address {
    uint16_t port;
    uint16_t peer;
  };
  // Flow control of one port (net core): mbufs handed to the aggregation
  // path so far, the DPDK port id they are counted under, and the limit.
  struct PortFlow {
    uint64_t handed = 0;
    uint64_t limit = 0;                 // 0: not derived yet
    const rte_mempool* pool = nullptr;  // where its packets arrive, once seen
    uint16_t port_id = 0;
    uint32_t workers = 1;  // workers behind the port
  };

  void open_ports(std::vector<net::Interface*> ports, const std::vector<JobWorker>& workers,
                  const ServerNodeConfig& config, transport::Tick now);
  void launch_cores();
  void build_shards(const agg::Placement& placement);
  static void check_levels(const agg::Placement& placement);

  // Datapath (net core).
  bool admit_st(uint32_t port, uint16_t rank, const wire::HeaderFields& h);
  bool on_packet_st(uint32_t port, uint16_t rank, const wire::HeaderFields& h,
                    std::span<const std::byte> payload, rte_mbuf* mbuf);
  void derive_flow_limit(PortFlow& f, const rte_mbuf* mbuf);
  void flush_st(uint32_t slot);
  void count(ServerDrop d) { ++drops_[static_cast<size_t>(d)]; }

  // Control plane (net core, allocates).
  std::byte* control_begin(uint16_t rank, const wire::HeaderFields& h);
  void control_complete(uint16_t rank, std::byte* buffer, uint32_t len);
  void control_abandoned(std::byte* buffer);
  void on_declare(uint16_t rank, agg::ControlMessage& m);
  void on_barrier(uint16_t rank, const agg::ControlMessage& m);
  bool sender_is(uint16_t rank, uint32_t claimed, const char* what);
  void start_job();
  void check_liveness_st();
  static constexpr uint64_t kLivenessEvery = 1024;  // poll passes between liveness checks
  uint64_t passes_ = 0;
  void refuse_job(std::string why, bool answering_declares = true);
  void reply(uint16_t rank, const agg::ControlMessage& m);
  void reply_ready(uint16_t rank);
  static void on_reply_done(void* self, const transport::SendResult& r);

  ServerNodeConfig config_;
  std::vector<uint32_t> own_shards_;  // the global ids this node runs
  uint32_t total_shards_ = 0;
  std::optional<agg::Placement> owned_placement_;
  const agg::Placement* placement_ = nullptr;
  NodeState state_ = NodeState::kWaiting;
  std::string refusal_;

  std::vector<std::unique_ptr<PortReceiver>> receivers_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<Address> rank_at_;                   // rank -> (port, peer)
  std::vector<std::string> rank_name_;             // rank -> peer name
  std::vector<std::unique_ptr<ShardCore>> cores_;  // before the shards: stopped first
  std::vector<std::unique_ptr<Shard>> shards_;     // after the endpoints they send through
  std::vector<int32_t> shard_slot_;                // global shard id -> index in shards_, or -1
  std::vector<Stage> stages_;                      // per shard core: items not yet enqueued
  std::vector<PortFlow> flow_;                     // per port
  MbufReleases releases_;                          // the node's own frees of handed mbufs
  std::array<uint64_t, kServerDropCount> drops_{};

  // Control plane state.
  std::vector<std::optional<std::vector<agg::TensorDecl>>> declared_;  // per rank
  std::optional<std::vector<agg::TensorDecl>> job_tensors_;  // the list the placement came from
  std::map<const std::byte*, std::unique_ptr<std::byte[]>> inbox_;  // messages being received
  std::map<uint64_t, std::vector<std::byte>> outbox_;               // answers in flight
  uint64_t next_cookie_ = 1;
  std::map<uint64_t, uint64_t> barrier_arrived_;  // generation -> rank bitmap
  uint64_t barrier_floor_ = 0;                    // every generation below is complete
  std::set<uint64_t> barrier_completed_;          // complete generations >= the floor
  ControlCounters control_;
};

}  // namespace mercury::server
