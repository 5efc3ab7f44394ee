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
#include "net/packet_port.h"
#include "node/loop.h"
#include "worker/net_core.h"

struct mercury_worker;

namespace mercury::worker {

/// The net core configuration of worker `node` of `job` (rank, servers and
/// their shards, chunk size, endpoint settings with a fresh epoch). Needs
/// EAL up (the TSC frequency). Throws WorkerError naming the node.
NetCoreConfig net_core_config(const config::JobConfig& job, std::string_view node);

/// A Worker whose net core runs on a new thread of the EAL this process
/// already started (registered with rte_thread_register) and polls `port`,
/// which must outlive the worker and be polled by no one else.
Worker attach_worker(net::PacketPort& port, const NetCoreConfig& config);

/// A Worker whose net core has no thread: it is a poller of its owner's
/// node::Loop (attach()), run beside whatever else that loop polls (a server
/// node and several workers in one test, on net_ring or on MemoryPorts). The
/// worker is the public Worker in every respect but two: its blocking calls
/// cannot wait (start() unless already started, barrier(): UsageError), so
/// the owner calls start_async() / barrier_async() and runs its loop until
/// the handle is ready; and shutdown() (or the destructor) must run on the
/// loop's thread, which it uses to run the loop until the net core has
/// stopped (with its net core back on the loop if its owner had taken it
/// off, as a test does to play a dead rank). A worker stopping tells the servers it leaves and
/// waits for their acknowledgement (docs/server.md, "The end of a job"); a PolledWorker does so
/// only once attached (its loop polls the servers too), and otherwise stops at once, as a worker
/// that crashed would. Handles complete, and callbacks run, inside the loop's passes. `port` must
/// outlive the worker and be polled by no one else. Without EAL (a unit test
/// on MemoryPorts) config.endpoint.transport.tsc_hz gives the clock's rate.
class PolledWorker {
 public:
  PolledWorker(net::PacketPort& port, const NetCoreConfig& config);

  Worker& worker() { return worker_; }
  const Worker& worker() const { return worker_; }
  /// Control path, once: the net core becomes a poller of `loop`, whose
  /// passes shutdown() runs with `clock` (the TSC, or a test's fake clock).
  void attach(node::Loop& loop, node::Tick (*clock)() = &node::tsc_now);
  /// The net core, for the owner's diagnostics on the loop's thread; null
  /// after shutdown.
  NetCore* net_core();

 private:
  Worker::Impl* impl_ = nullptr;  // owned by worker_ (stable across moves); set first
  Worker worker_;
};

/// The C ABI's handle for `worker` (mercury/worker_c.h), for tests that
/// build the worker with attach_worker().
mercury_worker* wrap_worker_for_c(Worker worker);

}  // namespace mercury::worker
