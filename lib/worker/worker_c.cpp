// mercury/worker_c.h over mercury/worker.h: every call catches what the C++
// API throws and turns it into a status and a thread-local text.
#include "mercury/worker_c.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>

#include "mercury/worker.h"
#include "worker/attach.h"

struct mercury_worker {
  explicit mercury_worker(mercury::worker::Worker w) : worker(std::move(w)) {}
  mercury::worker::Worker worker;
};

struct mercury_handle {
  explicit mercury_handle(mercury::worker::Handle h) : handle(std::move(h)) {}
  mercury::worker::Handle handle;
  std::once_flag error_once;
  std::string error;  // NUL-terminated copy of handle.error(), made once
};

namespace {

using mercury::worker::Handle;
using mercury::worker::UsageError;
using mercury::worker::WorkerError;
using mercury::worker::WorkerStats;

thread_local std::string g_last_error;

int fail(int status, const char* what) {
  g_last_error = what;
  return status;
}

// Runs `fn`, mapping exceptions to statuses.
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    g_last_error.clear();
    fn();
    return MERCURY_OK;
  } catch (const UsageError& e) {
    return fail(MERCURY_E_USAGE, e.what());
  } catch (const mercury::worker::SpareReleased& e) {
    return fail(MERCURY_E_RELEASED, e.what());
  } catch (const WorkerError& e) {
    return fail(MERCURY_E_WORKER, e.what());
  } catch (const std::exception& e) {
    return fail(MERCURY_E_INTERNAL, e.what());
  } catch (...) {
    return fail(MERCURY_E_INTERNAL, "unknown exception");
  }
}

int null_argument(const char* call, const char* name) {
  return fail(MERCURY_E_USAGE, (std::string(call) + ": " + name + " is NULL").c_str());
}

int status_of(const Handle& h) {
  switch (h.status()) {
    case Handle::Status::kOk:
      return MERCURY_OK;
    case Handle::Status::kFailed:
      return MERCURY_E_FAILED;
    default:
      return MERCURY_E_PENDING;
  }
}

// The C struct and Hyperparameters hold the same floats in the same order.
static_assert(sizeof(mercury_hyperparameters) == sizeof(mercury::worker::Hyperparameters));

int check_size(const char* call, size_t size) {
  if (size % sizeof(float) == 0) return MERCURY_OK;
  return fail(MERCURY_E_USAGE, (std::string(call) + ": size " + std::to_string(size) +
                                " is not a whole number of 4-byte fields")
                                   .c_str());
}

int wrap(Handle h, mercury_handle** out) {
  *out = std::make_unique<mercury_handle>(std::move(h))
             .release();  // the caller owns it: mercury_handle_release()
  return MERCURY_OK;
}

// mercury_worker_options grows at its end, and `size` says how much of it a
// caller has. Without padding, every byte past the fields this library
// knows belongs to a field of a newer header, and sizeof is where ours end.
static_assert(std::has_unique_object_representations_v<mercury_worker_options>,
              "mercury_worker_options has padding: make the new field 8 bytes wide");
// The smallest layout, the first with `size` (0.4.0), ends at `timeline`:
// fixed for good, whatever is added after it.
constexpr size_t kOptionsFirstSize =
    offsetof(mercury_worker_options, timeline) + sizeof(mercury_worker_options::timeline);
// Beyond any struct of options: a size this large is not one init set.
constexpr size_t kOptionsMaxSize = 65'536;

// `what` (a size the caller gave) must be one of a layout: at least the
// first one's and, since only init should set it, not absurdly large.
int check_options_size(const char* what, size_t size) {
  if (size >= kOptionsFirstSize && size <= kOptionsMaxSize) return MERCURY_OK;
  return fail(MERCURY_E_USAGE,
              (std::string(what) + " " + std::to_string(size) +
               " is not the size of a mercury_worker_options (" +
               std::to_string(kOptionsFirstSize) + " to " + std::to_string(kOptionsMaxSize) +
               " bytes): set it with mercury_worker_options_init(&options, sizeof options)")
                  .c_str());
}

// `whole` = the fields `caller` has, this library's defaults for the others.
// A caller built against a newer header may have fields this library does
// not know: refused unless they are all zero (their defaults), for a
// newer caller's request must not be ignored.
int read_options(const mercury_worker_options& caller, mercury_worker_options* whole) {
  const size_t size = caller.size;
  if (const int s = check_options_size("mercury_worker_connect: options->size", size);
      s != MERCURY_OK) {
    return s;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(&caller);
  for (size_t i = sizeof(mercury_worker_options); i < size; ++i) {
    if (bytes[i] != 0) {
      return fail(
          MERCURY_E_USAGE,
          ("mercury_worker_connect: options->size is " + std::to_string(size) +
           " but this library knows the first " + std::to_string(sizeof(mercury_worker_options)) +
           " bytes of mercury_worker_options, and byte " + std::to_string(i) +
           " is not zero: the caller (built against a newer mercury/worker_c.h) sets "
           "an option this library does not have")
              .c_str());
    }
  }
  mercury_worker_options_init(whole, sizeof *whole);
  std::memcpy(whole, &caller, std::min(size, sizeof *whole));
  whole->size = sizeof *whole;
  return MERCURY_OK;
}

}  // namespace

namespace mercury::worker {
mercury_worker* wrap_worker_for_c(Worker worker) {
  return std::make_unique<mercury_worker>(std::move(worker)).release();
}
}  // namespace mercury::worker

extern "C" {

const char* mercury_last_error(void) { return g_last_error.c_str(); }

int mercury_worker_options_init(mercury_worker_options* o, size_t size) {
  if (o == nullptr) return null_argument("mercury_worker_options_init", "options");
  if (const int s = check_options_size("mercury_worker_options_init: size", size);
      s != MERCURY_OK) {
    return s;
  }
  mercury_worker_options d{};
  d.size = static_cast<uint32_t>(size);
  d.eal_mode = MERCURY_EAL_AUTO;
  d.start_timeout_ms = 30'000;
  d.idle_backoff = 1;
  std::memset(o, 0, size);
  std::memcpy(o, &d, std::min(size, sizeof d));
  g_last_error.clear();
  return MERCURY_OK;
}

int mercury_worker_connect(const mercury_worker_options* caller, mercury_worker** out) {
  if (caller == nullptr) return null_argument("mercury_worker_connect", "options");
  mercury_worker_options whole;  // the caller's fields, this library's defaults for the others
  if (const int s = read_options(*caller, &whole); s != MERCURY_OK) return s;
  const mercury_worker_options* o = &whole;
  if (out == nullptr) return null_argument("mercury_worker_connect", "out");
  if (o->eal_argc != 0 && o->eal_args == nullptr) {
    return null_argument("mercury_worker_connect", "options->eal_args (eal_argc is not 0)");
  }
  for (size_t i = 0; i < o->eal_argc; ++i) {
    if (o->eal_args[i] == nullptr) {
      return fail(
          MERCURY_E_USAGE,
          ("mercury_worker_connect: options->eal_args[" + std::to_string(i) + "] is NULL").c_str());
    }
  }
  *out = nullptr;
  return guarded([&] {
    mercury::worker::WorkerOptions wo;
    // NULL or "": from the environment, as the C++ options' empty strings.
    if (o->job_file != nullptr) wo.job_file = o->job_file;
    if (o->node != nullptr) wo.node = o->node;
    for (size_t i = 0; i < o->eal_argc; ++i) wo.eal_args.emplace_back(o->eal_args[i]);
    switch (o->eal_mode) {
      case MERCURY_EAL_START:
        wo.eal = mercury::worker::EalMode::kStart;
        break;
      case MERCURY_EAL_ATTACH:
        wo.eal = mercury::worker::EalMode::kAttach;
        break;
      case MERCURY_EAL_AUTO:
        break;
      default:
        throw UsageError("mercury_worker_connect: options->eal_mode " +
                         std::to_string(o->eal_mode) + " is not a mercury_eal_mode");
    }
    wo.start_timeout_ms = o->start_timeout_ms;
    wo.idle_backoff = o->idle_backoff != 0;
    if (o->timeline != nullptr) wo.timeline = o->timeline;
    *out = std::make_unique<mercury_worker>(mercury::worker::Worker(wo)).release();
  });
}

void mercury_worker_destroy(mercury_worker* w) { std::unique_ptr<mercury_worker> owned(w); }

int mercury_worker_declare(mercury_worker* w, const char* name, float* params, size_t elements,
                           int priority, uint32_t* key_out) {
  if (w == nullptr) return null_argument("mercury_worker_declare", "worker");
  if (name == nullptr) return null_argument("mercury_worker_declare", "name");
  if (params == nullptr && elements != 0) return null_argument("mercury_worker_declare", "params");
  return guarded([&] {
    const uint32_t k = w->worker.declare(name, {params, elements}, priority);
    if (key_out != nullptr) *key_out = k;
  });
}

int mercury_worker_start(mercury_worker* w) {
  if (w == nullptr) return null_argument("mercury_worker_start", "worker");
  return guarded([&] { w->worker.start(); });
}

int mercury_worker_start_async(mercury_worker* w, mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_start_async", "worker");
  if (handle_out == nullptr) return null_argument("mercury_worker_start_async", "handle_out");
  return guarded([&] { wrap(w->worker.start_async(), handle_out); });
}

int mercury_worker_push(mercury_worker* w, uint32_t key, const float* grad, size_t elements,
                        mercury_handle** out) {
  if (w == nullptr) return null_argument("mercury_worker_push", "worker");
  if (out == nullptr) return null_argument("mercury_worker_push", "out");
  if (grad == nullptr && elements != 0) return null_argument("mercury_worker_push", "grad");
  return guarded([&] { wrap(w->worker.push(key, {grad, elements}), out); });
}

int mercury_worker_pull(mercury_worker* w, uint32_t key, float* out, size_t elements,
                        mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_pull", "worker");
  if (handle_out == nullptr) return null_argument("mercury_worker_pull", "handle_out");
  if (out == nullptr && elements != 0) return null_argument("mercury_worker_pull", "out");
  return guarded([&] { wrap(w->worker.pull(key, {out, elements}), handle_out); });
}

int mercury_worker_pull_min(mercury_worker* w, uint32_t key, float* out, size_t elements,
                            uint32_t min_version, mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_pull_min", "worker");
  if (handle_out == nullptr) return null_argument("mercury_worker_pull_min", "handle_out");
  if (out == nullptr && elements != 0) return null_argument("mercury_worker_pull_min", "out");
  return guarded([&] { wrap(w->worker.pull(key, {out, elements}, min_version), handle_out); });
}

int mercury_worker_version(mercury_worker* w, uint32_t key, uint32_t* version_out) {
  if (w == nullptr) return null_argument("mercury_worker_version", "worker");
  if (version_out == nullptr) return null_argument("mercury_worker_version", "version_out");
  return guarded([&] { *version_out = w->worker.version(key); });
}

int mercury_worker_mark_read(mercury_worker* w, uint32_t key, uint32_t* version_out) {
  if (w == nullptr) return null_argument("mercury_worker_mark_read", "worker");
  if (version_out == nullptr) return null_argument("mercury_worker_mark_read", "version_out");
  return guarded([&] { *version_out = w->worker.mark_read(key); });
}

int mercury_worker_drops(mercury_worker* w, char* buf, size_t size, size_t* needed_out) {
  if (w == nullptr) return null_argument("mercury_worker_drops", "worker");
  if (buf == nullptr && size != 0) {
    return null_argument("mercury_worker_drops", "buf (size is not 0)");
  }
  return guarded([&] {
    std::string text;
    for (const auto& [reason, n] : w->worker.drops()) {
      if (!text.empty()) text += ' ';
      text += reason + "=" + std::to_string(n);
    }
    if (size != 0) {
      const size_t k = std::min(text.size(), size - 1);
      std::memcpy(buf, text.data(), k);
      buf[k] = '\0';
    }
    if (needed_out != nullptr) *needed_out = text.size();
  });
}

// Both are 64-bit counters only: a field added to WorkerStats must be added
// at the end of mercury_worker_stats (and below) too.
static_assert(sizeof(WorkerStats) == sizeof(mercury_worker_stats),
              "WorkerStats and mercury_worker_stats differ: add the new field to the C struct");

int mercury_worker_get_stats(mercury_worker* w, mercury_worker_stats* out, size_t size) {
  if (w == nullptr) return null_argument("mercury_worker_get_stats", "worker");
  if (out == nullptr) return null_argument("mercury_worker_get_stats", "out");
  if (size % sizeof(uint64_t) != 0) {
    return fail(MERCURY_E_USAGE, ("mercury_worker_get_stats: size " + std::to_string(size) +
                                  " is not a whole number of 8-byte fields")
                                     .c_str());
  }
  return guarded([&] {
    const WorkerStats s = w->worker.stats();
    const mercury_worker_stats c{s.pushes,          s.pulls,          s.bytes_pushed,
                                 s.chunks_received, s.bytes_placed,   s.versions_completed,
                                 s.retransmits,     s.chunks_dropped, s.control_dropped,
                                 s.staleness_sum,   s.stale_pushes,   s.staleness_max,
                                 s.ssp_waits,       s.ssp_gap_max,    s.workers_removed,
                                 s.workers_left,    s.workers_joined, s.standby_takeovers,
                                 s.tensors_resent};
    const size_t k = std::min(size, sizeof c);
    std::memcpy(out, &c, k);
    std::memset(reinterpret_cast<char*>(out) + k, 0, size - k);
  });
}

const char* mercury_worker_sync(const mercury_worker* w) {
  // config::to_string's literals: static storage, NUL-terminated.
  return w != nullptr ? w->worker.sync().data() : nullptr;
}

int mercury_worker_push_pull(mercury_worker* w, uint32_t key, const float* grad, float* out,
                             size_t elements, mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_push_pull", "worker");
  if (handle_out == nullptr) return null_argument("mercury_worker_push_pull", "handle_out");
  if ((grad == nullptr || out == nullptr) && elements != 0) {
    return null_argument("mercury_worker_push_pull", grad == nullptr ? "grad" : "out");
  }
  return guarded([&] {
    wrap(w->worker.push_pull(key, {grad, elements}, {out, elements}), handle_out);
  });
}

int mercury_worker_barrier(mercury_worker* w) {
  if (w == nullptr) return null_argument("mercury_worker_barrier", "worker");
  return guarded([&] { w->worker.barrier(); });
}

int mercury_worker_barrier_async(mercury_worker* w, mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_barrier_async", "worker");
  if (handle_out == nullptr) return null_argument("mercury_worker_barrier_async", "handle_out");
  return guarded([&] { wrap(w->worker.barrier_async(), handle_out); });
}

int mercury_worker_shutdown(mercury_worker* w) {
  if (w == nullptr) return null_argument("mercury_worker_shutdown", "worker");
  return guarded([&] { w->worker.shutdown(); });
}

int mercury_worker_key(mercury_worker* w, const char* name, uint32_t* key_out) {
  if (w == nullptr) return null_argument("mercury_worker_key", "worker");
  if (name == nullptr || key_out == nullptr) {
    return null_argument("mercury_worker_key", name == nullptr ? "name" : "key_out");
  }
  return guarded([&] { *key_out = w->worker.key(name); });
}

uint32_t mercury_worker_rank(const mercury_worker* w) {
  if (w == nullptr) return 0;
  // A spare before start() has none (Worker::rank throws): UINT32_MAX.
  if (w->worker.spare() && !w->worker.started()) return UINT32_MAX;
  return w->worker.rank();
}

int mercury_worker_spare(const mercury_worker* w) {
  return w != nullptr && w->worker.spare() ? 1 : 0;
}
uint32_t mercury_worker_workers(const mercury_worker* w) { return w ? w->worker.workers() : 0; }

int mercury_worker_timeline_span(mercury_worker* w, const char* name, const char* track,
                                 uint64_t begin_ns, uint64_t end_ns) {
  if (w == nullptr) return null_argument("mercury_worker_timeline_span", "worker");
  if (name == nullptr || track == nullptr) {
    return null_argument("mercury_worker_timeline_span", name == nullptr ? "name" : "track");
  }
  return guarded([&] { w->worker.timeline_span(name, track, begin_ns, end_ns); });
}

int mercury_worker_declare_update(mercury_worker* w, const char* name, float* params,
                                  size_t elements, int priority, int update, uint32_t* key_out) {
  if (w == nullptr) return null_argument("mercury_worker_declare_update", "worker");
  if (name == nullptr) return null_argument("mercury_worker_declare_update", "name");
  if (params == nullptr && elements != 0) {
    return null_argument("mercury_worker_declare_update", "params");
  }
  if (update < MERCURY_UPDATE_OPTIMIZER || update > MERCURY_UPDATE_OPTIMIZER_RANK0) {
    return fail(MERCURY_E_USAGE, ("mercury_worker_declare_update: update " +
                                  std::to_string(update) + " is not a mercury_update")
                                     .c_str());
  }
  return guarded([&] {
    const uint32_t k = w->worker.declare(name, {params, elements}, priority,
                                         static_cast<mercury::worker::Update>(update));
    if (key_out != nullptr) *key_out = k;
  });
}

}  // extern "C"

namespace {

// A mercury_dtype from the caller: valid, and for a transfer on `key` the
// tensor's (nothing converts). Throws UsageError naming the call.
mercury::worker::Dtype c_dtype(const char* call, int dtype) {
  if (dtype < MERCURY_DTYPE_FLOAT32 || dtype > MERCURY_DTYPE_FLOAT16) {
    throw UsageError(std::string(call) + ": dtype " + std::to_string(dtype) +
                     " is not a mercury_dtype (1 float32, 2 bfloat16, 3 float16)");
  }
  return static_cast<mercury::worker::Dtype>(dtype);
}

constexpr const char* kDtypeNames[] = {"?", "float32", "bfloat16", "float16"};

// The 16-bit elements of a bfloat16 or float16 transfer on `key`, whose
// dtype must be `d` (a float32 tensor is refused by the std::span<uint16_t>
// overloads themselves).
void check_half(mercury_worker* w, const char* call, uint32_t key, mercury::worker::Dtype d) {
  const mercury::worker::Dtype has = w->worker.dtype(key);
  if (has != d && has != mercury::worker::Dtype::kFloat32) {
    throw UsageError(std::string(call) + ": tensor " + std::to_string(key) + " is " +
                     kDtypeNames[static_cast<int>(has)] + " but the buffer is " +
                     kDtypeNames[static_cast<int>(d)]);
  }
}

}  // namespace

extern "C" {

int mercury_worker_declare_typed(mercury_worker* w, const char* name, void* params, size_t elements,
                                 int dtype, int priority, int update, uint32_t* key_out) {
  constexpr const char* kCall = "mercury_worker_declare_typed";
  if (w == nullptr) return null_argument(kCall, "worker");
  if (name == nullptr) return null_argument(kCall, "name");
  if (params == nullptr && elements != 0) return null_argument(kCall, "params");
  if (update < MERCURY_UPDATE_OPTIMIZER || update > MERCURY_UPDATE_RANK0) {
    return fail(MERCURY_E_USAGE, (std::string(kCall) + ": update " + std::to_string(update) +
                                  " is not a mercury_update")
                                     .c_str());
  }
  return guarded([&] {
    const mercury::worker::Dtype d = c_dtype(kCall, dtype);
    const auto rule = static_cast<mercury::worker::Update>(update);
    const uint32_t k =
        d == mercury::worker::Dtype::kFloat32
            ? w->worker.declare(name, {static_cast<float*>(params), elements}, priority, rule)
            : w->worker.declare(name, {static_cast<uint16_t*>(params), elements}, d, priority,
                                rule);
    if (key_out != nullptr) *key_out = k;
  });
}

int mercury_worker_dtype(mercury_worker* w, uint32_t key, int* dtype_out) {
  if (w == nullptr) return null_argument("mercury_worker_dtype", "worker");
  if (dtype_out == nullptr) return null_argument("mercury_worker_dtype", "dtype_out");
  return guarded([&] { *dtype_out = static_cast<int>(w->worker.dtype(key)); });
}

int mercury_worker_push_typed(mercury_worker* w, uint32_t key, const void* grad, size_t elements,
                              int dtype, mercury_handle** handle_out) {
  constexpr const char* kCall = "mercury_worker_push_typed";
  if (w == nullptr) return null_argument(kCall, "worker");
  if (handle_out == nullptr) return null_argument(kCall, "handle_out");
  if (grad == nullptr && elements != 0) return null_argument(kCall, "grad");
  return guarded([&] {
    const mercury::worker::Dtype d = c_dtype(kCall, dtype);
    if (d == mercury::worker::Dtype::kFloat32) {
      wrap(w->worker.push(key, {static_cast<const float*>(grad), elements}), handle_out);
      return;
    }
    check_half(w, kCall, key, d);
    wrap(w->worker.push(key, {static_cast<const uint16_t*>(grad), elements}), handle_out);
  });
}

int mercury_worker_pull_typed(mercury_worker* w, uint32_t key, void* out, size_t elements,
                              int dtype, uint32_t min_version, mercury_handle** handle_out) {
  constexpr const char* kCall = "mercury_worker_pull_typed";
  if (w == nullptr) return null_argument(kCall, "worker");
  if (handle_out == nullptr) return null_argument(kCall, "handle_out");
  if (out == nullptr && elements != 0) return null_argument(kCall, "out");
  return guarded([&] {
    const mercury::worker::Dtype d = c_dtype(kCall, dtype);
    if (d == mercury::worker::Dtype::kFloat32) {
      wrap(w->worker.pull(key, {static_cast<float*>(out), elements}, min_version), handle_out);
      return;
    }
    check_half(w, kCall, key, d);
    wrap(w->worker.pull(key, {static_cast<uint16_t*>(out), elements}, min_version), handle_out);
  });
}

int mercury_worker_push_pull_typed(mercury_worker* w, uint32_t key, const void* grad, void* out,
                                   size_t elements, int dtype, mercury_handle** handle_out) {
  constexpr const char* kCall = "mercury_worker_push_pull_typed";
  if (w == nullptr) return null_argument(kCall, "worker");
  if (handle_out == nullptr) return null_argument(kCall, "handle_out");
  if ((grad == nullptr || out == nullptr) && elements != 0) {
    return null_argument(kCall, grad == nullptr ? "grad" : "out");
  }
  return guarded([&] {
    const mercury::worker::Dtype d = c_dtype(kCall, dtype);
    if (d == mercury::worker::Dtype::kFloat32) {
      wrap(w->worker.push_pull(key, {static_cast<const float*>(grad), elements},
                               {static_cast<float*>(out), elements}),
           handle_out);
      return;
    }
    check_half(w, kCall, key, d);
    wrap(w->worker.push_pull(key, {static_cast<const uint16_t*>(grad), elements},
                             {static_cast<uint16_t*>(out), elements}),
         handle_out);
  });
}

int mercury_worker_hyperparameters(mercury_worker* w, mercury_hyperparameters* out, size_t size) {
  if (w == nullptr) return null_argument("mercury_worker_hyperparameters", "worker");
  if (out == nullptr) return null_argument("mercury_worker_hyperparameters", "out");
  if (int bad = check_size("mercury_worker_hyperparameters", size); bad != MERCURY_OK) return bad;
  return guarded([&] {
    const mercury::worker::Hyperparameters h = w->worker.hyperparameters();
    const mercury_hyperparameters c{h.learning_rate, h.momentum, h.weight_decay,
                                    h.beta1,         h.beta2,    h.epsilon};
    const size_t k = std::min(size, sizeof c);
    std::memcpy(out, &c, k);
    std::memset(reinterpret_cast<char*>(out) + k, 0, size - k);
  });
}

int mercury_worker_set_hyperparameters(mercury_worker* w, const mercury_hyperparameters* values,
                                       size_t size, mercury_handle** handle_out) {
  if (w == nullptr) return null_argument("mercury_worker_set_hyperparameters", "worker");
  if (values == nullptr) return null_argument("mercury_worker_set_hyperparameters", "values");
  if (handle_out == nullptr) {
    return null_argument("mercury_worker_set_hyperparameters", "handle_out");
  }
  if (int bad = check_size("mercury_worker_set_hyperparameters", size); bad != MERCURY_OK) {
    return bad;
  }
  return guarded([&] {
    mercury::worker::Hyperparameters h = w->worker.hyperparameters();
    // A newer caller's fields past ours must be those it did not set.
    for (size_t at = sizeof h; at < size; ++at) {
      if (reinterpret_cast<const char*>(values)[at] != 0) {
        throw UsageError(
            "mercury_worker_set_hyperparameters: a field this library does not "
            "know is set (byte " +
            std::to_string(at) + ")");
      }
    }
    mercury_hyperparameters c{h.learning_rate, h.momentum, h.weight_decay,
                              h.beta1,         h.beta2,    h.epsilon};
    std::memcpy(&c, values, std::min(size, sizeof c));
    h = {c.learning_rate, c.momentum, c.weight_decay, c.beta1, c.beta2, c.epsilon};
    wrap(w->worker.set_hyperparameters(h), handle_out);
  });
}

int mercury_worker_server_state(mercury_worker* w, void** state_out, size_t* size_out) {
  if (w == nullptr) return null_argument("mercury_worker_server_state", "worker");
  if (state_out == nullptr || size_out == nullptr) {
    return null_argument("mercury_worker_server_state",
                         state_out == nullptr ? "state_out" : "size_out");
  }
  *state_out = nullptr;
  *size_out = 0;
  return guarded([&] {
    const std::vector<std::byte> state = w->worker.server_state();
    void* copy = std::malloc(std::max<size_t>(state.size(), 1));
    if (copy == nullptr) throw std::bad_alloc();
    std::memcpy(copy, state.data(), state.size());
    *state_out = copy;
    *size_out = state.size();
  });
}

void mercury_state_release(void* state) { std::free(state); }

int mercury_worker_resume_from(mercury_worker* w, const void* state, size_t size) {
  if (w == nullptr) return null_argument("mercury_worker_resume_from", "worker");
  if (state == nullptr && size != 0) return null_argument("mercury_worker_resume_from", "state");
  return guarded([&] { w->worker.resume_from({static_cast<const std::byte*>(state), size}); });
}

int mercury_worker_start_version(mercury_worker* w, uint32_t* version_out) {
  if (w == nullptr) return null_argument("mercury_worker_start_version", "worker");
  if (version_out == nullptr) return null_argument("mercury_worker_start_version", "version_out");
  return guarded([&] { *version_out = w->worker.start_version(); });
}

int mercury_worker_roll_back(mercury_worker* w, uint32_t* version_out) {
  if (w == nullptr) return null_argument("mercury_worker_roll_back", "worker");
  if (version_out == nullptr) return null_argument("mercury_worker_roll_back", "version_out");
  return guarded([&] { *version_out = w->worker.roll_back(); });
}

int mercury_worker_joined_version(mercury_worker* w, int* joined_out, uint32_t* version_out) {
  if (w == nullptr) return null_argument("mercury_worker_joined_version", "worker");
  if (joined_out == nullptr) return null_argument("mercury_worker_joined_version", "joined_out");
  if (version_out == nullptr) {
    return null_argument("mercury_worker_joined_version", "version_out");
  }
  return guarded([&] {
    const std::optional<uint32_t> v = w->worker.joined_version();
    *joined_out = v ? 1 : 0;
    *version_out = v.value_or(0);
  });
}

int mercury_handle_wait(mercury_handle* h) {
  if (h == nullptr) return null_argument("mercury_handle_wait", "handle");
  return h->handle.wait() ? MERCURY_OK : MERCURY_E_FAILED;
}

int mercury_handle_status(const mercury_handle* h) {
  if (h == nullptr) return null_argument("mercury_handle_status", "handle");
  return status_of(h->handle);
}

int mercury_handle_ready(const mercury_handle* h) { return h != nullptr && h->handle.ready(); }

const char* mercury_handle_error(mercury_handle* h) {
  if (h == nullptr || h->handle.status() != Handle::Status::kFailed) return "";
  std::call_once(h->error_once, [h] { h->error = std::string(h->handle.error()); });
  return h->error.c_str();
}

int mercury_handle_on_complete(mercury_handle* h, mercury_callback fn, void* context) {
  if (h == nullptr) return null_argument("mercury_handle_on_complete", "handle");
  if (fn == nullptr) return null_argument("mercury_handle_on_complete", "fn");
  return guarded([&] {
    h->handle.on_complete([fn, context](const Handle& done) {
      // The text is held inline in the handle, not terminated: copy it to
      // the stack (no allocation on the net core).
      if (done.ok()) {
        fn(context, MERCURY_OK, "");
      } else {
        char why[mercury::worker::kMaxErrorBytes + 1];
        const std::string_view e = done.error();
        std::memcpy(why, e.data(), e.size());
        why[e.size()] = '\0';
        fn(context, MERCURY_E_FAILED, why);
      }
    });
  });
}

void mercury_handle_release(mercury_handle* h) { std::unique_ptr<mercury_handle> owned(h); }

}  // extern "C"
