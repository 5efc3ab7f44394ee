// NetCore: the worker's net core, the one thread of a trainer process that
// touches the network. It owns the worker's transport endpoint towards the
// servers and the pull and push trackers, drains the trainer threads'
// RequestQueue, runs the start-up protocol (agg/control.h) and the barrier,
// and completes every Handle.
//
// The net core is a poller of a node::Loop (loop.h). One pass, poll_st(now):
// take up to kRequestBurst requests; one pass of the endpoint (receive:
// aggregated chunks go through on_packet() into the PullTracker, which writes
// them into the trainer's buffers; timers; transmit); queue the pushes that
// can go; complete the pulls whose version is in. Returns the work done.
// Every kSlowMs, slow_st(now): the start deadline, dead servers, heartbeats,
// publishing counters. The loop may sleep only while the request queue is
// empty (may_sleep_st), on its doorbell, which a trainer thread rings after
// each request.
//
// Who runs it: the Worker's own thread runs a loop of its own, which the net
// core ends once it has stopped (attach(loop, true)); a PolledWorker
// (worker/attach.h) is a poller on its owner's loop, beside other nodes (the
// PMD tests, ps-demo, ps_bench, the unit tests).
//
// Threads: poll_st() and everything else here belong to the thread that
// runs the net core's loop (asserted: base/owner.h). The trainer side
// (worker.cpp) only enqueues Requests. The TensorTable is frozen before the net core sees a kStart
// and is not shut down before the kStop has been taken.
//
// Memory: the request queue, the trackers (pull_tracker.h), the endpoint
// (transport/endpoint.h), and per tensor one push slot; the pending pull and
// push lists are reserved for 8 entries per tensor at start and fail
// requests beyond that with a clear message (never grown on the datapath).
// Control messages (declare, barrier) go through a node::ControlChannel:
// control path, allocates. Per aggregated chunk received: one
// virtual call and PullTracker::deliver_st().
//
// Files: net_core.cpp (the pass, requests, start, slow work, counters),
// net_core_transfer.cpp (push, pull, barrier, received chunks),
// net_core_control.cpp (control messages in and out), net_core_state.cpp
// (settings, the job's state, a resume), net_core_recover.cpp (a lost
// server waited for), net_core_standby.cpp (a server's hot standby).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "agg/control.h"
#include "agg/placement.h"
#include "base/counter_list.h"
#include "config/config.h"
#include "mercury/handle.h"
#include "mercury/worker.h"
#include "net/packet_port.h"
#include "node/control_channel.h"
#include "node/idle.h"
#include "node/loop.h"
#include "transport/endpoint.h"
#include "worker/pull_tracker.h"
#include "worker/request_queue.h"
#include "worker/tensor_table.h"
#include "worker/timeline.h"

namespace mercury::worker {

/// One server of the job as this worker sees it.
struct ServerSpec {
  transport::PeerSpec peer;  ///< name, address
  uint32_t shards = 0;       ///< global shards it runs (the ones after the servers before it)
  /// Its hot standby (docs/durability.md, "A hot standby"), if it has one:
  /// declared to and answered like a server, sent nothing else until it
  /// says it took over (kPromoted); then it gets the server's traffic.
  std::optional<transport::PeerSpec> standby;
};

struct NetCoreConfig {
  uint32_t rank = 0;
  /// A spare worker (`spare: true`; docs/membership.md, "Spare workers"):
  /// no rank at the start. start() announces it to server 0 and waits,
  /// without start_timeout_ms, until server 0 gives it a removed rank (it
  /// then joins as that rank) or the job's end releases it.
  bool spare = false;
  uint32_t workers = 1;
  std::vector<ServerSpec> servers;     ///< job-file order
  uint32_t chunk_bytes = 0;            ///< payload bytes per packet (the job's MTU)
  transport::EndpointConfig endpoint;  ///< peers: set from `servers`
  PullTrackerConfig pulls;
  uint32_t start_timeout_ms = 30'000;
  node::IdleOptions idle;            ///< the loop's idle policy (the node's poll mode)
  uint32_t request_capacity = 4096;  // cells of ~100 B; a full queue makes callers yield
  /// The job's training.optimizer as the YAML spells it: whether the servers'
  /// versions are parameters (sgd, momentum, adam) or the averaged gradient
  /// (sum). The net core does not use it; Worker::optimizer() reports it.
  std::string optimizer = "sgd";
  /// training.sync and, for ssp, its bound: what a pull waits for and when a
  /// push may go (docs/worker.md, "Modes"). pulls.async must be set for all
  /// but bsp.
  config::Sync sync = config::Sync::kBsp;
  uint32_t staleness_bound = 0;
  /// How the tensors are cut into blocks: the servers' (job::placement_options).
  agg::PlacementOptions placement;
  /// Non-null: the net core marks every data push's and version's phases
  /// there (timeline.h). Owned by the Worker, outlives the core.
  Timeline* timeline = nullptr;
  /// The servers' optimizer (job::optimizer_config): its kind and decay,
  /// which a resumed state and changed settings must fit, and the job
  /// file's hyperparameters, Worker::hyperparameters() until changed.
  agg::OptimizerConfig optimizer_config;
  /// network.on_server_loss wait: a server named lost (or seen restarted)
  /// abandons what is pending and is waited for, at most server_wait_ms;
  /// when it answers the declarations again the job rolls back to its
  /// version (docs/worker.md, "Errors"). Otherwise a lost server
  /// breaks the worker.
  bool wait_for_servers = false;
  uint32_t server_wait_ms = 60'000;

  [[nodiscard]] uint32_t total_shards() const {
    uint32_t n = 0;
    for (const auto& s : servers) n += s.shards;
    return n;
  }
};

/// Rank 0's resume from a job's state file (Worker::resume_from): the
/// version the job starts at and, per server in job-file order, the pages
/// of records it is sent (agg/shard_state.h), each at most
/// agg::kStatePageBytes, the hyperparameter record first.
struct Resume {
  uint32_t version = 0;
  std::vector<std::vector<std::vector<std::byte>>> pages;  // [server][page]
};
/// Checks `state` against the frozen `table` and the job (agg::check_state)
/// and cuts it into each server's pages. Throws UsageError naming what is
/// wrong. Control path.
std::shared_ptr<const Resume> make_resume(const TensorTable& table, const NetCoreConfig& config,
                                          std::span<const std::byte> state);

/// What a trainer thread asks of the net core.
struct Request {
  enum class Kind : uint8_t {
    kStart,
    kPush,
    kPull,
    kPushPull,
    kBarrier,
    kStop,
    kSettings,
    kState,
    kRollBack
  };
  Kind kind = Kind::kStop;
  TensorId tensor = 0;
  uint32_t iteration = 0;  ///< kPush, kPushPull: the version the gradient was computed from
  uint32_t version = 0;    ///< kPull, kPushPull: the version wanted (its pushes so far)
  /// kPull: wait until every chunk is at least this version (0 with
  /// has_min false: none beyond the mode's rule).
  uint32_t min_version = 0;
  bool has_min = false;
  uint64_t generation = 0;  ///< kBarrier
  /// The gradient and the pull's output: the tensor's elements (its dtype).
  const std::byte* grad = nullptr;
  std::byte* out = nullptr;
  Handle handle;               ///< what the trainer holds
  std::optional<Handle> push;  ///< kPushPull: its push part
  /// kPush, kPushPull, asynchronous modes: 1 + the version the trainer
  /// read before computing the gradient (Worker::mark_read), 0 = none (the
  /// version the tensor's last pull delivered).
  uint32_t marked = 0;
  /// Settings and the job's state (net_core_state.cpp): kSettings' values;
  /// kState's output, the caller's, alive until the handle completes;
  /// kStart's resume (rank 0), or null.
  agg::Hyperparameters values;
  std::vector<std::byte>* state_out = nullptr;
  std::shared_ptr<const Resume> resume;
  /// The rollbacks the trainer side had acknowledged when it made the
  /// request (Worker::roll_back): a request from before the latest
  /// rollback counts versions the job no longer has, and fails.
  uint32_t rollbacks = 0;
};

/// The PMD's drop counters (net::PortDrops), by name, in its order.
inline constexpr base::CounterInfo kPmdDrops[] = {MERCURY_PORT_PMD_DROPS(MERCURY_COUNTER_DESCRIBE)};
inline constexpr size_t kPmdDropCount = std::size(kPmdDrops);

/// What the net core publishes for the trainer side: counters for
/// Worker::stats() (relaxed atomics), and the full text of the failure that
/// broke the worker (a Handle holds at most kMaxErrorBytes of it).
struct PublishedStats {
  std::atomic<uint64_t> pushes{0}, pulls{0}, bytes_pushed{0}, chunks_received{0}, bytes_placed{0},
      versions_completed{0}, retransmits{0}, chunks_dropped{0}, control_dropped{0},
      staleness_sum{0}, stale_pushes{0}, staleness_max{0}, ssp_waits{0}, ssp_gap_max{0},
      workers_removed{0}, workers_left{0}, standby_takeovers{0}, tensors_resent{0},
      workers_joined{0};
  /// Drops by reason: the port's frames, the transport's packets, the PMD's
  /// (as of the net core's last read of them, every kPortStatsMs).
  std::array<std::atomic<uint64_t>, net::kDropReasonCount> port_drops{};
  std::array<std::atomic<uint64_t>, transport::kEndpointDropCount> transport_drops{};
  std::array<std::atomic<uint64_t>, kPmdDropCount> pmd_drops{};
  /// Per tensor, the version the last completed pull delivered
  /// (Worker::version), stored before the pull's handle completes. Set by
  /// the trainer side before it sends the start request.
  std::unique_ptr<std::atomic<uint32_t>[]> delivered;
  /// Asynchronous modes, per tensor: the version in the declared buffer
  /// now, the least over its chunks (Worker::mark_read), stored once the
  /// chunks that made it are fenced. Set like `delivered`.
  std::unique_ptr<std::atomic<uint32_t>[]> in_place;
  /// The version the job started at (kReady's: 0, or a resumed state's),
  /// or for a process that joined a running asynchronous job the clock it
  /// joined at, which its pushes count from; stored before the start's
  /// handle completes.
  std::atomic<uint32_t> start_version{0};
  /// This process joined a running job (docs/membership.md, "Joining"): the
  /// step it joined at (asynchronous: the slowest rank's clock, which its
  /// first pull's packets carry; bsp: the iteration in progress) and the
  /// first barrier generation it takes part in; stored with start_version,
  /// before the start's handle completes.
  std::atomic<bool> joined{false};
  std::atomic<uint32_t> joined_version{0};
  std::atomic<uint64_t> barrier_base{0};
  /// A spare worker (docs/membership.md, "Spare workers"): the rank it took
  /// over, stored before the start's handle completes; or released: the
  /// job ended without needing it (its start fails with the reason).
  std::atomic<uint32_t> rank{0};
  std::atomic<bool> released{false};
  /// Rollbacks done (a lost server came back, docs/worker.md "A lost
  /// server") and the version of the latest, stored (release, after the
  /// version) before the roll_back requests waiting for it complete.
  std::atomic<uint32_t> rollback_version{0};
  std::atomic<uint32_t> rollbacks{0};
  /// Written once by the net core (control path), before it fails the
  /// handles; read by the trainer after a handle failed.
  void set_failure(const std::string& why) {
    std::lock_guard lock(mutex);
    if (failure.empty()) failure = why;
  }
  std::string get_failure() const {
    std::lock_guard lock(mutex);
    return failure;
  }

 private:
  mutable std::mutex mutex;
  std::string failure;
};

// PacketReceiver first: the per-packet call needs no this-adjusting thunk.
class NetCore final : public transport::PacketReceiver,
                      public transport::MessageReceiver,
                      public node::Poller,
                      private node::ControlChannel::Handler {
 public:
  static constexpr uint32_t kRequestBurst = 64;
  /// Between two runs of the slow work.
  static constexpr uint32_t kSlowMs = 1;
  /// How long a memif link stays open after the servers acknowledged the
  /// leave (net::Port::linger).
  static constexpr std::chrono::milliseconds kLeaveLinger{50};
  /// How often the slow work reads the PMD's drop counters (a call into the
  /// PMD that may lock or make a system call: not every slow pass).
  static constexpr uint32_t kPortStatsMs = 100;
  /// Control messages are a few KB (a declaration list); anything larger is refused.
  static constexpr uint32_t kMaxControlBytes = 1u << 22;

  /// Control path. `port` must be polled by no other thread; `table`,
  /// `queue` and `stats` outlive the core.
  NetCore(const TensorTable& table, const NetCoreConfig& config, net::PacketPort& port,
          RequestQueue<Request>& queue, PublishedStats& stats);
  ~NetCore() override;

  /// Control path: the net core is a poller of `loop` from now on; with
  /// `ends_loop`, it ends the loop (Loop::stop_st) once it has stopped.
  void attach(node::Loop& loop, bool ends_loop);

  /// One pass (see the file comment) at TSC `now`; returns the work done
  /// (requests, packets, pushes queued, pulls completed: 0 = idle). The
  /// kStop request fails everything pending; a worker with nothing in flight
  /// then sends kLeave to every server and goes on polling its endpoint
  /// until they acknowledged it (at most a keepalive interval). Once the
  /// stop request has completed it does nothing and stopped_st() is true.
  uint32_t poll_st(transport::Tick now) override;
  /// The loop may sleep while no request waits.
  bool may_sleep_st() override { return queue_.empty_sc(); }
  /// Its sleeps stay short while frames wait on the port (staged, or in
  /// the link emulator's delay line, due at a time of their own).
  bool may_sleep_long_st() override { return port_.tx_pending() == 0; }
  [[nodiscard]] transport::Tick slow_period() const override {
    return config_.endpoint.transport.tsc_hz / 1000 * kSlowMs;
  }
  void slow_st(transport::Tick now) override;
  /// Whether a stop sends kLeave and waits for it (default true); false for
  /// a net core whose servers nobody polls while it stops.
  void set_leave_on_stop(bool leave) { leave_on_stop_ = leave; }
  [[nodiscard]] bool stopped_st() const {
    MERCURY_OWNED(owner_);
    return stopped_;
  }
  /// The endpoint towards the servers once started (null before): for the
  /// poller's diagnostics, on the net core's thread.
  [[nodiscard]] const transport::Endpoint* endpoint_st() const {
    MERCURY_OWNED(owner_);
    return endpoint_.get();
  }

  // transport::MessageReceiver: the servers' control messages.
  std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) override;
  void on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte* buffer) override;
  void on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte* buffer) override;
  // transport::PacketReceiver: the aggregated chunks (kAggData slices),
  // copied into the trainer's buffers (the endpoint releases the buffer).
  bool on_packet(uint16_t peer, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override;
  // A server came back with a new epoch (noted; handled after the endpoint's pass).
  void on_peer_restarted(uint16_t peer) override { restarted_servers_ |= uint64_t{1} << peer; }

  /// A server without a standby (standby_peer_).
  static constexpr uint16_t kNoStandby = UINT16_MAX;

 private:
  // kLeaving: stopped, waiting for the servers to acknowledge kLeave.
  // kRecovering: a server was lost (on_server_loss wait), waited for until
  // it answers the declarations again; then kInitialising at its version.
  enum class Phase : uint8_t {
    kIdle,
    kDeclaring,
    kInitialising,
    kRunning,
    kLeaving,
    kFailed,
    kRecovering
  };
  struct PendingPush {
    TensorId tensor = 0;
    uint32_t iteration = 0;  // BSP: the version it came from; else the tensor's clock
    uint32_t marked = 0;     // asynchronous: Request::marked
    uint32_t base = 0;       // asynchronous: the version it came from, fixed when it starts
    const std::byte* grad = nullptr;  // the tensor's elements, its dtype
    wire::PacketType type = wire::PacketType::kData;
    uint32_t next = 0;  // first block not queued yet
    bool started = false;
    Handle handle;
  };
  struct PendingPull {
    TensorId tensor = 0;
    uint32_t version = 0;  // BSP: the version wanted
    std::byte* out = nullptr;
    Handle handle;
    std::optional<Handle> push;  // push_pull: completes only once this has
    // Asynchronous: the answers (chunks x own pushes applied) it waits for,
    // the least slowest clock (SSP), and the least version + 1 (0: none).
    uint64_t answers = 0;
    uint32_t slowest = 0;
    uint32_t min_stamp = 0;
    uint32_t clock = 0;  // the worker's pushes of the tensor when it was asked
  };
  struct PendingBarrier {
    uint64_t generation = 0;
    Handle handle;
  };

  uint32_t take_requests_st(transport::Tick now);
  void stop_st(const Handle& stopped, transport::Tick now);
  // The stop is done: acknowledges what arrived, publishes, completes `stopped`.
  void finish_stop_st(const Handle& stopped, transport::Tick now);
  void take_st(Request& r, transport::Tick now);
  void start_st(const Handle& h, transport::Tick now);
  void push_st(TensorId t, uint32_t iteration, uint32_t marked, const std::byte* grad,
               wire::PacketType type, const Handle& h);
  void pull_st(PendingPull p);
  // Request -> PendingPull, by the mode's rule.
  PendingPull pull_of(const Request& r, std::optional<Handle> push) const;
  [[nodiscard]] bool async() const { return config_.sync != config::Sync::kBsp; }
  // May push p go now? BSP: its version is in; else the tensor's previous push was applied.
  [[nodiscard]] bool push_ready_st(const PendingPush& p) const;
  [[nodiscard]] bool pull_ready_st(const PendingPull& p) const;
  void barrier_st(uint64_t generation, const Handle& h);
  // Settings and the job's state (net_core_state.cpp).
  void settings_st(const agg::Hyperparameters& values, const Handle& h);
  void state_st(std::vector<std::byte>* out, const Handle& h);
  void send_seed_page_st(uint16_t server);
  void on_state_reply_st(uint16_t server, agg::ControlMessage& m);
  // BSP: whether a push of `iteration` waits for rank 0's settings to be in.
  [[nodiscard]] bool held_by_settings_st(uint32_t iteration) const;
  void fail_state_requests_st(const std::string& why);
  uint32_t send_pushes_st();
  // Queues the push's blocks from p.next on until the endpoint refuses
  // one; returns the first not queued (the block count when all are).
  uint32_t send_blocks_st(const PendingPush& p);
  uint32_t complete_pulls_st();
  // kReady, or kJoined (a running job takes this new process).
  void on_ready_st(uint16_t server, const agg::ControlMessage& m);
  // kWorkerGone, kWorkerJoined: counted, and said, once per event.
  void on_membership_st(uint16_t server, const agg::ControlMessage& m);
  void fail_start_st(const std::string& why);
  // A server failed: every pending handle fails with `why`, and so does every later request.
  void break_st(const std::string& why);
  void fail_pending_st(const std::string& why);
  // A lost server (net_core_recover.cpp): with wait_for_servers, what is
  // pending is abandoned and the server waited for; otherwise break_st.
  void lose_server_st(uint16_t server, const std::string& why);
  void handle_restarts_st();
  void on_recovered_ready_st(uint16_t server, const agg::ControlMessage& m);
  // The rollback to `version`: the trackers start again there, and every
  // server but `resumed` (UINT16_MAX: none) is asked to roll back to it.
  void roll_back_to_st(uint32_t version, uint16_t resumed);
  // A server has no checkpoint of the version asked (kRollback back): the
  // job goes back to its older one.
  void on_older_version_st(const agg::ControlMessage& m);
  // Whether a push to a server other than `lost` is in flight.
  [[nodiscard]] bool pushes_unsettled_st(uint16_t lost) const;
  void finish_rollback_st();
  void roll_back_st(const Request& r);
  // A hot standby (net_core_standby.cpp). The endpoint's peers are the
  // servers (peer s = server s), then the standbys; server s's traffic
  // goes to server_peer_[s]: itself, or its standby once promoted.
  void lose_peer_st(uint16_t peer, const std::string& why);
  [[nodiscard]] bool standby_covers_st(uint16_t server, uint16_t peer) const;
  [[nodiscard]] uint16_t server_of_standby(uint16_t peer) const;
  void on_promoted_st(uint16_t peer, const agg::ControlMessage& m);
  // `declare` to every server and standby from peer `first` on; false when
  // one could not be queued (the start failed, named).
  bool send_declarations_st(const agg::ControlMessage& declare, uint16_t first);
  // Server s is lost here too: its standby's held kPromoted is taken.
  void take_promotion_st(uint16_t s, const agg::ControlMessage& m);
  // Probes each server whose standby's kPromoted is held and not probed yet.
  void probe_held_st();
  // Server s's standby, which said it took over, is told it is followed
  // no more (kPromotionRefused, once): the server answered the probe after
  // its kPromoted (`answered`), or had named its standby lost before.
  void refuse_standby_st(uint16_t s, bool answered);
  void on_standby_lost_st(uint16_t server, const agg::ControlMessage& m);
  uint32_t send_resends_st();
  static void on_resend_sent(void* self, const transport::SendResult& r);
  [[nodiscard]] bool has_standby() const { return standbys_ != 0; }
  [[nodiscard]] uint16_t server_of_key(uint32_t key) const;
  [[nodiscard]] bool recovering() const { return phase_ == Phase::kRecovering || rolling_back_; }
  // To server `server` (< servers: wherever its traffic goes now), or to
  // peer `server` beyond them (a standby).
  bool send_control_st(uint16_t server, const agg::ControlMessage& m);
  // node::ControlChannel::Handler: a server's message, and one of ours lost.
  void on_control_st(uint32_t server, agg::ControlMessage&& m) override;
  void on_control_failed_st(uint32_t server, const transport::SendResult& r) override;
  // The probe sent when a kPromoted came while the server was not lost
  // here was answered (a kHeartbeat delivered to a server).
  void on_control_delivered_st(uint32_t peer, agg::ControlKind kind) override;
  bool version_in_st(TensorId t, uint32_t version) const;
  void publish_st();
  std::string server_name(uint16_t server) const;

  static void on_push_sent(void* self, const transport::SendResult& r);
  void mark_chunk_st(uint32_t key, uint32_t version);

  base::Owner owner_;  // the thread that runs the net core's loop
  const TensorTable& table_;
  NetCoreConfig config_;
  net::PacketPort& port_;
  RequestQueue<Request>& queue_;
  PublishedStats& stats_;
  node::Loop* loop_ = nullptr;  // attach()
  bool ends_loop_ = false;
  transport::Tick now_ = 0;             // the current pass's time
  std::vector<uint16_t> shard_server_;  // global shard id -> server peer index
  // Built at start, once the table is frozen. The endpoint is declared last:
  // destroyed first, before the trackers its receivers write into.
  std::unique_ptr<PullTracker> pulls_;
  std::unique_ptr<PushTracker> pushes_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  std::optional<node::ControlChannel> control_;  // with the endpoint; destroyed before it

  Phase phase_ = Phase::kIdle;
  std::optional<Handle> start_;
  transport::Tick start_deadline_ = 0;
  std::vector<bool> ready_;  // per server
  std::string broken_;       // non-empty: a failure every later request gets
  bool stopped_ = false;     // the kStop request was taken and the stop is done
  // While leaving: the kStop request's handle, completed once every server
  // acknowledged kLeave or at leave_deadline_.
  std::optional<Handle> stop_;
  transport::Tick leave_deadline_ = 0;
  bool leave_on_stop_ = true;

  std::vector<PendingPush> push_queue_;           // not (fully) queued in the endpoint yet
  std::vector<std::optional<Handle>> in_flight_;  // per tensor: the push the tracker holds
  std::vector<PendingPull> pull_queue_;
  std::vector<PendingBarrier> barriers_;
  // Settings and the job's state: requests answered per server, matched by
  // their sequence number.
  struct PendingSettings {
    uint64_t sequence = 0;
    uint32_t from = 0;     // BSP: pushes of this iteration on wait for it
    uint32_t waiting = 0;  // servers that have not answered
    std::string error;
    Handle handle;
  };
  struct PendingState {
    uint64_t sequence = 0;
    std::vector<std::byte>* out = nullptr;
    std::vector<std::byte> pages;  // every server's, as they come
    uint32_t waiting = 0;          // servers with pages to come
    std::string error;
    Handle handle;
  };
  std::vector<PendingSettings> settings_;
  std::vector<PendingState> states_;
  uint64_t next_sequence_ = 1;
  uint32_t start_version_ = 0;  // kReady's
  uint32_t next_push_ = 0;      // BSP: the iteration of the next push (the settings' version)
  // The clock of this process's first push: the job's start version, or the
  // clock a running asynchronous job took it in at (its pushes' answers
  // count from there).
  uint32_t first_clock_ = 0;
  std::shared_ptr<const Resume> resume_;  // rank 0's, while it is sent
  std::vector<uint32_t> seed_next_;       // per server: its next page
  uint64_t seed_sequence_ = 0;
  std::vector<Handle> init_pushes_;  // rank 0's, internal
  uint64_t seen_versions_ = 0;       // tracker's versions_completed at the last pull scan
  uint64_t seen_settled_ = 0;        // pushes settled at the last pull scan
  bool pulls_dirty_ = false;
  size_t list_capacity_ = 0;
  // With a timeline, per tensor: the data push in flight (iteration + 1, 0 =
  // none) and the version whose first chunk was marked.
  std::vector<uint32_t> timeline_push_;
  std::vector<uint32_t> timeline_first_;

  // A lost server (on_server_loss wait): which, why, until when it is
  // waited for; servers seen restarted by the endpoint (a bit each);
  // rolling back: kInitialising at the version it resumed from; the
  // rollbacks done and the roll_back requests waiting for the next.
  uint16_t lost_server_ = 0;
  std::string lost_text_;
  transport::Tick recover_deadline_ = 0;
  uint64_t restarted_servers_ = 0;
  bool rolling_back_ = false;
  uint32_t rollbacks_ = 0;
  std::vector<Handle> roll_back_waiters_;
  // Several servers (docs/durability.md, "Several servers"): per peer, the
  // push blocks queued to it and not settled yet; the lost server's kReady,
  // held until no push to another server is in flight (their completions
  // would count into the new trackers, and a gradient of a version the job
  // takes back could reach a server after it rolled back); and the chunks
  // of another version than the rollback's dropped while it is under way
  // (a running server's updates from before it).
  std::vector<uint32_t> unsettled_;
  std::optional<agg::ControlMessage> held_ready_;
  uint64_t rollback_dropped_ = 0;

  // A hot standby: per server, its standby's peer (kNoStandby: none) and
  // where its traffic goes now; the servers lost whose standby has not
  // taken over yet (until failover_deadline_), those whose standby has,
  // and those whose standby was lost (bit s each).
  uint32_t standbys_ = 0;
  std::vector<uint16_t> standby_peer_, server_peer_;
  uint64_t failing_over_ = 0, failed_over_ = 0, standby_lost_ = 0;
  transport::Tick failover_deadline_ = 0;
  // A standby's kPromoted that came while this worker still reached the
  // server is held (bit s, the message per server) until the server is
  // lost here (taken then) or answers the probe sent after it (refused:
  // the server lives, the pair was cut apart); probed: the probe is out.
  // A standby whose promotion was refused, or whose server named it lost,
  // stays a peer (heartbeats, settings, the leave) but never takes over
  // (refused_); refusal_sent_: it said it took over and was told no.
  uint64_t held_ = 0, probed_ = 0, refused_ = 0, refusal_sent_ = 0;
  std::vector<agg::ControlMessage> held_promotion_;
  // BSP, per tensor: the last data push started (its gradient stays in
  // place until its version is in: a push_pull's handle completes then),
  // and the pushes resent to a standby that took over.
  struct LastPush {
    const std::byte* grad = nullptr;
    uint32_t iteration = 0;
    bool valid = false;
  };
  std::vector<LastPush> last_push_;
  struct Resend {
    TensorId tensor = 0;
    uint32_t iteration = 0;
    const std::byte* grad = nullptr;
    uint32_t next = 0;  // first block not queued yet
    uint32_t end = 0;   // blocks before it were sent to the lost server
    uint16_t server = 0;
  };
  std::vector<Resend> resends_;
  uint64_t takeovers_ = 0, tensors_resent_ = 0;
  // The last barrier generation this worker sent to server 0: sent again to
  // its standby when it takes over (a rank the lost server answered goes on;
  // the standby's barrier still needs its arrival).
  uint64_t last_barrier_ = 0;
  bool barrier_sent_ = false;

  transport::Tick port_stats_at_ = 0;  // the next read of the PMD's drops
  uint64_t control_malformed_ = 0;     // messages of a kind a worker is never sent
  uint64_t pushes_taken_ = 0, pulls_taken_ = 0;
  uint64_t chunks_received_ = 0, bytes_pushed_ = 0;
  // Asynchronous: per tensor, the version its last completed pull delivered
  // (the base of the next gradient), and the staleness of the pushes.
  std::vector<uint32_t> base_;
  uint64_t staleness_sum_ = 0, stale_pushes_ = 0, staleness_max_ = 0;
  uint64_t ssp_waits_ = 0, ssp_gap_max_ = 0;
  // Ranks the servers said left the job (kWorkerGone; each server says it):
  // left, bit r = rank r. Removals and joins can repeat for a rank (a
  // process restarted again): per server and rank, how many that server
  // told; an event counts (and is said) when the first server tells it,
  // i.e. when one server's count passes the most any server told.
  uint64_t ranks_left_ = 0;
  struct Told {
    std::array<uint32_t, 64> removed{}, joined{};
  };
  std::vector<Told> told_;  // per server
  Told most_told_;
  uint64_t workers_removed_ = 0, workers_joined_ = 0;
  // This process joined a running job (kJoined): its first pull is every
  // chunk's newest version; the barrier generation it counts from (server 0's).
  bool joining_ = false;
  uint64_t barrier_base_ = 0;
  // A spare that announced itself to server 0 and holds no rank yet.
  bool spare_waits_ = false;
};

}  // namespace mercury::worker
