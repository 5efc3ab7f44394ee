// mercury._mercury: the worker library (mercury/worker.h) for Python, as a
// pybind11 extension, and the C++ job-file loader (config/config.h) and
// identity rule (job/identity.h), so that Python reads job files the way
// every other process does. The public, typed Python API is
// mercury/__init__.py, which wraps these; nothing else should import this
// module.
//
// Buffers. declare(), push(), pull() and push_pull() take any object with
// the buffer protocol (numpy arrays; torch tensors go through
// tensor.numpy() in __init__.py, a bfloat16 one as its int16 view) holding
// C-contiguous elements of the dtype __init__.py names with it (1 float32,
// 2 bfloat16, 3 float16: mercury::worker::Dtype; a 16-bit buffer may be
// numpy float16 or 16-bit integers holding the elements' bits), and use its
// memory in place: nothing is copied. A memoryview of each is held (so a
// resizable exporter cannot move its memory) as long as the library may
// touch it: declared buffers by the Worker; a transfer's buffers by its
// Handle until the transfer completes, even when the Python Handle is
// dropped before (its destructor hands them to the completion, and the
// dispatcher thread releases them).
//
// The GIL. Every call that can block (connect, start, barrier, shutdown,
// Handle.wait, and push/pull when the request queue is full) releases it,
// so trainer threads, the autograd engine and completion callbacks keep
// running meanwhile.
//
// Completion callbacks. A Handle completes on the worker's net core, which
// must never block, so it cannot take the GIL to call Python. Instead
// add_done_callback() allocates a node (on the caller's thread, GIL held)
// holding the Python callable and the handle; the net core's completion
// links the node onto a lock-free stack and wakes the dispatcher, a daemon
// Python thread (started by __init__.py at import) that waits in
// run_callbacks() with the GIL released and calls the callables in
// completion order, holding the GIL. Once the interpreter is finalizing,
// the dispatcher never takes the GIL again (a daemon thread that does is
// ended by Python, which would terminate the process): it blocks for good.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "job/identity.h"
#include "mercury/worker.h"

namespace py = pybind11;
namespace mw = mercury::worker;

namespace {

// Python's exceptions for the library's two C++ ones and a failed transfer
// (created at import; __init__.py re-exports them).
PyObject* usage_error = nullptr;
PyObject* worker_error = nullptr;
PyObject* spare_released = nullptr;

// A C-contiguous view of a Python buffer of elements of a dtype, and the
// object that owns it. Refuses anything else with a TypeError/ValueError
// naming `what`.
struct ElementBuffer {
  py::object owner;
  void* data = nullptr;
  size_t elements = 0;
  mw::Dtype dtype = mw::Dtype::kFloat32;
  [[nodiscard]] std::span<float> floats() const { return {static_cast<float*>(data), elements}; }
  [[nodiscard]] std::span<uint16_t> halves() const {
    return {static_cast<uint16_t*>(data), elements};
  }
};

const char* dtype_name(mw::Dtype d) {
  switch (d) {
    case mw::Dtype::kFloat32:
      return "float32";
    case mw::Dtype::kBFloat16:
      return "bfloat16";
    case mw::Dtype::kFloat16:
      return "float16";
  }
  return "?";
}

// Whether a buffer's struct-module format holds `d`'s elements: float32 as
// 'f'; bfloat16 as 16-bit integers (numpy has no bfloat16; torch's
// bfloat16 tensors come as their int16 view); float16 as 'e' or 16-bit
// integers.
bool format_holds(std::string format, py::ssize_t itemsize, mw::Dtype d) {
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@')) {
    format.erase(0, 1);
  }
  const bool ints16 = itemsize == 2 && (format == "h" || format == "H");
  switch (d) {
    case mw::Dtype::kFloat32:
      return itemsize == 4 && format == "f";
    case mw::Dtype::kBFloat16:
      return ints16;
    case mw::Dtype::kFloat16:
      return ints16 || (itemsize == 2 && format == "e");
  }
  return false;
}

ElementBuffer element_buffer(const py::object& obj, int dtype, bool writable, const char* what) {
  if (dtype < 1 || dtype > 3) {
    throw py::value_error(std::string(what) + ": dtype " + std::to_string(dtype) +
                          " is not 1 (float32), 2 (bfloat16) or 3 (float16)");
  }
  const auto d = static_cast<mw::Dtype>(dtype);
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(std::string(what) + ": expected a " + dtype_name(d) +
                         " array (numpy or torch), got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  // The memoryview holds the buffer export for as long as it lives.
  py::memoryview view = py::memoryview(obj);
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(view).request(writable);
  if (!format_holds(info.format, info.itemsize, d)) {
    throw py::type_error(std::string(what) + ": expected " + dtype_name(d) +
                         " elements, got format '" + info.format + "' of " +
                         std::to_string(info.itemsize) + " bytes");
  }
  // C-contiguous: strides are those of a dense row-major array.
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t dim = info.ndim; dim-- > 0;) {
    if (info.shape[dim] != 1 && info.strides[dim] != expected) {
      throw py::value_error(std::string(what) +
                            ": the array is not contiguous (use numpy.ascontiguousarray or "
                            "tensor.contiguous(), and declare that copy)");
    }
    expected *= info.shape[dim];
  }
  return ElementBuffer{std::move(view), info.ptr, static_cast<size_t>(info.size), d};
}

// ---- completion callbacks (see the file comment) ----

struct CallbackNode {
  CallbackNode* next = nullptr;
  py::object fn;                 // the Python callable (none: only release `keep`)
  py::object handle;             // the Python Handle passed to it
  std::vector<py::object> keep;  // buffers of a dropped Handle, released here
};

class CallbackQueue {
 public:
  // Net core: links a node allocated by the registering thread. Lock-free,
  // no allocation; the futex wake happens only when the dispatcher waits.
  void push(CallbackNode* node) noexcept {
    CallbackNode* head = head_.load(std::memory_order_relaxed);
    do {
      node->next = head;
      // Release: the dispatcher's acquire exchange in take() sees the node's
      // fields as the registering thread wrote them.
    } while (!head_.compare_exchange_weak(head, node, std::memory_order_release,
                                          std::memory_order_relaxed));
    sequence_.fetch_add(1, std::memory_order_release);
    sequence_.notify_one();
  }

  // Dispatcher, GIL released: blocks until at least one node is queued,
  // then returns them all, oldest first.
  CallbackNode* take() noexcept {
    for (;;) {
      const uint32_t seen = sequence_.load(std::memory_order_acquire);
      // Acquire pairs with push()'s release CAS.
      CallbackNode* list = head_.exchange(nullptr, std::memory_order_acquire);
      if (list != nullptr) {
        CallbackNode* ordered = nullptr;  // the stack is newest first: reverse it
        while (list != nullptr) {
          CallbackNode* next = list->next;
          list->next = ordered;
          ordered = list;
          list = next;
        }
        return ordered;
      }
      sequence_.wait(seen, std::memory_order_acquire);
    }
  }

 private:
  std::atomic<CallbackNode*> head_{nullptr};
  std::atomic<uint32_t> sequence_{0};
};

CallbackQueue& callbacks() {
  // Never destroyed: the net core of a worker the interpreter leaks at exit
  // may still complete a handle after static destructors would have run.
  static CallbackQueue* queue = new CallbackQueue;  // NOLINT: intentionally leaked
  return *queue;
}

// Runs every queued callback; returns how many ran. Called in a loop by the
// dispatcher thread of __init__.py. An exception from a callback is printed
// (as Python does for a thread's) and does not stop the others.
int run_callbacks() {
  CallbackNode* list = nullptr;
  {
    py::gil_scoped_release release;
    list = callbacks().take();
    if (_Py_IsFinalizing()) {
      release.disarm();  // never take the GIL back (see the file comment)
      for (;;) pause();
    }
  }
  int ran = 0;
  while (list != nullptr) {
    std::unique_ptr<CallbackNode> node(list);
    list = node->next;
    if (!node->fn) continue;
    try {
      node->fn(node->handle);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("mercury Handle callback");
    }
    ++ran;
  }
  return ran;
}

// ---- Handle ----

struct PyHandle {
  mw::Handle handle;
  std::vector<py::object> keep;  // the buffers the transfer reads or writes

  PyHandle() = default;
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;
  // Runs with the GIL held (the Python object is being freed). A transfer
  // still running keeps its buffers: they go to the dispatcher with the
  // completion.
  ~PyHandle() {
    if (keep.empty() || handle.ready()) return;
    auto node = std::make_unique<CallbackNode>();
    node->keep = std::move(keep);
    CallbackNode* raw = node.release();
    handle.on_complete([raw](const mw::Handle&) { callbacks().push(raw); });
  }

  bool wait() {
    bool ok = false;
    {
      py::gil_scoped_release release;
      ok = handle.wait();
    }
    return ok;
  }
};

void add_done_callback(const std::shared_ptr<PyHandle>& self, py::object self_obj, py::object fn) {
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("add_done_callback: fn is not callable");
  auto node = std::make_unique<CallbackNode>();
  node->fn = std::move(fn);
  node->handle = std::move(self_obj);
  CallbackNode* raw = node.release();
  // The C++ callback runs once, on the net core or here; either way it only
  // links the node (the dispatcher calls Python).
  self->handle.on_complete([raw](const mw::Handle&) { callbacks().push(raw); });
}

// ---- Worker ----

class PyWorker {
 public:
  PyWorker(const std::string& job_file, const std::string& node, std::vector<std::string> eal_args,
           uint32_t start_timeout_ms, bool idle_backoff, const std::string& timeline) {
    mw::WorkerOptions o;
    o.job_file = job_file;
    o.node = node;
    o.eal_args = std::move(eal_args);
    o.start_timeout_ms = start_timeout_ms;
    o.idle_backoff = idle_backoff;
    o.timeline = timeline;
    py::gil_scoped_release release;
    worker_ = std::make_unique<mw::Worker>(o);
  }
  PyWorker(const PyWorker&) = delete;
  PyWorker& operator=(const PyWorker&) = delete;
  // Shutting down waits for the net core: not with the GIL held. The
  // declared buffers are released after (members go after the body).
  ~PyWorker() {
    py::gil_scoped_release release;
    worker_.reset();
  }

  uint32_t declare(const std::string& name, const py::object& params, int dtype, int priority,
                   int update) {
    ElementBuffer b = element_buffer(params, dtype, true, "declare");
    mw::Worker& w = live();
    const auto rule = static_cast<mw::Update>(update);
    const mw::Key key = b.dtype == mw::Dtype::kFloat32
                            ? w.declare(name, b.floats(), priority, rule)
                            : w.declare(name, b.halves(), b.dtype, priority, rule);
    declared_.push_back(std::move(b.owner));
    return key;
  }

  void start() {
    mw::Worker& w = live();
    py::gil_scoped_release release;
    w.start();
  }

  // A transfer's buffer of `key`: its dtype must be the tensor's (nothing
  // converts; a float32 one the float32 calls refuse themselves).
  ElementBuffer transfer_buffer(mw::Key key, const py::object& obj, int dtype, bool writable,
                                const char* what) {
    ElementBuffer b = element_buffer(obj, dtype, writable, what);
    if (b.dtype != mw::Dtype::kFloat32) {
      const mw::Dtype has = live().dtype(key);
      if (has != b.dtype && has != mw::Dtype::kFloat32) {
        throw mw::UsageError(std::string(what) + ": tensor " + std::to_string(key) + " is " +
                             dtype_name(has) + " but the buffer is " + dtype_name(b.dtype));
      }
    }
    return b;
  }

  std::shared_ptr<PyHandle> push(mw::Key key, const py::object& grad, int dtype) {
    ElementBuffer g = transfer_buffer(key, grad, dtype, false, "push");
    mw::Worker& w = live();
    auto h = std::make_shared<PyHandle>();
    {
      py::gil_scoped_release release;
      h->handle = g.dtype == mw::Dtype::kFloat32
                      ? w.push(key, std::span<const float>(g.floats()))
                      : w.push(key, std::span<const uint16_t>(g.halves()));
    }
    h->keep.push_back(std::move(g.owner));
    return h;
  }

  std::shared_ptr<PyHandle> pull(mw::Key key, const py::object& out, int dtype) {
    return pull_min(key, out, dtype, 0);  // a minimum of version 0 adds nothing
  }

  std::shared_ptr<PyHandle> pull_min(mw::Key key, const py::object& out, int dtype,
                                     uint32_t min_version) {
    ElementBuffer o = transfer_buffer(key, out, dtype, true, "pull");
    mw::Worker& w = live();
    auto h = std::make_shared<PyHandle>();
    {
      py::gil_scoped_release release;
      h->handle = o.dtype == mw::Dtype::kFloat32 ? w.pull(key, o.floats(), min_version)
                                                 : w.pull(key, o.halves(), min_version);
    }
    h->keep.push_back(std::move(o.owner));
    return h;
  }

  std::shared_ptr<PyHandle> push_pull(mw::Key key, const py::object& grad, const py::object& out,
                                      int dtype) {
    ElementBuffer g = transfer_buffer(key, grad, dtype, false, "push_pull (grad)");
    ElementBuffer o = transfer_buffer(key, out, dtype, true, "push_pull (out)");
    mw::Worker& w = live();
    auto h = std::make_shared<PyHandle>();
    {
      py::gil_scoped_release release;
      h->handle = g.dtype == mw::Dtype::kFloat32
                      ? w.push_pull(key, std::span<const float>(g.floats()), o.floats())
                      : w.push_pull(key, std::span<const uint16_t>(g.halves()), o.halves());
    }
    h->keep.push_back(std::move(g.owner));
    h->keep.push_back(std::move(o.owner));
    return h;
  }

  int dtype(mw::Key key) { return static_cast<int>(live().dtype(key)); }

  void barrier() {
    mw::Worker& w = live();
    py::gil_scoped_release release;
    w.barrier();
  }

  std::shared_ptr<PyHandle> barrier_async() {
    mw::Worker& w = live();
    auto h = std::make_shared<PyHandle>();
    py::gil_scoped_release release;  // it may start the worker, or wait for queue room
    h->handle = w.barrier_async();
    return h;
  }

  void shutdown() {
    if (!worker_) return;
    {
      py::gil_scoped_release release;
      worker_->shutdown();
    }
  }

  mw::Key key(const std::string& name) const { return live().key(name); }
  uint32_t rank() const { return live().rank(); }
  bool spare() const { return live().spare(); }
  uint32_t workers() const { return live().workers(); }
  uint32_t tensors() const { return live().tensors(); }
  bool started() const { return live().started(); }
  std::string optimizer() const { return std::string(live().optimizer()); }
  std::string sync() const { return std::string(live().sync()); }
  uint32_t version(mw::Key key) const { return live().version(key); }
  uint32_t mark_read(mw::Key key) { return live().mark_read(key); }
  bool timeline_enabled() const { return live().timeline_enabled(); }
  void timeline_span(const std::string& name, const std::string& track, uint64_t begin_ns,
                     uint64_t end_ns) {
    live().timeline_span(name, track, begin_ns, end_ns);
  }

  // Settings and checkpoints: the hyperparameters as a dict of floats, the
  // state as bytes.
  py::dict hyperparameters() const {
    const mw::Hyperparameters h = live().hyperparameters();
    py::dict d;
    d["learning_rate"] = h.learning_rate;
    d["momentum"] = h.momentum;
    d["weight_decay"] = h.weight_decay;
    d["beta1"] = h.beta1;
    d["beta2"] = h.beta2;
    d["epsilon"] = h.epsilon;
    return d;
  }

  std::shared_ptr<PyHandle> set_hyperparameters(const py::dict& values) {
    mw::Hyperparameters h = live().hyperparameters();
    for (const auto& [k, v] : values) {
      const std::string name = py::str(k);
      const auto f = v.cast<float>();
      if (name == "learning_rate") {
        h.learning_rate = f;
      } else if (name == "momentum") {
        h.momentum = f;
      } else if (name == "weight_decay") {
        h.weight_decay = f;
      } else if (name == "beta1") {
        h.beta1 = f;
      } else if (name == "beta2") {
        h.beta2 = f;
      } else if (name == "epsilon") {
        h.epsilon = f;
      } else {
        throw mw::UsageError("set_hyperparameters: no hyperparameter is called '" + name +
                             "' (learning_rate, momentum, weight_decay, beta1, beta2, epsilon)");
      }
    }
    mw::Worker& w = live();
    auto handle = std::make_shared<PyHandle>();
    py::gil_scoped_release release;  // it may wait for queue room
    handle->handle = w.set_hyperparameters(h);
    return handle;
  }

  py::bytes server_state() {
    mw::Worker& w = live();
    std::vector<std::byte> state;
    {
      py::gil_scoped_release release;
      state = w.server_state();
    }
    return py::bytes(reinterpret_cast<const char*>(state.data()), state.size());
  }

  void resume_from(const py::bytes& state) {
    const std::string_view v = state;
    live().resume_from(std::span(reinterpret_cast<const std::byte*>(v.data()), v.size()));
  }

  uint32_t start_version() const { return live().start_version(); }

  // None for a process that started with the job.
  py::object joined_version() const {
    const std::optional<uint32_t> v = live().joined_version();
    return v ? py::object(py::int_(*v)) : py::object(py::none());
  }

  uint32_t roll_back() {
    mw::Worker& w = live();
    py::gil_scoped_release release;
    return w.roll_back();
  }

  py::dict stats() const {
    const mw::WorkerStats s = live().stats();
    py::dict d;
    d["pushes"] = s.pushes;
    d["pulls"] = s.pulls;
    d["bytes_pushed"] = s.bytes_pushed;
    d["chunks_received"] = s.chunks_received;
    d["bytes_placed"] = s.bytes_placed;
    d["versions_completed"] = s.versions_completed;
    d["retransmits"] = s.retransmits;
    d["chunks_dropped"] = s.chunks_dropped;
    d["control_dropped"] = s.control_dropped;
    d["staleness_sum"] = s.staleness_sum;
    d["stale_pushes"] = s.stale_pushes;
    d["staleness_max"] = s.staleness_max;
    d["ssp_waits"] = s.ssp_waits;
    d["ssp_gap_max"] = s.ssp_gap_max;
    d["workers_removed"] = s.workers_removed;
    d["workers_left"] = s.workers_left;
    d["workers_joined"] = s.workers_joined;
    d["standby_takeovers"] = s.standby_takeovers;
    d["tensors_resent"] = s.tensors_resent;
    py::dict drops;
    for (const auto& [name, n] : live().drops()) drops[py::str(name)] = n;
    d["drops"] = drops;
    return d;
  }

 private:
  mw::Worker& live() const {
    if (!worker_) throw mw::UsageError("the worker is not connected");
    return *worker_;
  }

  std::unique_ptr<mw::Worker> worker_;
  // Declared buffers: the net core writes into them until the worker is
  // destroyed, which happens before this vector is (member order).
  std::vector<py::object> declared_;
};

// ---- the job file, through the C++ loader (one reader, one set of defaults) ----

py::dict node_dict(const mercury::config::NodeConfig& n) {
  namespace mc = mercury::config;
  py::dict d;
  d["name"] = n.name;
  d["role"] = std::string(mc::to_string(n.role));
  d["index"] = n.index;
  d["rank"] = n.rank;
  d["spare"] = n.spare;
  d["ipv4"] = n.ipv4.to_string();
  d["udp_port"] = n.udp_port;
  d["mac"] = n.mac ? py::object(py::str(n.mac->to_string())) : py::object(py::none());
  py::list ports;
  for (const mc::PortSpec& p : n.ports) ports.append(p.text);
  d["ports"] = ports;
  d["lcores"] = n.lcores;
  d["shards"] = n.shards;
  d["poll"] = std::string(mc::to_string(n.poll));
  return d;
}

// Every setting of the job as the loader resolved it, defaults included.
py::dict job_dict(const mercury::config::JobConfig& j) {
  namespace mc = mercury::config;
  py::dict d;
  d["source"] = j.source;
  d["id"] = j.id;
  d["name"] = j.name;
  py::dict net;
  net["mtu"] = j.network.mtu;
  net["udp_port"] = j.network.udp_port;
  net["udp_checksum"] = std::string(mc::to_string(j.network.udp_checksum));
  net["poll"] = std::string(mc::to_string(j.network.poll));
  net["window"] = j.network.window;
  net["peer_timeout_ms"] = j.network.peer_timeout_ms;
  net["scheduler"] = std::string(mc::to_string(j.network.scheduler));
  net["partition_bytes"] = j.network.partition_bytes;
  net["credit_bytes"] = j.network.credit_bytes;
  net["auth_key_file"] = j.network.auth_key_file;
  net["payload_bytes_per_packet"] = j.payload_bytes_per_packet();
  d["network"] = net;
  py::dict eal;
  eal["memory_mb"] = j.eal.memory_mb;
  eal["hugepages"] = std::string(mc::to_string(j.eal.hugepages));
  eal["extra"] = j.eal.extra;
  d["eal"] = eal;
  py::dict t;
  const mc::TrainingConfig& tr = j.training;
  t["sync"] = std::string(mc::to_string(tr.sync));
  t["staleness_bound"] = tr.staleness_bound;
  t["staleness_lr"] = std::string(mc::to_string(tr.staleness_lr));
  t["aggregation"] = std::string(mc::to_string(tr.aggregation));
  t["optimizer"] = std::string(mc::to_string(tr.optimizer));
  t["learning_rate"] = tr.learning_rate;
  t["momentum"] = tr.momentum;
  t["beta1"] = tr.beta1;
  t["beta2"] = tr.beta2;
  t["epsilon"] = tr.epsilon;
  t["weight_decay"] = tr.weight_decay;
  d["training"] = t;
  py::list nodes;
  for (const mc::NodeConfig& n : j.nodes) nodes.append(node_dict(n));
  d["nodes"] = nodes;
  return d;
}

// A ConfigError as Python's mercury.JobError (a ValueError), with its parts.
PyObject* job_error = nullptr;

template <class F>
auto config_call(F&& f) {
  try {
    return f();
  } catch (const mercury::config::ConfigError& e) {
    py::object err = py::reinterpret_borrow<py::object>(job_error)(e.what());
    err.attr("source") = e.source();
    err.attr("line") = e.line();
    err.attr("key") = e.key();
    PyErr_SetObject(job_error, err.ptr());
    throw py::error_already_set();
  }
}

py::dict load_job(const std::string& path) {
  return config_call([&] { return job_dict(mercury::config::load_file(path)); });
}

// (the job's resolved dict, the node's name, how it was chosen)
py::tuple identify(const std::string& job, const std::string& node, const std::string& role) {
  namespace mc = mercury::config;
  if (role != "worker" && role != "server") {
    throw py::value_error("identify: role is 'worker' or 'server', not '" + role + "'");
  }
  return config_call([&] {
    mercury::job::Identity id =
        mercury::job::identify(job, node, role == "server" ? mc::Role::kServer : mc::Role::kWorker,
                               mercury::job::process_environment());
    return py::make_tuple(job_dict(id.job), id.node, id.how);
  });
}

// The launcher's (rank, size, variables) or None.
py::object launcher() {
  return config_call([&]() -> py::object {
    const auto l = mercury::job::launcher_rank(mercury::job::process_environment());
    if (!l) return py::none();
    return py::make_tuple(l->rank, l->size, l->source);
  });
}

}  // namespace

PYBIND11_MODULE(_mercury, m) {
  m.doc() = "Mercury's worker library (internal: use the mercury package)";

  usage_error = PyErr_NewException("mercury.UsageError", PyExc_ValueError, nullptr);
  worker_error = PyErr_NewException("mercury.WorkerError", PyExc_RuntimeError, nullptr);
  spare_released = PyErr_NewException("mercury.SpareReleased", worker_error, nullptr);
  m.attr("SKIP_STEP_BITS") = mw::kSkipStepBits;
  m.attr("UsageError") = py::handle(usage_error);
  m.attr("WorkerError") = py::handle(worker_error);
  m.attr("SpareReleased") = py::handle(spare_released);
  job_error = PyErr_NewException("mercury.JobError", PyExc_ValueError, nullptr);
  m.attr("JobError") = py::handle(job_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mw::UsageError& e) {
      PyErr_SetString(usage_error, e.what());
    } catch (const mw::SpareReleased& e) {
      PyErr_SetString(spare_released, e.what());
    } catch (const mw::WorkerError& e) {
      PyErr_SetString(worker_error, e.what());
    }
  });

  py::class_<PyHandle, std::shared_ptr<PyHandle>>(m, "Handle")
      .def("wait", &PyHandle::wait)
      .def("ready", [](const PyHandle& h) { return h.handle.ready(); })
      .def("ok", [](const PyHandle& h) { return h.handle.ok(); })
      .def("error", [](const PyHandle& h) { return std::string(h.handle.error()); })
      .def("add_done_callback", [](py::object self, py::object fn) {
        add_done_callback(self.cast<std::shared_ptr<PyHandle>>(), self, std::move(fn));
      });

  py::class_<PyWorker>(m, "Worker")
      .def(py::init<const std::string&, const std::string&, std::vector<std::string>, uint32_t,
                    bool, const std::string&>(),
           py::arg("job_file"), py::arg("node"), py::arg("eal_args"), py::arg("start_timeout_ms"),
           py::arg("idle_backoff"), py::arg("timeline"))
      .def("declare", &PyWorker::declare)
      .def("start", &PyWorker::start)
      .def("push", &PyWorker::push)
      .def("pull", &PyWorker::pull)
      .def("pull_min", &PyWorker::pull_min)
      .def("version", &PyWorker::version)
      .def("mark_read", &PyWorker::mark_read)
      .def("sync", &PyWorker::sync)
      .def("push_pull", &PyWorker::push_pull)
      .def("dtype", &PyWorker::dtype)
      .def("barrier", &PyWorker::barrier)
      .def("barrier_async", &PyWorker::barrier_async)
      .def("shutdown", &PyWorker::shutdown)
      .def("key", &PyWorker::key)
      .def("rank", &PyWorker::rank)
      .def("spare", &PyWorker::spare)
      .def("workers", &PyWorker::workers)
      .def("tensors", &PyWorker::tensors)
      .def("started", &PyWorker::started)
      .def("optimizer", &PyWorker::optimizer)
      .def("timeline_enabled", &PyWorker::timeline_enabled)
      .def("timeline_span", &PyWorker::timeline_span)
      .def("hyperparameters", &PyWorker::hyperparameters)
      .def("set_hyperparameters", &PyWorker::set_hyperparameters)
      .def("server_state", &PyWorker::server_state)
      .def("resume_from", &PyWorker::resume_from)
      .def("start_version", &PyWorker::start_version)
      .def("joined_version", &PyWorker::joined_version)
      .def("roll_back", &PyWorker::roll_back)
      .def("stats", &PyWorker::stats);

  m.def("run_callbacks", &run_callbacks);
  m.def("load_job", &load_job, py::arg("path"));
  m.def("identify", &identify, py::arg("job"), py::arg("node"), py::arg("role"));
  m.def("launcher", &launcher);
}
