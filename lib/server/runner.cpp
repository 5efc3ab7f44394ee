#include "server/runner.h"

#include <rte_cycles.h>
#include <rte_lcore.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "job/job.h"
#include "net/port.h"
#include "node/loop.h"
#include "server/node_config.h"
#include "server/report.h"

namespace mercury::server {

Output Output::stdio() {
  auto print = [](std::FILE* f) {
    return [f](const std::string& line) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fflush(f);
    };
  };
  return Output{print(stdout), print(stderr)};
}

unsigned eal_cpu_of_lcore(unsigned lcore) { return rte_lcore_to_cpu_id(static_cast<int>(lcore)); }

std::vector<std::string> start_lines(const config::JobConfig& job, const config::NodeConfig& node,
                                     const std::vector<net::NodePort*>& ports) {
  std::vector<std::string> out;
  out.push_back("ps-server " + node.name + ": job " + job.name + " (id " + std::to_string(job.id) +
                "), " + std::to_string(job.workers().size()) + " workers, " +
                std::string(config::to_string(job.network.scheduler)) + " scheduler, " +
                std::string(config::to_string(job.training.sync)) +
                (job.training.aggregation == config::Aggregation::kTensor
                     ? ", store-and-forward (training.aggregation: tensor, a baseline)"
                     : "") +
                (job.network.auth_key
                     ? ", authenticated (AES-GMAC under " + job.network.auth_key_file + ")"
                     : ""));
  for (const net::NodePort* p : ports) out.push_back("  " + p->port->describe());
  auto cpu = [](unsigned lcore) { return std::to_string(eal_cpu_of_lcore(lcore)); };
  const unsigned net_lcore = rte_lcore_id();
  out.push_back("  lcore " + std::to_string(net_lcore) + " (cpu " + cpu(net_lcore) +
                "): net core, polls every port");
  out.push_back("  poll mode " + std::string(config::to_string(node.poll)) +
                (node.poll == config::Poll::kBusy ? " (spins when idle: dedicated cores)"
                                                  : " (gives the CPU up when idle: shared CPUs)"));
  const job::ShardLayout layout = job::shard_layout(job);
  const uint32_t first = layout.first[job.rank_of(node.name)];
  const std::vector<unsigned> shard_lcores = shard_core_lcores(node, eal_cpu_of_lcore);
  if (node.role == config::Role::kStandby) {
    out.push_back("  standby of " + node.standby + ": holds its shards as it replicates them, " +
                  "serves them once it names " + node.standby + " lost");
  } else if (!node.standby.empty()) {
    out.push_back("  standby " + node.standby +
                  ": every update is replicated to it before it goes to the workers");
  }
  for (uint32_t s = 0; s < layout.count(job.rank_of(node.name)); ++s) {
    const std::string shard = "shard " + std::to_string(first + s);
    if (s < shard_lcores.size()) {
      out.push_back("  lcore " + std::to_string(shard_lcores[s]) + " (cpu " + cpu(shard_lcores[s]) +
                    "): " + shard);
    } else {
      out.push_back("  " + shard + ": inline on the net core" +
                    (s < node.shard_lcores().size()
                         ? " (lcore " + std::to_string(node.shard_lcores()[s]) +
                               " would share a CPU with the net core or another shard core)"
                         : ""));
    }
  }
  return out;
}

Runner::Runner(ServerNode& node, RunnerOptions options, Output output)
    : node_(node),
      options_(std::move(options)),
      output_(std::move(output)),
      who_(options_.program + " " + options_.node),
      state_(static_cast<int>(node.state_st())) {
  node_.refresh_port_stats_st();
  published_.publish_st(node_.counters_st());
}

void Runner::add_telemetry(telemetry::Registry& registry) {
  registry.add("server", [this](telemetry::Values& v) { telemetry_values(published_.read(), v); });
}

void Runner::report_state_st() {
  const NodeState now = node_.state_st();
  state_.store(static_cast<int>(now), std::memory_order_relaxed);
  // The placement exists from the moment the job started running.
  const agg::Placement* placement = node_.placement_st();
  if (placement != nullptr && !announced_serving_) {
    announced_serving_ = true;
    uint64_t staging = 0, chunks = 0;
    for (uint32_t id : node_.own_shards()) {
      staging += node_.shard(id)->table().staging_chunks();
      chunks += node_.shard(id)->table().chunks();
    }
    output_.out(who_ + ": every worker declared; " + std::to_string(placement->blocks().size()) +
                " blocks placed (" + std::to_string(chunks) + " chunks here), serving");
    const std::string warning =
        pool_warning(*placement, node_.own_shards(), node_.config().chunk_bytes, node_.workers(),
                     node_.config().rx_pool_mbufs, staging);
    if (!warning.empty()) output_.out(options_.program + ": " + warning);
  }
  if (now == NodeState::kRefused) {
    output_.err(who_ + ": the job " + (placement != nullptr ? "stopped" : "cannot start") + ": " +
                node_.refusal_st());
  } else if (now == NodeState::kFinished) {
    output_.out(who_ + ": every worker left; the job is done");
  }
}

NodeState Runner::run(const std::atomic<bool>& stop) {
  // The stats line, once a second, from a thread that only reads: the
  // published counters and the ports' frame counters (single-writer words,
  // read with relaxed loads).
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread stats([&] {
    auto frames = [this](bool in) {
      uint64_t n = 0;
      for (uint32_t p = 0; p < node_.ports(); ++p) {
        const net::PacketPort::Traffic t = node_.port(p).traffic();
        n += in ? t.rx_frames : t.tx_frames;
      }
      return n;
    };
    // The fewest free mbufs of any port's RX pool, as the net core last read
    // them: a single exhausted pool must not hide behind the others.
    auto pool_free = [this] {
      uint64_t least = UINT64_MAX;
      for (uint32_t p = 0; p < node_.ports(); ++p) {
        least = std::min(least, node_.port(p).rx_pool_free());
      }
      return least == UINT64_MAX ? 0 : least;
    };
    // A port's link going down (a net_memif peer gone) or coming back is
    // said once, as the net core's last refresh saw it.
    // So is a port detached because its workers left, or attached again.
    std::vector<uint64_t> links(node_.ports()), detached(node_.ports()), mapped(node_.ports());
    for (uint32_t p = 0; p < node_.ports(); ++p) links[p] = node_.port(p).link_up();
    auto report_links = [&] {
      // A memif peer that connected brought new shared memory: in with it
      // now, off the net core (docs/net.md, "net_memif's shared memory").
      // Also for a link already up when the node started (its workers
      // started with the server): that one is never said to come up.
      bool populate = false;
      for (uint32_t p = 0; p < node_.ports(); ++p) {
        const uint64_t up = node_.port(p).link_up();
        populate |= up != 0 && mapped[p] == 0;
        mapped[p] = up;
      }
      if (populate) {
        if (const uint64_t bytes = net::populate_memif_regions(); bytes != 0) {
          output_.out(who_ + ": " + populate_line(bytes));
        }
      }
      for (uint32_t p = 0; p < node_.ports(); ++p) {
        const uint64_t d = node_.port(p).detached();
        if (d != detached[p]) {
          detached[p] = d;
          output_.out(who_ + ": " + detach_line(node_.port(p).name(), d != 0));
        }
        const uint64_t up = node_.port(p).link_up();
        if (up == links[p]) continue;
        links[p] = up;
        output_.out(who_ + ": " + link_line(node_.port(p).name(), up != 0));
      }
    };
    ServerCounters prev = published_.read();
    uint64_t prev_in = 0, prev_out = 0;
    // The first line comes at 0.2 s, once the net core has read its ports
    // (every 100 ms), so that a launcher waiting for it to start the
    // workers waits no longer; then one at every whole second. Rates are
    // per second over the time since the previous line.
    const auto t0 = std::chrono::steady_clock::now();
    auto next = t0 + std::chrono::milliseconds(200);
    double prev_t = 0;
    std::unique_lock lock(mu);
    while (!stop.load(std::memory_order_relaxed)) {
      // Between the lines, the links are looked at every kLinkWatchMs: a
      // memif peer's shared memory is mapped in before the job's first
      // frames through it, not up to a second later (the link state itself
      // is what the net core read at its last 100 ms refresh).
      const auto wake = std::min(
          next, std::chrono::steady_clock::now() + std::chrono::milliseconds(kLinkWatchMs));
      if (cv.wait_until(lock, wake, [&] { return done || stop.load(); })) break;
      if (std::chrono::steady_clock::now() < next) {
        report_links();
        continue;
      }
      next = prev_t == 0 ? t0 + std::chrono::seconds(1) : next + std::chrono::seconds(1);
      const ServerCounters c = published_.read();
      const uint64_t in = frames(true), out = frames(false);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double dt = std::max(t - prev_t, 1e-3);
      prev_t = t;
      auto per_second = [dt](uint64_t n) {
        return static_cast<uint64_t>(static_cast<double>(n) / dt + 0.5);
      };
      const Rates r{per_second(in - prev_in), per_second(out - prev_out),
                    per_second(c.shards.updates - prev.shards.updates)};
      report_links();
      output_.out(stats_line(t, static_cast<NodeState>(state_.load()), r, c, pool_free()));
      prev = c;
      prev_in = in;
      prev_out = out;
    }
  });

  // The net core: the node's pollers, and the runner's slow work every
  // 100 ms on the same loop.
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t start = rte_rdtsc();
  const uint64_t end =
      options_.seconds > 0
          ? start + static_cast<uint64_t>(options_.seconds * static_cast<double>(hz))
          : UINT64_MAX;
  node::Loop loop({.idle = options_.idle, .tick_hz = hz});
  node_.attach(loop);
  std::optional<CheckpointWriter> writer;
  if (node_.checkpoint_sources() != nullptr && !options_.checkpoint.dir.empty()) {
    CheckpointWriterOptions wo = options_.checkpoint;
    wo.report = [this](const std::string& line, bool error) {
      (error ? output_.err : output_.out)(who_ + ": " + line);
    };
    writer.emplace(*node_.checkpoint_sources(), std::move(wo));
    writer->start();
  }
  NodeState last_state = node_.state_st();
  uint64_t end_at = UINT64_MAX;  // end_with_job: when the job's end stops the loop
  loop.every(hz / 10, [&](uint64_t now) {
    // The PMDs' counters (rte_eth_stats_get) are read here, by the core that
    // polls the ports, and published with the rest.
    node_.refresh_port_stats_st();
    published_.publish_st(node_.counters_st());
    for (const std::string& line : node_.take_notices_st()) output_.out(who_ + ": " + line);
    if (node_.state_st() != last_state) {
      report_state_st();
      last_state = node_.state_st();
      if (options_.end_with_job && end_at == UINT64_MAX) {
        // Finished: every worker's leave was answered already; a short grace
        // lets their memif sockets close on live ports. Refused: a
        // grace for the refusal to reach the workers still there.
        if (last_state == NodeState::kFinished) {
          end_at = now + static_cast<uint64_t>(kFinishedGraceSeconds * static_cast<double>(hz));
        }
        if (last_state == NodeState::kRefused) {
          end_at = now + static_cast<uint64_t>(kRefusedGraceSeconds * static_cast<double>(hz));
        }
      }
    }
    if (now >= end || now >= end_at) loop.stop_st();
  });
  loop.run(stop);
  const NodeState final_state = node_.state_st();
  if (writer) writer->stop();  // before the shards and their snapshots go
  node_.stop();
  node_.refresh_port_stats_st();  // the ports are still open: the totals include their drops
  published_.publish_st(node_.counters_st());
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  stats.join();
  const ServerCounters c = node_.counters_st();
  output_.out(who_ + ": stopped; " + std::to_string(c.shards.updates) + " aggregations, " +
              std::to_string(c.net.tx_retransmits) + " retransmissions" +
              retransmission_text(node_.peer_totals_st()) + ", drops:" + drops_text(c) +
              async_fanout_text(c) + staleness_text(c) + membership_text(c));
  if (const std::string line = standby_line(c, node_.config().standby); !line.empty()) {
    output_.out(who_ + ": " + line);
  }
  if (writer) {
    const CheckpointCounters& k = writer->counters();
    uint64_t skipped = 0, failed = k.failures.load();
    for (const auto& snap : node_.checkpoint_sources()->snapshots) {
      skipped += snap->skipped();
      failed += snap->failed();
    }
    output_.out(who_ + ": checkpoints: " + std::to_string(k.written.load()) + " written (" +
                std::to_string(k.bytes.load()) + " bytes), the last at version " +
                std::to_string(k.last_version.load()) + ", " + std::to_string(failed) +
                " failed, " + std::to_string(skipped) +
                " skipped (the previous one still being written)");
  }
  return final_state;
}

}  // namespace mercury::server
