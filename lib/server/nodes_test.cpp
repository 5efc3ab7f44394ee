// A whole job without EAL: one ServerNode and 2-4 workers (the library's
// Worker, its NetCore a poller of the same node::Loop), every link a pair of
// net::MemoryPorts, one thread, a fake clock. What the PMD tests check over
// real DPDK ports, checked here on the node layer alone: a BSP round exact
// against the reference, a mismatched declare refused, a silent worker named
// by liveness, loss and reordering recovered bit for bit, PS+'s eager pull,
// a start whose build outlasts the peer timeout, a start that no server
// answers, every buffer back in its pool at the end, and a wrong-thread call
// aborting.
#include "server/nodes_harness.h"

namespace mercury {
namespace {

using namespace nodes_test;

TEST(Nodes, BspRoundsAreExactWithTwoToFourWorkers) {
  for (uint32_t n = 2; n <= 4; ++n) {
    SCOPED_TRACE("workers " + std::to_string(n));
    std::vector<std::vector<float>> reference;
    {
      Nodes job({.workers = n});
      ASSERT_EQ(job.start(reference), "");
      std::mt19937 rng(n);
      for (int round = 0; round < 3; ++round) ASSERT_EQ(job.round(reference, rng), "");
      const server::ServerCounters c = job.server().counters_st();
      // Every chunk of every block: version 0 and three updates.
      uint64_t chunks = 0;
      for (const agg::Block& b : job.server().placement_st()->blocks()) {
        chunks += (b.bytes() + net::payload_per_packet(kMtu) - 1) / net::payload_per_packet(kMtu);
      }
      EXPECT_EQ(c.shards.updates, 4 * chunks);
      EXPECT_EQ(c.net.tx_retransmits, 0u);
      for (uint32_t r = 0; r < n; ++r) {
        EXPECT_EQ(job.server().port(r).traffic().rx_frames, job.worker_side(r).traffic().tx_frames);
      }
    }
  }
}

// Every buffer a port lent out (held by a chunk table, queued, on the link)
// is back in its pool once the job is over.
TEST(Nodes, EveryBufferComesBack) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .impair = {.loss = 0.02}});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(9);
  ASSERT_EQ(job.round(reference, rng), "");
  ASSERT_EQ(job.round(reference, rng), "");
  // The workers leave (answered), then nothing is left in flight.
  for (uint32_t r = 0; r < 3; ++r) job.rank(r).api().shutdown();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kFinished);
  EXPECT_TRUE(job.run(
      [&] {
        for (uint32_t r = 0; r < 3; ++r) {
          if (job.server_side(r).buffers_free() != job.server_side(r).buffers()) return false;
          if (job.worker_side(r).buffers_free() != job.worker_side(r).buffers()) return false;
        }
        return true;
      },
      100 * kMs));
  EXPECT_EQ(job.server().counters_st().held, 0u);
}

TEST(Nodes, LossReorderingAndDuplicatesChangeNoBit) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 4, .impair = {.loss = 0.02, .duplicate = 0.01, .reorder = 0.02}});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(3);
  for (int round = 0; round < 4; ++round) ASSERT_EQ(job.round(reference, rng), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_GT(c.net.tx_retransmits, 0u);
  EXPECT_GT(job.server_side(0).counters().link_lost + job.worker_side(0).counters().link_lost, 0u);
}

TEST(Nodes, AMismatchedDeclareIsRefusedOnEveryRank) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .odd_rank = 1});
  const std::string failed = job.start(reference);
  EXPECT_NE(failed.find("refused the declarations"), std::string::npos) << failed;
  EXPECT_NE(failed.find("fc.weight"), std::string::npos) << failed;
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  EXPECT_NE(job.server().refusal_st().find("rank 1"), std::string::npos)
      << job.server().refusal_st();
}

// A worker that dies mid-job is named by the server's liveness within the
// peer timeout (1 s here), and every other rank's calls fail with the
// server's text instead of waiting for its gradients.
TEST(Nodes, ASilentWorkerIsNamedByLiveness) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(4);
  ASSERT_EQ(job.round(reference, rng), "");
  job.kill(2);
  const uint64_t t0 = g_now.load();
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 2; ++r) {
    hs.push_back(job.rank(r).api().push_pull(0, job.rank(r).grads[0], job.rank(r).params[0]));
  }
  ASSERT_TRUE(job.wait(hs, 3'000 * kMs));
  const double seconds = static_cast<double>(g_now.load() - t0) / kHz;
  EXPECT_LT(seconds, 1.5);
  for (const worker::Handle& h : hs) {
    EXPECT_FALSE(h.ok());
    EXPECT_NE(h.error().find("w2"), std::string_view::npos) << h.error();
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
}

// The job's start builds the shards inside the server's receive pass, for
// seconds on a loaded machine. What that pass sent would carry its time,
// that old: the transport's liveness clock would start in the past and name
// a worker lost before its acknowledgement could come. Here the pass that
// starts the job "takes" twice the peer timeout (1 s): the fake clock jumps
// after it, while the workers are off their CPU, and the server runs alone
// long enough for its timers; then the start completes and nobody was lost.
TEST(Nodes, AStartThatBuildsLongerThanThePeerTimeoutLosesNoWorker) {
  Nodes job({.workers = 2, .start_timeout_ms = 10'000});
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 2; ++r) hs.push_back(job.rank(r).api().start_async());
  job.loop().pass_st(tick());  // the workers take their start and send their declarations
  for (uint32_t r = 0; r < 2; ++r) job.loop().remove(*job.rank(r).polled->net_core());
  ASSERT_TRUE(job.run([&] { return job.server().state_st() == server::NodeState::kRunning; }));
  g_now += 2'000 * kMs;
  // 3 ms alone: the endpoints' timers and the node's liveness check (every ms) run.
  for (int i = 0; i < 3'000; ++i) job.loop().pass_st(tick());
  ASSERT_EQ(job.server().state_st(), server::NodeState::kRunning) << job.server().refusal_st();
  for (uint32_t r = 0; r < 2; ++r) job.loop().add(*job.rank(r).polled->net_core());
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) EXPECT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(job.server().counters_st().control.workers_lost, 0u);
  std::vector<std::vector<float>> reference = job.rank(0).params;
  std::mt19937 rng(12);
  ASSERT_EQ(job.round(reference, rng), "");
}

// PS+: a worker that pushes nothing still receives each new version of a
// tensor (the eager pull), the update of the gradient another worker pushed.
TEST(Nodes, PsPlusSendsEveryVersionEagerly) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .sync = config::Sync::kPsPlus});
  ASSERT_EQ(job.start(reference), "");
  Rank& w0 = job.rank(0);
  Rank& w1 = job.rank(1);
  for (size_t i = 0; i < w0.grads[2].size(); ++i) w0.grads[2][i] = static_cast<float>(i % 7) - 3;
  job.rank(0).api().mark_read(2);
  const worker::Handle pushed = w0.api().push(2, w0.grads[2]);
  // w1 asks for version 1 of fc.weight without pushing anything.
  std::vector<float> got(w1.params[2].size());
  const worker::Handle pulled = w1.api().pull(2, got, 1);
  ASSERT_TRUE(job.wait({pushed, pulled}));
  ASSERT_TRUE(pushed.ok()) << pushed.error();
  ASSERT_TRUE(pulled.ok()) << pulled.error();
  for (size_t i = 0; i < got.size(); ++i) {
    // Quorum 1, staleness 0: the gradient unaveraged, the rate unscaled.
    ASSERT_EQ(got[i], reference[2][i] - kLr * w0.grads[2][i]) << i;
  }
  EXPECT_GT(job.server().counters_st().shards.eager_sent, 0u);
}

// A worker whose server never answers fails its start at the start timeout
// (fake time), naming the server.
TEST(Nodes, AStartNobodyAnswersTimesOut) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .start_timeout_ms = 500});
  job.impair(1, {.cut = true});
  const uint64_t t0 = g_now.load();
  const std::string failed = job.start(reference);
  EXPECT_NE(failed.find("no answer to the declarations from server server0"), std::string::npos)
      << failed;
  const double seconds = static_cast<double>(g_now.load() - t0) / kHz;
  EXPECT_GE(seconds, 0.5);
  EXPECT_LT(seconds, 0.6);
}

// The thread contract on a real node: its net core's thread owns it, and a
// call from any other thread aborts in a build with owner checks.
TEST(NodesDeathTest, AWrongThreadCallAborts) {
  if (!base::kOwnerChecks) GTEST_SKIP() << "built with owner_checks=false";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::vector<std::vector<float>> reference;
        Nodes job({.workers = 2});
        if (!job.start(reference).empty()) std::abort();
        std::thread other([&] { (void)job.server().counters_st(); });
        other.join();
      },
      "counters_st called on thread .*, but its object belongs to thread");
}

}  // namespace
}  // namespace mercury
