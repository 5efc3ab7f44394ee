// The run loop of a server process: the net core's node::Loop with the
// ServerNode's pollers on it, its telemetry group, the per-second stats line
// and the operator's messages (report.h gives the text).
//
// The loop is the node's (ServerNode::attach) plus one task of the runner's,
// every 100 ms: read the ports' device counters and RX pool gauges
// (ServerNode::refresh_port_stats_st: the one thread that polls a port is the
// one that asks its PMD), publish the node's counters (base::Published, which
// the stats thread and telemetry read, so neither touches the datapath),
// report a change of state (running: "every worker declared; N blocks
// placed, serving", plus the pool warning; refused: the reason, on the error
// stream), and end the loop when the job or the time is over.
//
// Threads: construct, add_telemetry() and run() on the thread that owns
// the node (EAL's main lcore when the node has shard cores). run() starts
// one more thread, which prints the stats line once a second from the
// published counters and the ports' frame counters, and with checkpoints
// the CheckpointWriter's, and joins them before returning. The texts go to Output's functions
// (stdout and stderr by default); the library never exits the process.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/published.h"
#include "config/config.h"
#include "net/node.h"
#include "node/idle.h"
#include "server/checkpoint.h"
#include "server/server_node.h"
#include "telemetry/telemetry.h"

namespace mercury::server {

/// Where the runner's lines go, one call per line (without its newline).
struct Output {
  std::function<void(const std::string&)> out;  ///< what an operator reads (stdout)
  std::function<void(const std::string&)> err;  ///< refusals (stderr)
  /// stdout and stderr, flushed after each line.
  static Output stdio();
};

struct RunnerOptions {
  std::string program = "ps-server";  ///< starts the warning line
  std::string node;                   ///< the node's name: "<program> <node>: ..." lines
  node::IdleOptions idle;             ///< the net core loop's idle policy (the node's poll mode)
  double seconds = 0;                 ///< stop after this long; 0: only when asked
  /// Stop when the job ends: every worker left (finished), or the job was
  /// refused (a failure: it serves kRefusedGrace longer, so that the refusal
  /// reaches every worker still there). false: only `stop` or `seconds`.
  bool end_with_job = false;
  /// Background checkpoints (docs/server.md, "Durability"): with a `dir`
  /// and a node whose checkpoint_sources() is set, run() starts a
  /// CheckpointWriter thread and stops it (a complete snapshot written)
  /// before it stops the node. `report` is the runner's.
  CheckpointWriterOptions checkpoint;
};

/// How long a refused job's node keeps serving before run() returns, with
/// RunnerOptions::end_with_job.
inline constexpr double kRefusedGraceSeconds = 1.0;
/// With end_with_job, how long a finished job's node still runs before it
/// tears its ports down: the workers' processes exit at that moment, and
/// DPDK 22.11's interrupt thread, handling their memif sockets closing, was
/// seen to crash (SIGSEGV in eal-intr-thread) when the ports went at once.
inline constexpr double kFinishedGraceSeconds = 0.5;

/// How often the report thread looks at the ports' link state between its
/// once-a-second lines: a net_memif link that came up has its shared memory
/// mapped in (net::populate_memif_regions) at most this long after the net
/// core's next 100 ms refresh saw it, before the job's first frames fault it
/// in on the net core.
inline constexpr int kLinkWatchMs = 10;

/// The CPU EAL runs `lcore` on (NodeStart::cpu_of_lcore for a node of this
/// process). EAL must be up.
unsigned eal_cpu_of_lcore(unsigned lcore);

/// The lines ps-server prints before it starts a node: the job, the node's
/// ports (`ports`, opened), and what runs on each of its lcores (the net
/// core is the calling thread's lcore). EAL must be up.
std::vector<std::string> start_lines(const config::JobConfig& job, const config::NodeConfig& node,
                                     const std::vector<net::NodePort*>& ports);

class Runner {
 public:
  /// `node` must outlive the runner.
  Runner(ServerNode& node, RunnerOptions options, Output output = Output::stdio());
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Control path, before run(): the group "server" (report.h's
  /// telemetry_values). The ports' groups are their owner's to register
  /// (net::add_telemetry).
  void add_telemetry(telemetry::Registry& registry);

  /// The net core: polls until `stop` is set, options.seconds have passed
  /// or (end_with_job) the job ended, then stops the node (ServerNode::stop)
  /// and prints the totals ("<program> <node>: stopped; N aggregations,
  /// ..."). Returns the node's state when it stopped polling.
  NodeState run(const std::atomic<bool>& stop);

 private:
  /// The operator's line for the node's state, looked at every 100 ms: a job
  /// that started and ended between two looks still gets its "serving" line,
  /// and a refusal says "stopped" when the job had been running.
  void report_state_st();

  ServerNode& node_;
  RunnerOptions options_;
  Output output_;
  std::string who_;         // "<program> <node>"
  std::atomic<int> state_;  // the node's state, for the stats thread
  bool announced_serving_ = false;
  base::Published<ServerCounters> published_;
};

}  // namespace mercury::server
