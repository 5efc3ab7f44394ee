// ps-demo's process mode (processes.cpp): runs a job's ps-server and
// ps-worker processes on this machine and reports their output.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mercury::demo {

/// Starts one ps-server per server node and one ps-worker per worker node of
/// `job` (loaded from `config_file`), each running `rounds` of push_pull over
/// `model`; returns 0 when every worker checked every aggregate and every
/// process exited cleanly. `worker_args` are appended to every ps-worker's
/// arguments (--verify, --timestamps, --trace ...). The workers get `timeout_s`
/// to finish; `stop` (set by a signal) ends it early. With --trace among the
/// worker arguments it ends with the job's line: the slowest rank's iteration
/// time beside the lower bound (with the least communication time any rank
/// measured: each measures from its own release from a barrier).
int run_processes(const std::string& config_file, const config::JobConfig& job,
                  const std::string& model, uint32_t rounds,
                  const std::vector<std::string>& worker_args, double timeout_s,
                  const std::atomic<bool>& stop);

}  // namespace mercury::demo
