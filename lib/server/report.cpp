#include "server/report.h"

#include <cstdio>
#include <string_view>

#include "job/job.h"

namespace mercury::server {

std::string check_line(const config::JobConfig& job, const config::NodeConfig& node) {
  const job::ShardLayout layout = job::shard_layout(job);
  const uint32_t rank = job.rank_of(node.name);
  return job.source + ": ok: server " + node.name + " (rank " + std::to_string(rank) + " of " +
         std::to_string(layout.servers()) + "), shards " + std::to_string(layout.first[rank]) +
         ".." + std::to_string(layout.first[rank] + layout.count(rank) - 1) + " of " +
         std::to_string(layout.total) + ", " + std::to_string(job.workers().size()) + " workers, " +
         std::to_string(node.ports.size()) + " ports";
}

std::string drops_text(const ServerCounters& c) {
  std::string s;
  c.for_each([&s](std::string_view prefix, std::string_view name, uint64_t n) {
    const bool drop = prefix.ends_with("drop_") || (prefix == "shard_" && name == "refused");
    if (!drop || n == 0) return;
    s += ' ';
    if (prefix == "shard_") s += prefix;
    s += name;
    s += '=';
    s += std::to_string(n);
  });
  return s.empty() ? " none" : s;
}

std::string async_fanout_text(const ServerCounters& c) {
  const ShardCounters& s = c.shards;
  if (s.snapshots_full == 0 && s.fanout_merged == 0 && s.eager_sent == 0) return {};
  std::string text = "; async fan-out: " + std::to_string(s.snapshots_full) +
                     " updates found every snapshot on the wire and waited, " +
                     std::to_string(s.fanout_merged) + " copies merged into one already waiting";
  if (s.eager_sent != 0) text += ", " + std::to_string(s.eager_sent) + " eager copies sent";
  return text;
}

std::string staleness_text(const ServerCounters& c) {
  const ShardCounters& s = c.shards;
  if (s.stale_updates == 0) return {};
  char mean[32];  // updates >= stale_updates > 0
  std::snprintf(mean, sizeof(mean), "%.2f",
                static_cast<double>(s.staleness_sum) / static_cast<double>(s.updates));
  return "; stale updates: " + std::to_string(s.stale_updates) + " of " +
         std::to_string(s.updates) + ", " + mean + " versions behind on average";
}

std::string membership_text(const ServerCounters& c) {
  std::string text;
  if (c.control.workers_removed != 0)
    text += "; workers removed: " + std::to_string(c.control.workers_removed);
  if (c.control.workers_joined != 0)
    text += "; workers joined: " + std::to_string(c.control.workers_joined);
  if (c.control.spares_joined != 0)
    text += " (spares: " + std::to_string(c.control.spares_joined) + ")";
  if (c.control.spares_released != 0)
    text += "; spares released: " + std::to_string(c.control.spares_released);
  return text;
}

std::string standby_line(const ServerCounters& c, Standby role) {
  const ShardCounters& s = c.shards;
  if (role == Standby::kPrimary) {
    const uint64_t per = s.replicated_versions != 0 ? s.replica_bytes / s.replicated_versions : 0;
    return "standby: " + std::to_string(s.replicated_versions) + " chunk versions replicated (" +
           std::to_string(s.replica_bytes) + " bytes, " + std::to_string(per) +
           " per chunk version), " + std::to_string(s.replica_unsent) +
           " sent unreplicated, the standby lost " + std::to_string(c.control.standbys_lost) +
           " times";
  }
  if (role == Standby::kStandby) {
    return "standby: " + std::to_string(s.replicated_versions) + " chunk versions adopted, " +
           std::to_string(s.replica_dropped) + " replica packets dropped, " +
           std::to_string(c.control.promotions) + " promotions, " +
           std::to_string(s.answered_again) + " pushes answered again, refused by " +
           std::to_string(c.control.promotions_refused) + " workers";
  }
  return {};
}

std::string stats_line(double seconds, NodeState state, const Rates& per_second,
                       const ServerCounters& c, uint64_t rx_pool_free) {
  char head[32];
  std::snprintf(head, sizeof(head), "[%6.1fs] ", seconds);
  return std::string(head) + std::string(node_state_name(state)) + "  pkts in " +
         std::to_string(per_second.frames_in) + "/s out " + std::to_string(per_second.frames_out) +
         "/s  aggregations " + std::to_string(per_second.aggregations) + "/s (total " +
         std::to_string(c.shards.updates) + ")  retransmissions " +
         std::to_string(c.net.tx_retransmits) + "  rx pool free " + std::to_string(rx_pool_free) +
         "  drops:" + drops_text(c);
}

std::string link_line(const std::string& port, bool up) {
  return "port " + port + ": link " + (up ? "up" : "down");
}

std::string populate_line(uint64_t bytes) {
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f", static_cast<double>(bytes) / 1e6);
  return std::string("mapped in the shared memory of the connected net_memif links (") + mb +
         " MB)";
}

std::string detach_line(const std::string& port, bool detached) {
  return "port " + port +
         (detached ? ": every worker behind it left; detached (not polled until a new peer "
                     "connects)"
                   : ": a new peer connected; attached again");
}

std::string pool_warning(const agg::Placement& placement, const std::vector<uint32_t>& own_shards,
                         uint32_t chunk_bytes, uint32_t workers, uint64_t pool_mbufs,
                         uint64_t staging_chunks) {
  uint64_t chunks = 0;
  for (const agg::Block& p : placement.blocks()) {
    for (uint32_t s : own_shards) {
      if (p.shard == s) chunks += (p.bytes() + chunk_bytes - 1) / chunk_bytes;
    }
  }
  const uint64_t sets = chunks * (workers > 0 ? workers - 1 : 0);
  if (staging_chunks >= sets) return {};
  const uint64_t worst = sets - staging_chunks;
  const uint64_t enough = worst + worst / 8;
  if (pool_mbufs >= enough) return {};
  return "warning: the RX pools hold " + std::to_string(pool_mbufs) + " mbufs; this node's " +
         std::to_string(chunks) + " chunks may need up to " + std::to_string(worst) +
         " held at once beyond its " + std::to_string(staging_chunks) +
         " staging chunks when workers send in different orders (flow control can then "
         "stall): raise mempool.mbufs so the pools hold at least " +
         std::to_string(enough);
}

std::string retransmission_text(const transport::PeerCounters& t) {
  if (t.tx.retransmits_fast + t.tx.retransmits_timeout + t.rx.spurious_retransmits == 0) return {};
  // The timer's resends are RTO and tail-probe losses; split them by the losses declared.
  const uint64_t rto =
      t.tx.retransmits_timeout > t.tx.tail_probes ? t.tx.retransmits_timeout - t.tx.tail_probes : 0;
  // RTO resends follow an expiry with its probe unanswered, or an answer.
  return " (RTO " + std::to_string(rto) + " after " + std::to_string(t.tx.rto_probes) +
         " probes, " + std::to_string(t.tx.probe_answers) + " answered, and " +
         std::to_string(t.tx.rto_expirations) + " expiries, " +
         std::to_string(t.tx.spurious_timeouts) + " shown spurious, SACK " +
         std::to_string(t.tx.retransmits_fast) + ", tail probes " +
         std::to_string(t.tx.retransmits_timeout - rto) + "; " +
         std::to_string(t.rx.spurious_retransmits) + " of the workers' resends arrived twice)";
}

void telemetry_values(const ServerCounters& c, telemetry::Values& v) {
  v.emplace_back("aggregations", c.shards.updates);
  c.for_each([&v](std::string_view prefix, std::string_view name, uint64_t n) {
    v.emplace_back(std::string(prefix).append(name), n);
  });
}

}  // namespace mercury::server
