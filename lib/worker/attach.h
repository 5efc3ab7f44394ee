// Internal entry points of the worker library for code that owns its DPDK
// set-up already (PMD tests, ps-demo): run a Worker's net core on a port the
// caller opened, and build the net core's configuration from a job file.
// Not installed: trainers use mercury/worker.h.
#pragma once

#include <string_view>

#include "config/config.h"
#include "mercury/worker.h"
#include "net/interface.h"
#include "worker/net_core.h"

struct mercury_worker;

namespace mercury::worker {

/// The net core configuration of worker `node` of `job` (rank, servers and
/// their shards, chunk size, endpoint settings). Needs EAL up (the TSC
/// frequency). Throws WorkerError naming the node.
NetCoreConfig net_core_config(const config::JobConfig& job, std::string_view node);

/// A Worker whose net core runs on a new thread of the EAL this process
/// already started (registered with rte_thread_register) and polls `iface`,
/// which must outlive the worker and be polled by no one else.
Worker attach_worker(net::Interface& iface, const NetCoreConfig& config);

/// The C ABI's handle for `worker` (mercury/worker_c.h), for tests that
/// build the worker with attach_worker().
mercury_worker* wrap_worker_for_c(Worker worker);

}  // namespace mercury::worker
