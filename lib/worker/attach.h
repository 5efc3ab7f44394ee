// Internal entry points of the worker library for code that owns its DPDK
// set-up already (the PMD tests, ps-demo, the benchmarks): a Worker whose
// net core polls a port the caller opened, on a thread of its own
// (attach_worker) or run by the caller (PolledWorker); and the net core's
// configuration from a job file. Both build the same Worker as the public
// constructor and run the same NetCore: only who runs the loop differs.
// Not installed: trainers use mercury/worker.h.
#pragma once

#include <functional>
#include <string_view>

#include "config/config.h"
#include "mercury/worker.h"
#include "net/interface.h"
#include "worker/net_core.h"

struct mercury_worker;

namespace mercury::worker {

/// The net core configuration of worker `node` of `job` (rank, servers and
/// their shards, chunk size, endpoint settings with a fresh epoch). Needs
/// EAL up (the TSC frequency). Throws WorkerError naming the node.
NetCoreConfig net_core_config(const config::JobConfig& job, std::string_view node);

/// A Worker whose net core runs on a new thread of the EAL this process
/// already started (registered with rte_thread_register) and polls `iface`,
/// which must outlive the worker and be polled by no one else.
Worker attach_worker(net::Interface& iface, const NetCoreConfig& config);

/// A Worker whose net core has no thread: its owner runs it, one pass at a
/// time, on one thread, beside whatever else that thread polls (a server
/// node and several workers over net_ring in one test). The worker is the
/// public Worker in every respect but two: its blocking calls cannot wait
/// (start() unless already started, barrier(): UsageError), so the owner
/// calls start_async() / barrier_async() and polls until the handle is
/// ready; and shutdown() (or the destructor) must run on the polling thread,
/// which it uses to run the net core until it has stopped. A worker stopping
/// tells the servers it leaves and waits for their acknowledgement
/// (docs/server.md, "The end of a job"); a PolledWorker does so only once
/// set_beside() said what else its owner polls (the servers among it), and
/// otherwise stops at once, as a worker that crashed would. Handles
/// complete, and callbacks run, inside poll_st(). `iface` must outlive the
/// worker and be polled by no one else; EAL must be up.
class PolledWorker {
 public:
  PolledWorker(net::Interface& iface, const NetCoreConfig& config);

  Worker& worker() { return worker_; }
  const Worker& worker() const { return worker_; }
  /// One pass of the net core (NetCore::poll_st); 0 after shutdown.
  uint32_t poll_st(transport::Tick now);
  /// The net core, for the owner's diagnostics on the polling thread; null
  /// after shutdown.
  NetCore* net_core();
  /// What the owner's thread polls besides this worker (its server nodes,
  /// other workers), run between the net core's passes while shutdown()
  /// waits for the stop. It must not poll this worker.
  void set_beside(std::function<void(transport::Tick)> poll_others);

 private:
  Worker::Impl* impl_ = nullptr;  // owned by worker_ (stable across moves); set first
  Worker worker_;
};

/// The C ABI's handle for `worker` (mercury/worker_c.h), for tests that
/// build the worker with attach_worker().
mercury_worker* wrap_worker_for_c(Worker worker);

}  // namespace mercury::worker
