// The trainer side of mercury/worker.h: argument checks on the calling
// thread, the request queue to the net core, and the net core's thread
// (which starts EAL when the worker owns it).
#include "mercury/worker.h"

#include <pthread.h>
#include <rte_cycles.h>
#include <rte_lcore.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "job/identity.h"
#include "job/job.h"
#include "net/eal.h"
#include "net/node.h"
#include "net/port.h"
#include "worker/attach.h"
#include "worker/net_core.h"
#include "worker/request_queue.h"
#include "worker/tensor_table.h"
#include "worker/timeline.h"

namespace mercury::worker {

struct Worker::Impl {
  explicit Impl(const NetCoreConfig& c) : core(c), queue(c.request_capacity) {}

  // ---- fixed at construction ----
  NetCoreConfig core;
  bool owns_eal = false;
  std::vector<std::string> eal_argv;     // owns_eal
  std::optional<config::JobConfig> job;  // ports opened from the job file
  std::string node;
  net::PacketPort* port = nullptr;  // attach_worker(), PolledWorker: the caller's port

  TensorTable table;
  std::unique_ptr<Timeline> timeline;  // core.timeline points here
  RequestQueue<Request> queue;
  node::Doorbell doorbell;  // the net core's loop sleeps on it; requests ring it
  PublishedStats stats;
  std::thread thread;
  // PolledWorker: the net core, a poller of the owner's loop (no thread
  // here); destroyed by shutdown(), which runs that loop until the net core
  // has taken the stop.
  std::unique_ptr<NetCore> polled;
  bool owner_polls = false;
  node::Loop* owner_loop = nullptr;        // PolledWorker::attach
  node::Tick (*clock)() = &node::tsc_now;  // the owner's loop's clock

  // ---- trainer side ----
  std::unique_ptr<std::atomic<uint32_t>[]> iterations;  // per tensor: pushes so far
  // Asynchronous modes, per tensor: 1 + the version mark_read() found, for
  // the next push to take (0 = none).
  std::unique_ptr<std::atomic<uint32_t>[]> marked;
  mutable std::mutex start_mutex;    // start_async() against itself
  std::optional<Handle> start;       // set once, under start_mutex
  std::atomic<bool> started{false};  // a caller saw `start` ok
  std::atomic<bool> shut_down{false};
  std::atomic<uint32_t> callers{0};  // threads between their shut-down check and enqueue
  std::atomic<bool> down{false};     // the net core has stopped and been joined
  std::atomic<uint64_t> barrier_generation{0};
  // The version the job started at: pushes count from it (set by start()).
  std::atomic<uint32_t> first_version{0};
  // Rollbacks the trainer acknowledged (roll_back): every request carries it.
  std::atomic<uint32_t> rollbacks_seen{0};
  // Settings and checkpoints: this process's view of the servers'
  // hyperparameters, and the state to resume from (rank 0 sends it).
  mutable std::mutex settings_mutex;
  agg::Hyperparameters settings;
  std::vector<std::byte> resume;
  bool resuming = false;

  void check_live(const char* call) const {
    if (shut_down.load(std::memory_order_acquire)) {
      throw UsageError(std::string(call) + ": the worker has been shut down");
    }
  }

  // Hands `r` to the net core. The seq_cst pair (callers up, then shut_down
  // read; shutdown() writes shut_down, then reads callers) guarantees that
  // no request is enqueued after shutdown() saw callers == 0.
  void submit(Request& r, const char* call) {
    callers.fetch_add(1, std::memory_order_seq_cst);
    if (shut_down.load(std::memory_order_seq_cst)) {
      callers.fetch_sub(1, std::memory_order_release);
      throw UsageError(std::string(call) + ": the worker has been shut down");
    }
    r.rollbacks = rollbacks_seen.load(std::memory_order_acquire);
    while (!queue.try_push_mp(r)) std::this_thread::yield();  // full: the net core drains it
    doorbell.ring();
    callers.fetch_sub(1, std::memory_order_release);
  }

  // The net core of a PolledWorker runs only when its owner polls it, so a
  // blocking call there would never return: UsageError instead.
  void check_may_block(const char* call) const {
    if (owner_polls) {
      throw UsageError(std::string(call) +
                       ": this worker's net core is polled by its owner (PolledWorker), so " +
                       call + "() cannot wait; use " + call +
                       "_async() and poll until the handle is ready");
    }
  }

  // The whole text of why `h` failed: the net core publishes it beside the
  // handle, which holds kMaxErrorBytes of it.
  std::string failure(const Handle& h) const {
    const std::string full = stats.get_failure();
    return full.empty() ? std::string(h.error()) : full;
  }

  void ensure_started(Worker& w) {
    if (!started.load(std::memory_order_acquire)) w.start();
  }

  // A std::span<uint16_t> call on `key`: the tensor's dtype if it is
  // bfloat16 or float16; a float32 tensor is refused (nothing converts).
  wire::Dtype half_dtype(Key key, const char* call) const {
    const wire::Dtype d = table.tensor(key).dtype;
    if (d == wire::Dtype::kFloat32) {
      throw UsageError(std::string(call) + ": tensor '" + table.tensor(key).name +
                       "' is float32 but the buffer is 16-bit elements (use std::span<float>)");
    }
    return d;
  }

  // push, pull and push_pull of any dtype: `grad` and `out` are the
  // tensor's `elements` elements of `dtype` (checked).
  Handle push(Worker& w, Key key, wire::Dtype dtype, const std::byte* grad, uint64_t elements) {
    check_live("push");
    ensure_started(w);
    table.check_push(key, dtype, elements);
    Handle h;
    const uint32_t it = first_version.load(std::memory_order_relaxed) +
                        iterations[key].fetch_add(1, std::memory_order_acq_rel);
    Request r{Request::Kind::kPush, key, it, 0, 0, false, 0, grad, nullptr, h, std::nullopt};
    r.marked = marked[key].exchange(0, std::memory_order_acq_rel);
    submit(r, "push");
    return h;
  }

  Handle pull(Worker& w, Key key, wire::Dtype dtype, std::byte* out, uint64_t elements,
              uint32_t min_version) {
    check_live("pull");
    ensure_started(w);
    table.check_pull(key, dtype, elements);
    Handle h;
    const uint32_t version = first_version.load(std::memory_order_relaxed) +
                             iterations[key].load(std::memory_order_acquire);
    Request r{Request::Kind::kPull, key, 0, version, min_version, true, 0, nullptr, out, h,
              std::nullopt};
    submit(r, "pull");
    return h;
  }

  Handle push_pull(Worker& w, Key key, wire::Dtype dtype, const std::byte* grad, std::byte* out,
                   uint64_t grad_elements, uint64_t out_elements) {
    check_live("push_pull");
    ensure_started(w);
    table.check_push(key, dtype, grad_elements);
    table.check_pull(key, dtype, out_elements);
    Handle h;
    Handle pushed;
    const uint32_t it = first_version.load(std::memory_order_relaxed) +
                        iterations[key].fetch_add(1, std::memory_order_acq_rel);
    Request r{Request::Kind::kPushPull, key, it, it + 1, 0, false, 0, grad, out, h, pushed};
    r.marked = marked[key].exchange(0, std::memory_order_acq_rel);
    submit(r, "push_pull");
    return h;
  }

  void thread_main(std::promise<void> up);
};

void Worker::Impl::thread_main(std::promise<void> up) {
  // Named, so that a profile or top tells the net core from the trainer.
  pthread_setname_np(pthread_self(), "mercury-net");
  // Declared in teardown order: the core goes first, then the ports, then EAL.
  std::optional<net::Eal> eal;
  std::unique_ptr<net::NodeNetworks> nets;
  std::unique_ptr<NetCore> net_core;
  bool registered = false;
  try {
    if (owns_eal) {
      eal.emplace(eal_argv);  // rte_eal_init on this thread: EAL pins this one only
    } else {
      registered = rte_thread_register() == 0;  // an lcore id (mempool caches); optional
    }
    core.endpoint.transport.tsc_hz = rte_get_tsc_hz();
    net::PacketPort* node_port = port;
    if (node_port == nullptr) {
      // Its server may start after it: a net_memif port waits for it to
      // listen as long as start() would wait for it to answer.
      nets = std::make_unique<net::NodeNetworks>(*job, std::vector<std::string>{node},
                                                 core.start_timeout_ms);
      const std::vector<net::NodePort*> ports = nets->ports_of(node);
      if (ports.empty()) throw WorkerError("worker " + node + " has no port");
      node_port = ports.front()->interface.get();
    }
    net_core = std::make_unique<NetCore>(table, core, *node_port, queue, stats);
  } catch (...) {
    // Whatever it decided on, this worker takes no more hugepages now.
    config::hugepages_settled();
    up.set_exception(std::current_exception());
    net_core.reset();
    nets.reset();
    if (registered) rte_thread_unregister();
    return;  // `eal` cleans up on the way out
  }
  up.set_value();
  {
    // The net core's own loop, which it ends once it has stopped.
    node::Loop loop(
        {.idle = core.idle, .tick_hz = core.endpoint.transport.tsc_hz, .doorbell = &doorbell});
    net_core->attach(loop, true);
    loop.run();
    net_core.reset();
  }
  nets.reset();
  if (registered) rte_thread_unregister();
}

namespace {

void start_thread(Worker::Impl& impl) {
  std::promise<void> up;
  std::future<void> ready = up.get_future();
  impl.thread =
      std::thread([&impl, p = std::move(up)]() mutable { impl.thread_main(std::move(p)); });
  try {
    ready.get();
  } catch (const std::exception& e) {
    impl.thread.join();
    throw WorkerError("worker " + (impl.node.empty() ? std::string("(attached)") : impl.node) +
                      ": the net core did not start: " + e.what());
  }
}

}  // namespace

NetCoreConfig net_core_config(const config::JobConfig& job, std::string_view node) {
  const config::NodeConfig* me = nullptr;
  try {
    me = &job::worker_node(job, node);
  } catch (const config::ConfigError& e) {
    throw WorkerError(e.what());
  }
  NetCoreConfig c;
  // A spare has no rank until server 0 gives it one (NetCoreConfig::spare).
  c.rank = me->spare ? UINT32_MAX : me->rank;
  c.spare = me->spare;
  c.idle.mode = me->poll;
  c.optimizer = std::string(config::to_string(job.training.optimizer));
  c.sync = job.training.sync;
  c.staleness_bound = job.training.staleness_bound;
  c.placement = job::placement_options(job);
  c.optimizer_config = job::optimizer_config(job.training);
  c.pulls.async = c.sync != config::Sync::kBsp;
  c.workers = static_cast<uint32_t>(job.workers().size());
  for (const config::NodeConfig* s : job.servers()) {
    c.servers.push_back(ServerSpec{job::peer_of(*s), s->shards, std::nullopt});
    if (!s->standby.empty()) c.servers.back().standby = job::peer_of(job.node(s->standby));
  }
  if (c.servers.empty()) throw WorkerError(job.source + ": the job has no server");
  c.chunk_bytes = job.payload_bytes_per_packet();
  c.wait_for_servers = job.network.on_server_loss == config::OnServerLoss::kWait;
  c.server_wait_ms = static_cast<uint32_t>(job.network.server_wait_s * 1000);
  // The same derivation as every other node (lib/job); the TSC rate is set
  // by the net core once EAL is up.
  c.endpoint = job::endpoint_config(job, static_cast<uint16_t>(me->index), job::fresh_epoch(), 0);
  return c;
}

// ---------------------------------------------------------------------------
// Worker.

Worker::Worker(const WorkerOptions& given) {
  // The job file and the node: the caller's, else the launcher's (job/identity.h).
  WorkerOptions options = given;
  config::JobConfig job;
  try {
    job::Identity id = job::identify(given.job_file, given.node, config::Role::kWorker,
                                     job::process_environment());
    job = std::move(id.job);
    options.node = std::move(id.node);
  } catch (const std::exception& e) {
    throw WorkerError(e.what());
  }
  NetCoreConfig c = net_core_config(job, options.node);
  c.start_timeout_ms = options.start_timeout_ms;
  if (!options.idle_backoff) c.idle.mode = config::Poll::kBusy;
  impl_ = std::make_unique<Impl>(c);
  impl_->settings = agg::hyperparameters_of(c.optimizer_config);
  impl_->node = options.node;
  bool own = options.eal == EalMode::kStart;
  if (options.eal == EalMode::kAuto) own = rte_lcore_count() == 0;  // 0 until rte_eal_init
  impl_->owns_eal = own;
  if (own) {
    try {
      std::string notice;
      config::EalRunOptions eo;
      eo.hugepages = config::resolve_hugepages(
          job.eal, net::hugepage_need_bytes(job, {options.node}), &notice);
      eo.extra = options.eal_args;
      impl_->eal_argv = config::eal_args(job, std::vector<std::string>{options.node}, eo);
    } catch (const std::exception& e) {
      throw WorkerError(e.what());
    }
  }
  std::string dir = options.timeline;
  if (const char* env = std::getenv("MERCURY_TIMELINE"); dir.empty() && env != nullptr) dir = env;
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw WorkerError("timeline: cannot create " + dir + ": " + ec.message());
    impl_->timeline =
        std::make_unique<Timeline>(dir + "/" + options.node + ".json", options.node, c.rank);
    impl_->core.timeline = impl_->timeline.get();
  }
  impl_->job = std::move(job);
  start_thread(*impl_);
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->settings = agg::hyperparameters_of(impl_->core.optimizer_config);
}

Worker attach_worker(net::PacketPort& port, const NetCoreConfig& config) {
  auto impl = std::make_unique<Worker::Impl>(config);
  impl->port = &port;
  start_thread(*impl);
  return Worker(std::move(impl));
}

namespace {

// A PolledWorker's Impl: the net core built here, on the owner's thread.
std::unique_ptr<Worker::Impl> polled_impl(net::PacketPort& port, const NetCoreConfig& config,
                                          Worker::Impl*& out) {
  auto impl = std::make_unique<Worker::Impl>(config);
  impl->port = &port;
  impl->owner_polls = true;
  // The caller's clock rate if it gave one (a unit test's fake clock), else
  // the TSC's (EAL is up).
  if (impl->core.endpoint.transport.tsc_hz == 0) {
    impl->core.endpoint.transport.tsc_hz = rte_get_tsc_hz();
  }
  impl->polled = std::make_unique<NetCore>(impl->table, impl->core, port, impl->queue, impl->stats);
  // Nobody polls the servers while shutdown() runs this net core, unless it
  // is a poller of its owner's loop (attach): until then it stops at once.
  impl->polled->set_leave_on_stop(false);
  out = impl.get();
  return impl;
}

}  // namespace

PolledWorker::PolledWorker(net::PacketPort& port, const NetCoreConfig& config)
    : worker_(polled_impl(port, config, impl_)) {}

void PolledWorker::attach(node::Loop& loop, node::Tick (*clock)()) {
  if (impl_->owner_loop != nullptr) throw UsageError("PolledWorker: attached to a loop already");
  impl_->owner_loop = &loop;
  impl_->clock = clock;
  if (impl_->polled) {
    impl_->polled->attach(loop, false);
    // The owner's loop polls the servers too: a stop can wait for their
    // acknowledgement of the leave.
    impl_->polled->set_leave_on_stop(true);
  }
}

NetCore* PolledWorker::net_core() { return impl_->polled.get(); }

Worker::~Worker() {
  if (!impl_) return;
  try {
    shutdown();
  } catch (...) {
    // shutdown() only throws what the net core's stop could, which it does not.
  }
}

Worker::Worker(Worker&&) noexcept = default;
Worker& Worker::operator=(Worker&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        shutdown();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

// The public names of the servers' update rules and skip marker are theirs.
static_assert(static_cast<uint8_t>(Update::kOptimizerRank0) ==
              static_cast<uint8_t>(agg::UpdateRule::kOptimizerRank0));
static_assert(kSkipStepBits == agg::kSkipStepFloat32);

Key Worker::declare(std::string_view name, std::span<float> params, int priority, Update update) {
  Impl& i = *impl_;
  i.check_live("declare");
  if (i.started.load(std::memory_order_acquire) || i.table.frozen()) {
    throw UsageError("declare: tensor '" + std::string(name) +
                     "' declared after start: the declarations freeze at start() or at the "
                     "first push, pull, push_pull or barrier");
  }
  return i.table.declare(name, params, priority, static_cast<agg::UpdateRule>(update));
}

Key Worker::declare(std::string_view name, std::span<uint16_t> params, Dtype dtype, int priority,
                    Update update) {
  Impl& i = *impl_;
  i.check_live("declare");
  if (dtype != Dtype::kBFloat16 && dtype != Dtype::kFloat16) {
    throw UsageError("declare: tensor '" + std::string(name) + "' of 16-bit elements has dtype " +
                     std::to_string(static_cast<int>(dtype)) +
                     "; a std::span<uint16_t> is Dtype::kBFloat16 or Dtype::kFloat16");
  }
  if (i.started.load(std::memory_order_acquire) || i.table.frozen()) {
    throw UsageError("declare: tensor '" + std::string(name) +
                     "' declared after start: the declarations freeze at start() or at the "
                     "first push, pull, push_pull or barrier");
  }
  return i.table.declare(name, static_cast<wire::Dtype>(dtype), std::as_writable_bytes(params),
                         priority, static_cast<agg::UpdateRule>(update));
}

Dtype Worker::dtype(Key key) const { return static_cast<Dtype>(impl_->table.dtype(key)); }

Handle Worker::start_async() {
  Impl& i = *impl_;
  i.check_live("start");
  std::lock_guard lock(i.start_mutex);
  if (i.start) return *i.start;
  if (i.table.size() == 0) {
    throw UsageError("start: no tensor has been declared; declare every tensor first");
  }
  i.table.freeze(i.core.total_shards(), i.core.chunk_bytes, i.core.placement);
  std::shared_ptr<const Resume> resume;
  {
    std::lock_guard settings_lock(i.settings_mutex);
    if (i.resuming && i.core.rank == 0) resume = make_resume(i.table, i.core, i.resume);
    i.resume = {};
  }
  i.iterations = std::make_unique<std::atomic<uint32_t>[]>(i.table.tensors());
  // Published to the net core with the start request, below.
  i.stats.delivered = std::make_unique<std::atomic<uint32_t>[]>(i.table.tensors());
  i.stats.in_place = std::make_unique<std::atomic<uint32_t>[]>(i.table.tensors());
  i.marked = std::make_unique<std::atomic<uint32_t>[]>(i.table.tensors());
  Handle h;
  Request r{Request::Kind::kStart, 0, 0, 0, 0, false, 0, nullptr, nullptr, h, std::nullopt};
  r.resume = std::move(resume);
  i.submit(r, "start");
  i.start = h;
  return h;
}

void Worker::start() {
  Impl& i = *impl_;
  i.check_live("start");
  if (i.started.load(std::memory_order_acquire)) return;
  const Handle h = start_async();
  if (!h.ready()) i.check_may_block("start");
  if (!h.wait()) {
    if (i.stats.released.load(std::memory_order_relaxed)) throw SpareReleased(i.failure(h));
    throw WorkerError(i.failure(h));
  }
  // The links are up and the initial pull has gone through the server's
  // direction: the pushes' direction of a memif link is still unfaulted
  // shared memory, which the first push would fault in page by page
  // (docs/net.md, "net_memif's shared memory"). Only for the ports this
  // worker opened from its job file: a caller's own ports are the caller's.
  if (i.job) net::populate_memif_regions();
  // Every caller stores the same value; the handle's completion ordered it.
  i.first_version.store(i.stats.start_version.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
  // A process that joined a running job takes part in barriers from the
  // generation server 0 gave it (docs/membership.md, "Joining").
  i.barrier_generation.store(i.stats.barrier_base.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
  i.started.store(true, std::memory_order_release);
}

static_assert(static_cast<uint8_t>(Dtype::kFloat32) ==
                  static_cast<uint8_t>(wire::Dtype::kFloat32) &&
              static_cast<uint8_t>(Dtype::kBFloat16) ==
                  static_cast<uint8_t>(wire::Dtype::kBFloat16) &&
              static_cast<uint8_t>(Dtype::kFloat16) == static_cast<uint8_t>(wire::Dtype::kFloat16));

namespace {

const std::byte* bytes_of(std::span<const float> s) {
  return reinterpret_cast<const std::byte*>(s.data());
}
std::byte* bytes_of(std::span<float> s) { return reinterpret_cast<std::byte*>(s.data()); }
const std::byte* bytes_of(std::span<const uint16_t> s) {
  return reinterpret_cast<const std::byte*>(s.data());
}
std::byte* bytes_of(std::span<uint16_t> s) { return reinterpret_cast<std::byte*>(s.data()); }

}  // namespace

Handle Worker::push(Key key, std::span<const float> grad) {
  return impl_->push(*this, key, wire::Dtype::kFloat32, bytes_of(grad), grad.size());
}

// A minimum of version 0 adds nothing to any mode's rule.
Handle Worker::pull(Key key, std::span<float> out) { return pull(key, out, 0); }

Handle Worker::pull(Key key, std::span<float> out, uint32_t min_version) {
  return impl_->pull(*this, key, wire::Dtype::kFloat32, bytes_of(out), out.size(), min_version);
}

Handle Worker::push(Key key, std::span<const uint16_t> grad) {
  impl_->check_live("push");
  impl_->ensure_started(*this);  // the table is frozen: its dtypes are readable
  return impl_->push(*this, key, impl_->half_dtype(key, "push"), bytes_of(grad), grad.size());
}

Handle Worker::pull(Key key, std::span<uint16_t> out) { return pull(key, out, 0); }

Handle Worker::pull(Key key, std::span<uint16_t> out, uint32_t min_version) {
  impl_->check_live("pull");
  impl_->ensure_started(*this);  // the table is frozen: its dtypes are readable
  return impl_->pull(*this, key, impl_->half_dtype(key, "pull"), bytes_of(out), out.size(),
                     min_version);
}

Handle Worker::push_pull(Key key, std::span<const uint16_t> grad, std::span<uint16_t> out) {
  impl_->check_live("push_pull");
  impl_->ensure_started(*this);  // the table is frozen: its dtypes are readable
  return impl_->push_pull(*this, key, impl_->half_dtype(key, "push_pull"), bytes_of(grad),
                          bytes_of(out), grad.size(), out.size());
}

uint32_t Worker::version(Key key) const {
  const Impl& i = *impl_;
  if (!i.stats.delivered || key >= i.table.tensors()) {
    throw UsageError("version: no tensor with key " + std::to_string(key) +
                     (i.stats.delivered ? "" : " (the worker has not started)"));
  }
  return i.stats.delivered[key].load(std::memory_order_acquire);
}

uint32_t Worker::mark_read(Key key) {
  Impl& i = *impl_;
  i.check_live("mark_read");
  if (!i.stats.in_place || key >= i.table.tensors()) {
    throw UsageError("mark_read: no tensor with key " + std::to_string(key) +
                     (i.stats.in_place ? "" : " (the worker has not started)"));
  }
  if (i.core.sync == config::Sync::kBsp)
    return i.stats.delivered[key].load(std::memory_order_acquire);
  const uint32_t v = i.stats.in_place[key].load(std::memory_order_acquire);
  i.marked[key].store(v + 1, std::memory_order_release);
  return v;
}

std::string_view Worker::sync() const { return config::to_string(impl_->core.sync); }

Handle Worker::push_pull(Key key, std::span<const float> grad, std::span<float> out) {
  return impl_->push_pull(*this, key, wire::Dtype::kFloat32, bytes_of(grad), bytes_of(out),
                          grad.size(), out.size());
}

Handle Worker::barrier_async() {
  Impl& i = *impl_;
  i.check_live("barrier");
  i.ensure_started(*this);
  Handle h;
  const uint64_t generation = i.barrier_generation.fetch_add(1, std::memory_order_relaxed);
  Request r{
      Request::Kind::kBarrier, 0, 0, 0, 0, false, generation, nullptr, nullptr, h, std::nullopt};
  i.submit(r, "barrier");
  return h;
}

Hyperparameters Worker::hyperparameters() const {
  const Impl& i = *impl_;
  std::lock_guard lock(i.settings_mutex);
  const agg::Hyperparameters& h = i.settings;
  return Hyperparameters{h.learning_rate, h.momentum, h.weight_decay, h.beta1, h.beta2, h.epsilon};
}

Handle Worker::set_hyperparameters(const Hyperparameters& v) {
  Impl& i = *impl_;
  i.check_live("set_hyperparameters");
  const agg::OptimizerConfig& o = i.core.optimizer_config;
  if (o.kind == agg::OptimizerKind::kSumOnly) {
    throw UsageError(
        "set_hyperparameters: the job's training.optimizer is sum: the servers average, and the "
        "trainer's own optimizer has the hyperparameters");
  }
  if (!started()) {
    throw UsageError("set_hyperparameters: the worker has not started (start() first)");
  }
  i.ensure_started(*this);  // started: returns at once
  const agg::Hyperparameters h{.learning_rate = v.learning_rate,
                               .momentum = v.momentum,
                               .weight_decay = v.weight_decay,
                               .beta1 = v.beta1,
                               .beta2 = v.beta2,
                               .epsilon = v.epsilon};
  const std::string why = agg::hyperparameters_refused(o.kind, o.decoupled_weight_decay, h);
  if (!why.empty()) throw UsageError("set_hyperparameters: " + why);
  {
    std::lock_guard lock(i.settings_mutex);
    i.settings = h;
  }
  if (i.core.rank != 0) return Handle::completed();  // rank 0's are the job's
  Handle done;
  Request r{Request::Kind::kSettings, 0, 0, 0, 0, false, 0, nullptr, nullptr, done, std::nullopt};
  r.values = h;
  i.submit(r, "set_hyperparameters");
  return done;
}

Handle Worker::server_state_async(std::vector<std::byte>& out) {
  Impl& i = *impl_;
  i.check_live("server_state");
  if (!started()) throw UsageError("server_state: the worker has not started (start() first)");
  i.ensure_started(*this);  // started: returns at once
  Handle done;
  Request r{Request::Kind::kState, 0, 0, 0, 0, false, 0, nullptr, nullptr, done, std::nullopt};
  r.state_out = &out;
  i.submit(r, "server_state");
  return done;
}

std::vector<std::byte> Worker::server_state() {
  Impl& i = *impl_;
  i.check_may_block("server_state");
  std::vector<std::byte> out;
  const Handle h = server_state_async(out);
  if (!h.wait()) throw WorkerError(std::string(h.error()));
  return out;
}

void Worker::resume_from(std::span<const std::byte> state) {
  Impl& i = *impl_;
  i.check_live("resume_from");
  std::lock_guard start_lock(i.start_mutex);
  if (i.start) throw UsageError("resume_from: after start: the job has begun from its own values");
  if (i.core.sync != config::Sync::kBsp) {
    throw UsageError(std::string("resume_from: the job's training.sync is ") +
                     std::string(config::to_string(i.core.sync)) +
                     ": only bsp stops every chunk at one version");
  }
  if (i.core.optimizer_config.kind == agg::OptimizerKind::kSumOnly) {
    throw UsageError(
        "resume_from: the job's training.optimizer is sum: the servers keep no optimizer "
        "state, the trainer's checkpoint is the whole state");
  }
  std::lock_guard lock(i.settings_mutex);
  i.resume.assign(state.begin(), state.end());
  i.resuming = true;
}

uint32_t Worker::start_version() const {
  const Impl& i = *impl_;
  if (!started()) throw UsageError("start_version: the worker has not started");
  return i.stats.start_version.load(std::memory_order_acquire);
}

std::optional<uint32_t> Worker::joined_version() const {
  const Impl& i = *impl_;
  if (!started()) throw UsageError("joined_version: the worker has not started");
  if (!i.stats.joined.load(std::memory_order_acquire)) return std::nullopt;
  return i.stats.joined_version.load(std::memory_order_relaxed);
}

uint32_t Worker::roll_back() {
  Impl& i = *impl_;
  i.check_live("roll_back");
  if (!started()) throw UsageError("roll_back: the worker has not started");
  i.check_may_block("roll_back");
  Handle h;
  Request r{Request::Kind::kRollBack, 0, 0, 0, 0, false, 0, nullptr, nullptr, h, std::nullopt};
  i.submit(r, "roll_back");
  if (!h.wait()) throw WorkerError("roll_back: " + i.failure(h));
  // The net core stored the version before the count (release).
  const uint32_t done = i.stats.rollbacks.load(std::memory_order_acquire);
  const uint32_t version = i.stats.rollback_version.load(std::memory_order_relaxed);
  // Every tensor's pushes count from the version again.
  i.first_version.store(version, std::memory_order_relaxed);
  for (uint32_t t = 0; t < i.table.tensors(); ++t) {
    i.iterations[t].store(0, std::memory_order_relaxed);
  }
  // The barriers too: the ranks abandoned theirs at different points, and
  // the server that came back has seen none.
  i.barrier_generation.store(0, std::memory_order_relaxed);
  i.rollbacks_seen.store(done, std::memory_order_release);
  return version;
}

void Worker::barrier() {
  Impl& i = *impl_;
  i.check_live("barrier");
  i.check_may_block("barrier");
  const Handle h = barrier_async();
  if (!h.wait()) throw WorkerError("barrier: " + i.failure(h));
}

void Worker::shutdown() {
  if (!impl_) return;
  Impl& i = *impl_;
  if (i.shut_down.exchange(true, std::memory_order_seq_cst)) {
    i.down.wait(false, std::memory_order_acquire);  // another thread is shutting down
    return;
  }
  while (i.callers.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  Handle stopped;
  Request r{Request::Kind::kStop, 0, 0, 0, 0, false, 0, nullptr, nullptr, stopped, std::nullopt};
  while (!i.queue.try_push_mp(r)) std::this_thread::yield();
  i.doorbell.ring();
  if (i.polled) {
    // The owner's thread runs its loop (this net core and whatever else it
    // polls) until the net core has taken the stop; a net core never
    // attached runs on a loop of its own here.
    std::optional<node::Loop> own;
    node::Loop* loop = i.owner_loop;
    if (loop == nullptr) {
      own.emplace(node::LoopOptions{.tick_hz = i.core.endpoint.transport.tsc_hz});
      i.polled->attach(*own, false);
      loop = &*own;
    } else if (!loop->contains(*i.polled)) {
      loop->add(*i.polled);  // its owner took it off the loop (a test's dead rank)
    }
    while (!stopped.ready()) loop->pass_st(i.clock());
    i.polled.reset();
  } else {
    stopped.wait();
    i.thread.join();
  }
  if (i.timeline) {
    // The net core has stopped: its events are complete and this thread's.
    std::string failed;
    try {
      failed = i.timeline->write(i.table);
    } catch (const std::exception& e) {
      failed = i.timeline->path() + ": " + e.what();
    }
    if (!failed.empty())
      std::fprintf(stderr, "mercury: timeline not written: %s\n", failed.c_str());
    if (i.timeline->dropped() != 0) {
      std::fprintf(stderr, "mercury: timeline %s: %llu events did not fit and are missing\n",
                   i.timeline->path().c_str(),
                   static_cast<unsigned long long>(i.timeline->dropped()));
    }
  }
  i.table.shutdown();
  i.down.store(true, std::memory_order_release);
  i.down.notify_all();
}

Key Worker::key(std::string_view name) const {
  impl_->check_live("key");
  if (!impl_->table.frozen()) {
    throw UsageError(
        "key: tensors are looked up by name once the worker has started; before, "
        "use the key declare() returned");
  }
  return impl_->table.find(name);
}

uint32_t Worker::rank() const {
  const Impl& i = *impl_;
  if (!i.core.spare) return i.core.rank;
  if (!i.started.load(std::memory_order_acquire)) {
    throw UsageError("rank: this worker is a spare; it has a rank once start() returned");
  }
  return i.stats.rank.load(std::memory_order_relaxed);  // stored before the start completed
}
bool Worker::spare() const { return impl_->core.spare; }
uint32_t Worker::workers() const { return impl_->core.workers; }
uint32_t Worker::tensors() const { return impl_->table.size(); }
std::string_view Worker::optimizer() const { return impl_->core.optimizer; }
bool Worker::timeline_enabled() const { return impl_->timeline != nullptr; }
void Worker::timeline_span(std::string_view name, std::string_view track, uint64_t begin_ns,
                           uint64_t end_ns) {
  if (impl_->timeline) impl_->timeline->span(name, track, begin_ns, end_ns);
}
bool Worker::started() const {
  const Impl& i = *impl_;
  if (i.started.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(i.start_mutex);
  return i.start && i.start->ok();
}

WorkerStats Worker::stats() const {
  const PublishedStats& s = impl_->stats;
  WorkerStats w;
  w.pushes = s.pushes.load(std::memory_order_relaxed);
  w.pulls = s.pulls.load(std::memory_order_relaxed);
  w.bytes_pushed = s.bytes_pushed.load(std::memory_order_relaxed);
  w.chunks_received = s.chunks_received.load(std::memory_order_relaxed);
  w.bytes_placed = s.bytes_placed.load(std::memory_order_relaxed);
  w.versions_completed = s.versions_completed.load(std::memory_order_relaxed);
  w.retransmits = s.retransmits.load(std::memory_order_relaxed);
  w.chunks_dropped = s.chunks_dropped.load(std::memory_order_relaxed);
  w.control_dropped = s.control_dropped.load(std::memory_order_relaxed);
  w.staleness_sum = s.staleness_sum.load(std::memory_order_relaxed);
  w.stale_pushes = s.stale_pushes.load(std::memory_order_relaxed);
  w.staleness_max = s.staleness_max.load(std::memory_order_relaxed);
  w.ssp_waits = s.ssp_waits.load(std::memory_order_relaxed);
  w.ssp_gap_max = s.ssp_gap_max.load(std::memory_order_relaxed);
  w.workers_removed = s.workers_removed.load(std::memory_order_relaxed);
  w.workers_left = s.workers_left.load(std::memory_order_relaxed);
  w.workers_joined = s.workers_joined.load(std::memory_order_relaxed);
  w.standby_takeovers = s.standby_takeovers.load(std::memory_order_relaxed);
  w.tensors_resent = s.tensors_resent.load(std::memory_order_relaxed);
  return w;
}

std::vector<DropCount> Worker::drops() const {
  const PublishedStats& s = impl_->stats;
  std::vector<DropCount> d;
  auto add = [&d](std::string_view name, const std::atomic<uint64_t>& n) {
    const uint64_t v = n.load(std::memory_order_relaxed);
    if (v != 0) d.emplace_back(std::string(name), v);
  };
  for (size_t i = 0; i < net::kDropReasonCount; ++i) {
    add(net::drop_reason_name(static_cast<net::DropReason>(i)), s.port_drops[i]);
  }
  for (size_t i = 0; i < transport::kEndpointDropCount; ++i) {
    add(transport::endpoint_drop_name(static_cast<transport::EndpointDrop>(i)),
        s.transport_drops[i]);
  }
  for (size_t i = 0; i < kPmdDropCount; ++i) add(kPmdDrops[i].name, s.pmd_drops[i]);
  return d;
}

}  // namespace mercury::worker
