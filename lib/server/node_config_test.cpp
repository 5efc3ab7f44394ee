// A server node's configuration from a job file, and what it tells its
// operator: the same functions ps-server uses, without EAL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "server/node_config.h"
#include "server/report.h"

namespace mercury::server {
namespace {

const char* kJob = R"(
job: {id: 4, name: two-servers}
network: {mtu: 1500, window: 32}
training: {sync: bsp, optimizer: momentum, learning_rate: 0.25}
nodes:
  - {name: s0, role: server, ipv4: 10.0.0.1, ports: ["net_memif0,role=server"], lcores: [0, 1],
     shards: 1}
  - {name: s1, role: server, ipv4: 10.0.0.2, ports: ["net_memif1,role=server", "net_memif2,role=server"],
     lcores: [2, 3, 4], shards: 2}
  - {name: w0, role: worker, ipv4: 10.0.0.3, ports: ["net_memif10,role=client"], lcores: [5]}
  - {name: w1, role: worker, ipv4: 10.0.0.4, ports: ["net_memif11,role=client"], lcores: [6]}
)";

TEST(NodeConfig, EverythingComesFromTheJobFile) {
  const config::JobConfig job = config::load_string(kJob, "two.yaml");
  const ServerNodeConfig c =
      node_config(job, job.node("s1"), {.epoch = 7, .tsc_hz = 1'000'000, .rx_pool_mbufs = 8191});
  EXPECT_EQ(c.chunk_bytes, job.payload_bytes_per_packet());
  EXPECT_EQ(c.optimizer.kind, agg::OptimizerKind::kMomentum);
  EXPECT_FLOAT_EQ(c.optimizer.learning_rate, 0.25f);
  ASSERT_TRUE(c.sync_policy);
  EXPECT_EQ(c.sync_policy()->name(), "bsp");
  EXPECT_EQ(c.layout.total, 3u);
  EXPECT_EQ(c.layout.first, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(c.server_index, 1u);
  EXPECT_EQ(c.endpoint.job_id, 4u);
  EXPECT_EQ(c.endpoint.sender_id, 1);  // its index in the nodes list
  EXPECT_EQ(c.endpoint.local_epoch, 7u);
  EXPECT_EQ(c.endpoint.transport.window_packets, 32u);
  EXPECT_EQ(c.endpoint.transport.tsc_hz, 1'000'000u);
  EXPECT_EQ(c.endpoint.max_messages, kServerEndpointMessages);
  EXPECT_EQ(c.endpoint.ingress_capacity, kServerEndpointMessages);
  EXPECT_EQ(c.shard_lcores, (std::vector<unsigned>{3, 4}));
  EXPECT_EQ(c.shard_core.ring_entries, 8192u);  // more than every pool mbuf, a power of two
  EXPECT_EQ(c.shard_core.idle.mode, config::Poll::kAdaptive);  // the default
  EXPECT_EQ(c.rx_pool_mbufs, 8191u);
  EXPECT_EQ(c.flow_limit, 0u);
  EXPECT_EQ(c.unit_chunks, 0u);  // training.aggregation chunk, the default
  EXPECT_EQ(c.placement.max_block_bytes, 0u);

  config::JobConfig classical = job;
  classical.training.aggregation = config::Aggregation::kTensor;
  const ServerNodeConfig t = node_config(classical, classical.node("s1"), {.epoch = 7});
  EXPECT_EQ(t.unit_chunks, UINT32_MAX);  // whole tensors, each one block
  EXPECT_EQ(t.placement.max_block_bytes, agg::PlacementOptions::kMaxMessageBytes);

  const ServerNodeConfig c0 = node_config(job, job.node("s0"), {});
  EXPECT_EQ(c0.server_index, 0u);
  EXPECT_EQ(c0.shard_lcores, (std::vector<unsigned>{1}));
  EXPECT_EQ(c0.shard_core.ring_entries, ShardCoreOptions{}.ring_entries);  // pools unknown
}

// A shard core never shares a CPU with the net core or another shard core of
// its node: from the first lcore that would, the node's shards run inline.
TEST(NodeConfig, ShardCoresOneToACpuTheRestInline) {
  const config::JobConfig job = config::load_string(kJob);
  const config::NodeConfig& s1 = job.node("s1");  // net core 2, shard lcores 3 and 4
  auto on = [](std::vector<unsigned> cpus) {
    return [cpus](unsigned lcore) { return cpus[lcore % cpus.size()]; };
  };
  // Every lcore its own CPU (no mapping given, or enough CPUs): both shard cores.
  EXPECT_EQ(shard_core_lcores(s1, nullptr), (std::vector<unsigned>{3, 4}));
  EXPECT_EQ(shard_core_lcores(s1, on({0, 1, 2, 3, 4})), (std::vector<unsigned>{3, 4}));
  // 2 CPUs: lcore 3 on CPU 1, lcore 4 on CPU 0 with the net core (lcore 2).
  EXPECT_EQ(shard_core_lcores(s1, on({0, 1})), (std::vector<unsigned>{3}));
  // 1 CPU: every shard inline.
  EXPECT_EQ(shard_core_lcores(s1, on({5})), (std::vector<unsigned>{}));
  // What node_config gives the node.
  const ServerNodeConfig c = node_config(job, s1, {.cpu_of_lcore = on({0, 1})});
  EXPECT_EQ(c.shard_lcores, (std::vector<unsigned>{3}));
}

TEST(NodeConfig, AWorkerIsNotAServer) {
  const config::JobConfig job = config::load_string(kJob);
  EXPECT_THROW(node_config(job, job.node("w0"), {}), config::ConfigError);
}

TEST(NodeConfig, JobWorkersAreInRankOrderOnThePortThatLeadsToThem) {
  const config::JobConfig job = config::load_string(kJob);
  const std::vector<JobWorker> one_port = job_workers(job, job.node("s0"));
  ASSERT_EQ(one_port.size(), 2u);
  EXPECT_EQ(one_port[0].peer.name, "w0");
  EXPECT_EQ(one_port[0].peer.ip, job.node("w0").ipv4.value);
  EXPECT_EQ(one_port[0].port, 0u);
  EXPECT_EQ(one_port[1].port, 0u);
  const std::vector<JobWorker> per_worker = job_workers(job, job.node("s1"));
  EXPECT_EQ(per_worker[0].port, 0u);
  EXPECT_EQ(per_worker[1].port, 1u);
  EXPECT_EQ(per_worker[1].peer.udp_port, job.node("w1").udp_port);
}

// The fan-out rule must fit the policy: a quorum of every worker sends from
// the table's memory, a quorum of 1 needs the snapshots of the asynchronous
// rules. node_config() derives both from training.sync.
TEST(NodeConfig, TheFanOutRuleMustFitThePolicy) {
  ServerNodeConfig c;
  c.chunk_bytes = 1408;
  c.layout = job::ShardLayout::of({1});
  c.sync_policy = [] { return agg::make_asp(); };
  try {
    // Refused before any port is touched: no EAL needed.
    ServerNode node(std::vector<net::PacketPort*>{}, {JobWorker{}, JobWorker{}}, c, 0);
    FAIL() << "asp ran with the bsp fan-out";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "server: training.sync asp does not match the fan-out rule");
  }
  for (const auto& [mode, rule] : {std::pair{config::Sync::kBsp, Fanout::kEvery},
                                   {config::Sync::kAsp, Fanout::kContributor},
                                   {config::Sync::kSsp, Fanout::kSlowest},
                                   {config::Sync::kPsPlus, Fanout::kEveryVersion}}) {
    config::JobConfig job =
        config::load_string(std::string("job: {id: 1, name: modes}\nnodes:\n"
                                        "  - {name: s0, role: server, ipv4: 10.0.0.1, ports: "
                                        "[\"net_memif0,role=server\"], lcores: [0, 1],"
                                        " shards: 1}\n"
                                        "  - {name: w0, role: worker, ipv4: 10.0.0.2, ports: "
                                        "[\"net_memif1,role=client\"], lcores: [2]}\n"
                                        "training:\n  sync: ") +
                            std::string(config::to_string(mode)) +
                            (mode == config::Sync::kSsp ? "\n  staleness_bound: 2\n" : "\n"));
    const ServerNodeConfig n = node_config(job, job.node("s0"), NodeStart{});
    EXPECT_EQ(n.fanout, rule) << config::to_string(mode);
    EXPECT_EQ(n.staleness_bound, mode == config::Sync::kSsp ? 2u : 0u);  // whom ssp tells
    EXPECT_EQ(n.sync_policy()->quorum(4), mode == config::Sync::kBsp ? 4u : 1u);
  }
}

TEST(Report, CheckLineNamesTheServersRankAndShardRange) {
  const config::JobConfig job = config::load_string(kJob, "two.yaml");
  EXPECT_EQ(check_line(job, job.node("s1")),
            "two.yaml: ok: server s1 (rank 1 of 2), shards 1..2 of 3, 2 workers, 2 ports");
}

TEST(Report, StatsLineAndItsDropsWalkTheCounters) {
  ServerCounters c;
  EXPECT_EQ(drops_text(c), " none");
  c.shards.updates = 41234;
  c.net.tx_retransmits = 12;
  c.net.drops[static_cast<size_t>(transport::EndpointDrop::kRetransmitStale)] = 3;
  c.port_drops[0] = 2;
  c.drops[static_cast<size_t>(ServerDrop::kNotRunning)] = 5;
  c.shards.refused = 1;
  c.shards.contributions = 99;  // not a drop
  c.pmd_drops.rx_nombuf = 4;    // the PMD's own, after the stack's
  c.pmd_drops.oerrors = 6;
  const std::string port_drop = std::string(net::drop_reason_name(static_cast<net::DropReason>(0)));
  EXPECT_EQ(drops_text(c), " retransmit_stale=3 " + port_drop +
                               "=2 rx_nombuf=4 oerrors=6 not_running=5 shard_refused=1");
  EXPECT_EQ(stats_line(5.0, NodeState::kRunning, {412345, 398765, 9876}, c, 7843),
            "[   5.0s] running  pkts in 412345/s out 398765/s  aggregations 9876/s (total "
            "41234)  retransmissions 12  rx pool free 7843  drops:" +
                drops_text(c));
}

// The final line's account of the asynchronous fan-out: nothing under BSP
// (or when nothing was deferred), both counts once either is not 0, and
// psplus's eager copies when there were any.
TEST(Report, AsyncFanoutTextOnlyWhenSomethingWasDeferred) {
  ServerCounters c;
  c.shards.updates = 7;
  c.shards.fanout_refused = 2;  // BSP's deferrals are not these
  EXPECT_EQ(async_fanout_text(c), "");
  c.shards.snapshots_full = 30;
  c.shards.fanout_merged = 12;
  EXPECT_EQ(async_fanout_text(c),
            "; async fan-out: 30 updates found every snapshot on the wire and waited, 12 copies "
            "merged into one already waiting");
  c.shards.snapshots_full = 0;
  EXPECT_NE(async_fanout_text(c).find(": 0 updates found"), std::string::npos);
  c.shards.eager_sent = 5;  // psplus: also the eager copies
  EXPECT_EQ(async_fanout_text(c),
            "; async fan-out: 0 updates found every snapshot on the wire and waited, 12 copies "
            "merged into one already waiting, 5 eager copies sent");
  c.shards.fanout_merged = 0;
  EXPECT_NE(async_fanout_text(c), "");  // eager copies alone are said too
}

// The final line's staleness: nothing when no update was stale (BSP), else
// how many were and the mean over every update.
TEST(Report, StalenessTextOnlyWhenAnUpdateWasStale) {
  ServerCounters c;
  c.shards.updates = 400;
  EXPECT_EQ(staleness_text(c), "");
  c.shards.stale_updates = 300;
  c.shards.staleness_sum = 900;
  EXPECT_EQ(staleness_text(c), "; stale updates: 300 of 400, 2.25 versions behind on average");
}

TEST(Report, LinkLineNamesThePort) {
  EXPECT_EQ(link_line("net_memif2", false), "port net_memif2: link down");
  EXPECT_EQ(link_line("net_memif2", true), "port net_memif2: link up");
  EXPECT_EQ(populate_line(72'351'744),
            "mapped in the shared memory of the connected net_memif links (72.4 MB)");
  EXPECT_EQ(detach_line("net_memif2", true),
            "port net_memif2: every worker behind it left; detached (not polled until a new "
            "peer connects)");
  EXPECT_EQ(detach_line("net_memif2", false),
            "port net_memif2: a new peer connected; attached "
            "again");
}

TEST(Report, TelemetryHasTheAggregationsAndEveryCounter) {
  ServerCounters c;
  c.shards.updates = 8;
  c.drops[static_cast<size_t>(ServerDrop::kNotRunning)] = 2;
  c.pmd_drops.imissed = 9;
  telemetry::Values v;
  telemetry_values(c, v);
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.front(), (std::pair<std::string, uint64_t>{"aggregations", 8}));
  EXPECT_EQ(v.size(), 1 + sizeof(ServerCounters) / sizeof(uint64_t));
  bool found = false, pmd = false;
  for (const auto& [name, value] : v) {
    if (name == "drop_not_running") found = value == 2;
    if (name == "port_drop_imissed") pmd = value == 9;
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(pmd);
}

TEST(Report, RetransmissionsByCause) {
  transport::PeerCounters t;
  EXPECT_EQ(retransmission_text(t), "");
  t.tx.retransmits_timeout = 390;
  t.tx.tail_probes = 10;
  t.tx.rto_expirations = 25;
  t.tx.rto_probes = 40;
  t.tx.probe_answers = 38;
  t.tx.retransmits_fast = 20;
  t.tx.spurious_timeouts = 7;
  t.rx.spurious_retransmits = 12;
  EXPECT_EQ(retransmission_text(t),
            " (RTO 380 after 40 probes, 38 answered, and 25 expiries, 7 shown spurious, SACK 20, "
            "tail probes 10; 12 of the workers' resends arrived twice)");
}

TEST(Report, PoolWarningWhenThePoolsCannotHoldTheWorstDisorder) {
  const std::vector<agg::TensorDecl> decls = {{"a", 1408 / 4 * 100, 0}, {"b", 1408 / 4 * 60, 1}};
  const agg::Placement p = agg::Placement::compute(decls, 2, {.max_block_bytes = 1 << 30});
  const uint32_t a_shard = p.at(0).shard;
  // 100 chunks of "a", 3 workers, no staging: up to 200 held, 225 asked for.
  EXPECT_EQ(pool_warning(p, {a_shard}, 1408, 3, 225, 0), "");
  EXPECT_EQ(pool_warning(p, {a_shard}, 1408, 3, 224, 0),
            "warning: the RX pools hold 224 mbufs; this node's 100 chunks may need up to 200 held "
            "at once beyond its 0 staging chunks when workers send in different orders (flow "
            "control can then stall): raise mempool.mbufs so the pools hold at least 225");
  EXPECT_NE(pool_warning(p, {0, 1}, 1408, 3, 225, 0), "");  // both shards: 160 chunks
  // Staging for every set (the server's default): no pool is too small.
  EXPECT_EQ(pool_warning(p, {a_shard}, 1408, 3, 1, 200), "");
  // Staging for half: the other half must fit in the pools.
  EXPECT_EQ(pool_warning(p, {a_shard}, 1408, 3, 112, 100), "");
  EXPECT_NE(pool_warning(p, {a_shard}, 1408, 3, 111, 100), "");
}

}  // namespace
}  // namespace mercury::server
