// The Mercury worker: what a trainer process links to push gradients to the
// parameter servers and pull the aggregated parameters back (C++20; the C
// ABI over it is mercury/worker_c.h). No DPDK type appears here.
//
// Life of a worker.
//   Worker w({.job_file = "job.yaml", .node = "w0"});   // connect
//   Key k = w.declare("conv1.weight", params, 0);       // every tensor, once
//   w.start();                                          // optional: see below
//   Handle h = w.push_pull(k, grad, params);            // any thread, any time
//   h.wait();                                           // or ready(), or on_complete(fn)
//   w.barrier();
//   w.shutdown();                                       // or the destructor
//
// Connect. The constructor loads the job file, finds this node (a worker),
// and starts the worker's net core: one thread that runs EAL (rte_eal_init
// is called from that thread, so it is the one EAL pins; the trainer's
// threads are never pinned or blocked) and then polls the node's first
// port. If the process has already initialised EAL (EalMode::kAttach, or
// kAuto when EAL is up), the net core runs on a thread of that EAL instance
// instead and leaves EAL to its owner.
//
// Start: when the declarations freeze. The set of tensors is frozen by
// start() (or start_async()), or implicitly by the first push(), pull(),
// push_pull() or barrier(). start() sends the declarations (rank, every
// tensor in declaration order) to every server of the job, waits until each
// answers Ready, agreeing with this worker on where every block of every
// tensor lives (the placement fingerprint), and then waits for version 0 of
// every tensor: rank 0's buffers as they are at start() (rank 0 pushes
// them), so every rank starts from the same model and every rank's declared
// buffers hold it when start() returns. It blocks for as long as the slowest
// rank takes to start, at most WorkerOptions::start_timeout_ms, and throws
// WorkerError naming the server that refused or never answered.
// Under asp, ssp and psplus a process started for a rank the running job
// removed (a restart, or a replacement with the same node) joins it
// instead: start() then returns once every chunk's newest version is in
// the declared buffers (joined_version(); docs/membership.md, "Joining").
// start_async() does the same without blocking: its Handle completes when
// start() would return. declare() after either throws UsageError.
//
// Versions (BSP). Each push of a tensor is its next iteration i (0, 1, ...):
// a gradient computed from version i of the parameters. The servers sum
// every rank's iteration i and answer with version i + 1. pull() asks for
// the newest version this worker's pushes of that tensor lead to: version 0
// before any push, version i + 1 after the push of iteration i. A push of
// iteration i is held on the net core until version i of the tensor is in
// (the servers refuse a gradient from parameters they have not produced
// yet).
//
// Modes (training.sync; docs/worker.md has the table). Under asp, ssp and
// psplus the servers apply each worker's gradient on its own as it
// arrives, so a tensor's chunks move on independently: a tensor's version
// is then the least version over its chunks (version() after a pull), and
// push's gradient is taken as computed from the version the tensor's last
// pull delivered, or, when the trainer called mark_read(key) before
// computing it, from the version in the buffer then (its staleness, against
// the newest version in place when it goes, is in stats(); the servers
// scale psplus's learning rate by theirs). A push waits on the net core
// until the tensor's previous push was applied. pull(key, out):
//  * asp: once every push of this worker of the tensor has been applied (it
//    reads its own updates), with whatever others' updates came with them;
//  * ssp: the same, and not before the slowest worker has pushed at least
//    (this worker's pushes - training.staleness_bound) gradients of every
//    chunk: a worker too far ahead waits here, before it computes;
//  * psplus: at once, with the newest version in place (the servers send
//    every worker the newest version of every chunk as its link has room:
//    the eager pull), and push_pull's pull part once its push is
//    acknowledged;
//  * pull(key, out, min_version), any mode: not before every chunk of the
//    tensor is at least min_version.
//
// Element types. A tensor is float32, bfloat16 or float16 (Dtype), fixed at
// declare(): a float32 tensor is a std::span<float>, a bfloat16 or float16
// one a std::span<uint16_t> of its elements' bits (little-endian, as
// torch's bfloat16 and float16 and numpy's float16 hold them) with the
// dtype named. Its pushes, its pulls and the wire carry that dtype as it
// is: nothing converts on the worker. The servers keep float32 master
// parameters, reduce the widened pushes in rank order in float32, and send
// every update back rounded once, to nearest even, into the tensor's dtype
// (docs/agg.md, "Element types"). push/pull of a half tensor take
// std::span<uint16_t> (the declared dtype), of a float32 one std::span<float>;
// the other is refused. Tensors of different dtypes mix freely in a job.
//
// Buffers. Aggregated parameters are written by the net core straight into
// the buffer given to declare(), chunk by chunk; a pull(key, out) with
// `out` another buffer copies them there when the version is complete. A
// push reads `grad` until its handle completes: keep it alive and unchanged
// until then. The declared buffer must outlive the worker.
//
// Threads. Every method may be called from any number of trainer threads at
// once. push/pull/push_pull check their arguments on the calling thread,
// then hand the request to the net core through a lock-free bounded queue
// (a full queue makes the caller yield and retry) and return a Handle at
// once. Handles complete on the net core: a callback registered with
// Handle::on_complete runs there and must be short and must not block.
// start(), barrier() and shutdown() block the calling thread (in the
// kernel, never spinning); start_async() and barrier_async() return a
// Handle at once.
//
// Settings and checkpoints (docs/worker.md, "Settings and checkpoints").
// With a server-side optimizer the servers hold the optimizer's state and
// its hyperparameters. set_hyperparameters() changes them from this
// worker's next push on (rank 0's change is the job's; under BSP every
// shard applies it from the same version); server_state() reads every
// shard's parameters, optimizer state, versions and hyperparameters as a
// job's state file (docs/agg.md, "A job's state"); resume_from() (rank 0,
// before start) makes the job start from such a file instead of rank 0's
// buffers: every tensor at the file's version, every rank's pushes counted
// from there.
//
// Errors. Misuse throws UsageError (an unknown key, a buffer of the wrong
// size, a declaration after start, any call after shutdown()). A failed
// transfer fails its Handle with a text that names the server; a server
// that stops answering, or ends the job, fails every pending handle and
// every later request with that text (barrier() throws it as WorkerError).
// shutdown() fails the handles still pending with "the worker was shut
// down ...".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mercury/handle.h"
#include "mercury/worker_errors.h"

namespace mercury::worker {

/// A declared tensor: its index in declaration order.
using Key = uint32_t;

/// Who starts DPDK's EAL.
enum class EalMode : uint8_t {
  kAuto,    ///< kAttach if this process has initialised EAL already, else kStart
  kStart,   ///< the worker's net core thread starts EAL and cleans it up at shutdown
  kAttach,  ///< EAL is up (started by the process with this node's vdevs): use it
};

struct WorkerOptions {
  /// The job's YAML (docs/config.md); empty: $MERCURY_JOB.
  std::string job_file;
  /// This worker's node name in it; empty: $MERCURY_NODE, else the node the
  /// launcher's rank maps to (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK,
  /// PMI_RANK; docs/cluster.md, "Identity"), else the job's only worker.
  std::string node;
  std::vector<std::string> eal_args;  ///< appended to the EAL argv the job generates
  EalMode eal = EalMode::kAuto;
  uint32_t start_timeout_ms = 30'000;  ///< start(): every server Ready, version 0 in
  /// true (the default): the net core waits as the job file's poll mode says
  /// for this node (`adaptive` unless set: it gives its CPU to the trainer
  /// and to other processes when it has nothing to do); false = busy polling
  /// whatever the job file says.
  bool idle_backoff = true;
  /// A directory: at shutdown the worker writes a Chrome trace of every
  /// tensor's push, aggregation and pull, and of the trainer's spans
  /// (timeline_span), to DIR/<node>.json (docs/timeline.md).
  /// Empty: the environment variable MERCURY_TIMELINE, if set; else none.
  std::string timeline;
};

/// A snapshot of the worker's counters (published by the net core every
/// few milliseconds, so a little behind).
struct WorkerStats {
  uint64_t pushes = 0;  ///< push requests (push and push_pull) taken by the net core
  uint64_t pulls = 0;   ///< pull requests (pull and push_pull) taken by the net core
  /// Gradient bytes handed to the network (on rank 0 also its initial
  /// parameters, at start): pushes x their tensors' sizes, once sent.
  uint64_t bytes_pushed = 0;
  uint64_t chunks_received = 0;     ///< aggregated chunks (one packet each) received
  uint64_t bytes_placed = 0;        ///< parameter bytes written into the declared buffers
  uint64_t versions_completed = 0;  ///< (tensor, version) pairs fully received
  uint64_t retransmits = 0;         ///< packets the worker sent again (loss, reordering)
  uint64_t chunks_dropped = 0;      ///< chunks dropped on arrival (stale, duplicate, malformed)
  uint64_t control_dropped = 0;     ///< servers' control messages dropped (malformed, unexpected)
  /// Asynchronous modes: the staleness of this worker's pushes, each the
  /// versions every chunk of its tensor had moved on since the pull its
  /// gradient came from, as far as this worker has heard: summed, how many
  /// were not 0, and the largest. Under asp and ssp a worker is sent only the
  /// answers to its own pushes, so it hears of no version in between and
  /// counts 0; the servers count every mode's (docs/server.md, "Staleness").
  uint64_t staleness_sum = 0;
  uint64_t stale_pushes = 0;
  uint64_t staleness_max = 0;
  /// ssp: pulls that had to wait for the slowest worker, and the largest
  /// gap (own pushes - the slowest's) at which a pull completed (<= bound).
  uint64_t ssp_waits = 0;
  uint64_t ssp_gap_max = 0;
  /// Asynchronous modes (docs/membership.md): the other ranks the servers
  /// removed from the job (lost or restarted: the job went on without
  /// them), and those that left it before this worker, as the servers told.
  uint64_t workers_removed = 0;
  uint64_t workers_left = 0;
  /// New processes of removed ranks that joined the job since this worker
  /// started (docs/membership.md, "Joining"), as the servers told.
  uint64_t workers_joined = 0;
  /// A hot standby (docs/durability.md): times a server's standby took over
  /// from it, and the tensors this worker pushed again to it then.
  uint64_t standby_takeovers = 0;
  uint64_t tensors_resent = 0;
};

/// A drop reason and how many times it happened (Worker::drops).
using DropCount = std::pair<std::string, uint64_t>;

/// A tensor's element type (see the file comment); the values are the
/// wire's (docs/wire-format.md, "Dtypes").
enum class Dtype : uint8_t {
  kFloat32 = 1,   ///< IEEE-754 binary32: std::span<float>
  kBFloat16 = 2,  ///< bfloat16 (a binary32's top 16 bits): std::span<uint16_t>
  kFloat16 = 3,   ///< IEEE-754 binary16: std::span<uint16_t>
};

/// How the servers make a tensor's versions from the ranks' pushes
/// (Worker::declare).
enum class Update : uint8_t {
  kOptimizer = 0,  ///< the job's training.optimizer (with sum: the pushes' average)
  kAverage = 1,    ///< the pushes' average in rank order, whatever the job's optimizer
  kRank0 = 2,      ///< rank 0's push: its values, on every rank
  /// The job's optimizer applied to rank 0's push as the gradient (not
  /// averaged: every rank pushes the same final gradient); a push of
  /// kSkipStepBits applies nothing (a skipped step, not counted by Adam).
  /// float32 tensors only (declare refuses a half-precision one).
  kOptimizerRank0 = 3,
};
/// The bits of every element of a float32 push that skips a step under
/// Update::kOptimizerRank0 (a signalling NaN: no arithmetic produces one).
inline constexpr uint32_t kSkipStepBits = 0x7FA55A5Au;

/// The servers' optimizer's hyperparameters (docs/agg.md, "Optimizers"):
/// the optimizer reads those of its kind (momentum: momentum; adam and
/// adamw: beta1, beta2, epsilon; weight_decay all but sum) and keeps the
/// others as given.
struct Hyperparameters {
  float learning_rate = 0;
  float momentum = 0;
  float weight_decay = 0;
  float beta1 = 0;
  float beta2 = 0;
  float epsilon = 0;
  friend bool operator==(const Hyperparameters&, const Hyperparameters&) = default;
};

class Worker {
 public:
  /// Connects: loads the job, starts the net core (and EAL, see EalMode),
  /// opens the node's port. Throws WorkerError (configuration, no job file
  /// or node to be found, EAL, port).
  explicit Worker(const WorkerOptions& options);
  /// shutdown() if not done yet.
  ~Worker();
  Worker(Worker&&) noexcept;
  Worker& operator=(Worker&&) noexcept;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Declares a tensor whose parameters live in `params` (which must
  /// outlive the worker). `priority` >= 0, 0 the most urgent (the first
  /// layer of the forward pass), or -1 for the declaration index. `update`:
  /// how the servers make its versions (every rank must declare the same).
  /// Returns its key. Throws UsageError: duplicate or empty name, empty
  /// tensor, bad priority or update rule, after start, after shutdown.
  Key declare(std::string_view name, std::span<float> params, int priority = -1,
              Update update = Update::kOptimizer);
  /// Declares a bfloat16 or float16 tensor (`dtype`) whose elements' bits
  /// are `params`; otherwise as above. Also throws UsageError for a dtype
  /// that is not kBFloat16 or kFloat16.
  Key declare(std::string_view name, std::span<uint16_t> params, Dtype dtype, int priority = -1,
              Update update = Update::kOptimizer);
  /// The dtype `key` was declared with. Throws UsageError (no such key).
  [[nodiscard]] Dtype dtype(Key key) const;

  /// Freezes the declarations and joins the job (see the file comment).
  /// Idempotent. Throws WorkerError (a server refused or did not answer in
  /// time, placement mismatch, shut down meanwhile) or UsageError (nothing
  /// declared, after shutdown). After a failed start every call throws.
  void start();
  /// start() without waiting: freezes the declarations, sends them, and
  /// returns a Handle that completes when start() would return, or fails
  /// with its error (at most kMaxErrorBytes of the text; start() afterwards
  /// throws the whole of it). Every call returns the same handle. Throws
  /// UsageError (nothing declared, after shutdown).
  Handle start_async();

  /// Pushes the gradient of the next iteration of `key` (`grad`: the whole
  /// tensor). The handle completes when the servers have acknowledged every
  /// byte of it. Starts the worker if needed. Throws UsageError.
  Handle push(Key key, std::span<const float> grad);
  /// The newest version this worker's pushes of `key` lead to (see the file
  /// comment), into `out` (the declared buffer: no copy). Throws UsageError.
  Handle pull(Key key, std::span<float> out);
  /// pull(key, out), completing no earlier than when every chunk of the
  /// tensor is at least `min_version` (see Modes). Throws UsageError.
  Handle pull(Key key, std::span<float> out, uint32_t min_version);
  /// The version the last completed pull (or push_pull) of `key` delivered:
  /// BSP its version; otherwise the least version over the tensor's chunks.
  /// 0 before any. Throws UsageError (no such key).
  [[nodiscard]] uint32_t version(Key key) const;
  /// Asynchronous modes: the trainer is about to compute with `key`'s
  /// declared buffer as it is now. Returns the version in it (the least
  /// over its chunks, newer than version() under psplus, whose servers send
  /// the newest versions eagerly) and takes it as the base of the next push
  /// or push_pull of `key`: the version its gradient came from, which the
  /// servers count its staleness from. Call it after the wait for the
  /// parameters, right before the computation that reads them. bsp: returns
  /// version(key) and changes nothing (a push's iteration is its base).
  /// Throws UsageError (no such key, not started, after shutdown).
  uint32_t mark_read(Key key);
  /// push(key, grad), then pull(key, out) of the version it leads to; the
  /// handle completes when both have. Throws UsageError.
  Handle push_pull(Key key, std::span<const float> grad, std::span<float> out);

  /// The same four for a bfloat16 or float16 tensor: its elements' bits in
  /// its declared dtype. Throws UsageError as above, and for a float32 tensor.
  Handle push(Key key, std::span<const uint16_t> grad);
  Handle pull(Key key, std::span<uint16_t> out);
  Handle pull(Key key, std::span<uint16_t> out, uint32_t min_version);
  Handle push_pull(Key key, std::span<const uint16_t> grad, std::span<uint16_t> out);

  /// Blocks until every rank of the job has called barrier() as many times
  /// as this process has (the n-th call of the process is generation n - 1).
  /// Throws WorkerError if it cannot complete (a server failed, shutdown).
  void barrier();
  /// barrier() without waiting: the handle completes when every rank has
  /// reached this generation, or fails with the reason. Starts the worker
  /// if needed. Throws UsageError (after shutdown).
  Handle barrier_async();

  /// The servers' hyperparameters as this worker last set them (the job
  /// file's training section until then).
  [[nodiscard]] Hyperparameters hyperparameters() const;
  /// Changes the servers' hyperparameters from this worker's next push on.
  /// Rank 0's change is the job's: it goes to every server and the handle
  /// completes once every shard applied it; under bsp rank 0's pushes of
  /// the version it applies from wait for that, so every shard uses it
  /// from the same version on (asp, ssp, psplus: from each chunk's next
  /// update). Any other rank's call is checked, recorded (hyperparameters())
  /// and its handle complete at once, so one script runs on every rank.
  /// The handle fails if a server refused it, which also ends the worker's
  /// job (its shards would disagree). Throws UsageError: not started, after
  /// shutdown, the job's optimizer is sum (the trainer's own optimizer has
  /// the hyperparameters), values the optimizer cannot take (named).
  Handle set_hyperparameters(const Hyperparameters& values);

  /// Every shard's state: parameters, optimizer state, versions and the
  /// hyperparameters, as a job's state file (docs/agg.md, "A job's
  /// state"), into `out` (replaced; alive until the handle completes).
  /// Under bsp, asked once this worker's pulls are complete, every chunk
  /// is at the version its pushes led to: one step boundary. The handle
  /// fails naming the server. Throws UsageError: not started, after
  /// shutdown.
  Handle server_state_async(std::vector<std::byte>& out);
  /// The same, waiting. Throws WorkerError if it failed.
  std::vector<std::byte> server_state();
  /// Before start: the job resumes from `state` (server_state()'s file, a
  /// copy is kept). On rank 0 the servers then start from its chunks, at
  /// its version, instead of rank 0's buffers, and every rank's pushes are
  /// counted from that version (start_version()); checked against the
  /// declarations at start, which throws UsageError naming what differs.
  /// On any other rank it is kept and not used (the same script runs on
  /// every rank). Throws UsageError: after start, under a sync mode other
  /// than bsp, a job whose optimizer is sum.
  void resume_from(std::span<const std::byte> state);
  /// The version the job started at: 0, or the resumed state's. Throws
  /// UsageError before start.
  [[nodiscard]] uint32_t start_version() const;

  /// When this process joined a running job in place of a removed rank
  /// (docs/membership.md, "Joining"; a spare's too), the step it joined
  /// at: asynchronous modes, the slowest rank's clock (its pushes of every
  /// chunk applied) when it was taken in, from which its own pushes count
  /// (start_version() is the same); bsp with on_worker_loss wait, the
  /// iteration in progress. The declared buffers held every chunk's newest
  /// version when start() returned. nullopt for a process that started
  /// with the job. The trainer goes on from that step of its data. Its
  /// barriers count from the generation the job was at. Throws UsageError
  /// before start.
  [[nodiscard]] std::optional<uint32_t> joined_version() const;

  /// After a call failed because a server was lost, with the job file's
  /// network.on_server_loss wait (docs/worker.md, "Errors"): waits
  /// until the server is back from its checkpoint and every tensor holds
  /// the version it resumed at, in the declared buffers, and returns that
  /// version: the trainer goes on from it (under bsp every rank gets the
  /// same), reloading its data position; every tensor's pushes count from
  /// it again, and barriers from their first generation (the server that
  /// came back has seen none). Calls made between the loss and roll_back() fail. Returns at
  /// once if the rollback is done already. Throws WorkerError if the
  /// server did not come back within network.server_wait_s (or the job
  /// failed otherwise, or no server was lost), UsageError before start or
  /// after shutdown. Not from a completion callback. Thread-safe, but the
  /// trainer's other threads must not push meanwhile.
  uint32_t roll_back();

  /// Stops the net core: handles still pending fail ("the worker was shut
  /// down ..."), EAL is cleaned up if the worker started it. Idempotent;
  /// every later call but the accessors throws UsageError. Not from a
  /// completion callback (it waits for the net core, which runs them).
  void shutdown();

  /// The key of the tensor declared as `name`, once started. Throws
  /// UsageError (no such tensor, not started yet).
  [[nodiscard]] Key key(std::string_view name) const;
  /// Among the job's workers, file order. A spare worker (`spare: true`;
  /// docs/membership.md, "Spare workers") has none until start() returned:
  /// then the rank it took over; before, UsageError.
  [[nodiscard]] uint32_t rank() const;
  /// Whether the job file makes this worker a spare.
  [[nodiscard]] bool spare() const;
  [[nodiscard]] uint32_t workers() const;  ///< in the job
  [[nodiscard]] uint32_t tensors() const;  ///< declared so far
  /// The job's training.sync as the job file spells it ("bsp", "asp",
  /// "ssp", "psplus").
  [[nodiscard]] std::string_view sync() const;
  /// The job's training.optimizer as the job file spells it ("sgd",
  /// "momentum", "adam", "adamw" or "sum"). With "sum" every version of a tensor is
  /// the workers' averaged gradient, for the trainer's own optimizer; with
  /// the others it is the parameters, updated by the servers.
  [[nodiscard]] std::string_view optimizer() const;

  /// Whether this worker records a timeline (WorkerOptions::timeline).
  [[nodiscard]] bool timeline_enabled() const;
  /// Records a span of the trainer's own work (a layer's forward pass, a
  /// backward pass, compute) on row `track` of the timeline, from `begin_ns`
  /// to `end_ns` on CLOCK_MONOTONIC (std::chrono::steady_clock, Python's
  /// time.monotonic_ns()). Any thread; a mutex and an allocation per call;
  /// nothing when the timeline is off.
  void timeline_span(std::string_view name, std::string_view track, uint64_t begin_ns,
                     uint64_t end_ns);
  [[nodiscard]] bool started() const;
  [[nodiscard]] WorkerStats stats() const;
  /// Every drop on this worker's node by reason, the nonzero ones, named as
  /// ps-server names its own: the port's frames (not_our_mac, mercury, ...:
  /// net::DropReason), the transport's packets (unknown_peer, auth_bad_mac,
  /// retransmit_stale, ...: transport::EndpointDrop) and the PMD's
  /// (rx_nombuf, imissed, ierrors, oerrors, read every 100 ms). Chunks and
  /// control messages are WorkerStats' chunks_dropped and control_dropped.
  /// Published with stats(), so a little behind; any thread.
  [[nodiscard]] std::vector<DropCount> drops() const;

  /// Internal (worker/attach.h builds one around an already-open port).
  struct Impl;
  explicit Worker(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mercury::worker
