// The server node's control plane end to end over real ports, driven by the
// library's own workers: they declare, the server answers ready (or
// refused, naming the difference), rank 0's initial parameters reach every
// worker as version 0 bit for bit, gradients then aggregate from there
// (version 1, 2, ...), and the barrier completes a generation only when
// every rank has arrived. Also: several workers behind one server port (one
// endpoint, a peer per worker), two server nodes each running their own
// shards, a worker whose job file gives it the wrong rank (refused; the job
// waits for it to restart right), a worker that dies, one that dies and
// comes straight back (a new transport epoch: the job ends). The repeats
// and mistakes no honest worker makes (a barrier sent twice, generations
// out of order, a declare repeated once running, gradients to the wrong
// server, a priority that is no scheduler level) come from a RawPeer rank.
// Everything runs on this thread, shards inline.
#include <gtest/gtest.h>

#include "pmd_env.h"
#include "ps_job.h"

namespace mercury {
namespace {

using pstest::Job;
using pstest::JobOptions;
using worker::Handle;

// Polls `job` for `seconds` whatever happens.
void idle(Job& job, double seconds) {
  job.poll_until([] { return false; }, seconds);
}

bool none_ready(const std::vector<Handle>& hs) {
  for (const Handle& h : hs) {
    if (h.ready()) return false;
  }
  return true;
}

TEST(PsControl, DeclareReadyInitRoundsAndBarrier) {
  Job job(JobOptions{});
  EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
  // Rank 0's buffers as they are when the job starts become version 0.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> reference(job.decls().size());
  for (size_t t = 0; t < job.decls().size(); ++t) {
    for (float& p : job.worker(0).params()[t]) p = dist(rng);
    reference[t] = job.worker(0).params()[t];
  }
  // Three of four ranks declared: no answer yet. The declares arrive once
  // each worker's transport has met the server's (epoch probes from
  // initial_rto, doubling; 10 ms in this adaptively polling job), so wait
  // for them, boundedly, then a while longer for an answer that must not come.
  std::vector<Handle> started;
  for (uint32_t w = 0; w < 3; ++w) started.push_back(job.worker(w).start());
  job.poll_until([&] { return job.server().counters_st().control.declares >= 3; }, 5.0);
  idle(job, 0.2);
  EXPECT_TRUE(none_ready(started));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
  EXPECT_EQ(job.server().counters_st().control.declares, 3u);
  started.push_back(job.worker(3).start());
  ASSERT_TRUE(job.wait(started));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  // Each worker checked the server's ready (its shard count and placement
  // fingerprint against its own) and then received version 0.
  for (uint32_t w = 0; w < 4; ++w) {
    ASSERT_TRUE(started[w].ok()) << job.worker(w).failure();
    EXPECT_TRUE(job.worker(w).api().started());
  }
  EXPECT_EQ(job.server().placement_st()->shards(), 2u);
  EXPECT_EQ(job.compare(reference, "initial parameters"), "");
  const uint64_t chunks = job.chunks();
  EXPECT_EQ(job.server().counters_st().shards.initialized, chunks);

  // Gradients of iteration 0 and 1 give versions 1 and 2, from those values.
  for (uint32_t r = 0; r < 2; ++r) ASSERT_EQ(job.round(r, reference, rng), "");

  // A barrier: not done until the last rank arrives.
  std::vector<Handle> barrier;
  for (uint32_t w = 0; w < 3; ++w) barrier.push_back(job.worker(w).api().barrier_async());
  idle(job, 0.2);
  EXPECT_TRUE(none_ready(barrier));
  barrier.push_back(job.worker(3).api().barrier_async());
  ASSERT_TRUE(job.wait(barrier));
  for (const Handle& h : barrier) EXPECT_TRUE(h.ok()) << h.error();

  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.declares, 4u);
  EXPECT_EQ(c.control.declares_repeated, 0u);
  EXPECT_EQ(c.control.barriers, 4u);
  EXPECT_EQ(c.control.barriers_completed, 1u);
  EXPECT_EQ(c.shards.updates, chunks * 3);  // version 0, 1, 2 of every chunk
  EXPECT_EQ(c.shards.refused, 0u);
  EXPECT_EQ(c.held, 0u);
  for (size_t d = 0; d < server::kServerDropCount; ++d) {
    EXPECT_EQ(c.drops[d], 0u) << server::server_drop_name(static_cast<server::ServerDrop>(d));
  }
}

// Barrier arrivals no honest worker sends: rank 3 (a RawPeer) sends a
// generation twice, asks again about a finished one, and sends generation
// 2 before 1, as two trainer threads of one process in barriers at once can
// make a worker do. A generation completes when every rank has sent it,
// whatever the order, never early, and every rank hears it.
TEST(PsControl, BarrierRepeatsAndGenerationsOutOfOrder) {
  JobOptions o;
  o.raw_ranks = {3};
  Job job(o);
  pstest::RawPeer& raw = job.raw(3);
  auto raw_got = [&](agg::ControlKind kind, uint64_t generation) {
    for (const agg::ControlMessage& m : raw.control()) {
      if (m.kind == kind && m.generation == generation) return true;
    }
    return false;
  };
  std::vector<Handle> started;
  for (uint32_t w = 0; w < 3; ++w) started.push_back(job.worker(w).start());
  raw.declare();
  ASSERT_TRUE(job.wait(started));
  for (const Handle& h : started) ASSERT_TRUE(h.ok()) << h.error();
  ASSERT_EQ(raw.control().size(), 1u);
  EXPECT_EQ(raw.control()[0].kind, agg::ControlKind::kReady);

  // Generation 0: ranks 0 and 1, and rank 3 twice, are three ranks, not four.
  std::vector<Handle> g0;
  for (uint32_t w = 0; w < 2; ++w) g0.push_back(job.worker(w).api().barrier_async());
  raw.barrier(0);
  raw.barrier(0);
  idle(job, 0.2);
  EXPECT_TRUE(none_ready(g0));
  EXPECT_EQ(raw.control().size(), 1u);
  g0.push_back(job.worker(2).api().barrier_async());
  ASSERT_TRUE(job.wait(g0));
  for (const Handle& h : g0) EXPECT_TRUE(h.ok()) << h.error();
  ASSERT_TRUE(job.poll_until([&] { return raw_got(agg::ControlKind::kBarrierDone, 0); }));
  // A rank asking again about a finished generation is answered again.
  raw.barrier(0);
  ASSERT_TRUE(job.poll_until([&] { return raw.control().size() == 3; }));
  EXPECT_EQ(raw.control()[2].kind, agg::ControlKind::kBarrierDone);
  EXPECT_EQ(raw.control()[2].generation, 0u);

  // Generations 1 and 2 from every worker, generation 2 only from rank 3:
  // 2 completes before 1, and 1 is not answered early.
  std::vector<Handle> g1, g2;
  for (uint32_t w = 0; w < 3; ++w) {
    g1.push_back(job.worker(w).api().barrier_async());
    g2.push_back(job.worker(w).api().barrier_async());
  }
  raw.barrier(2);
  ASSERT_TRUE(job.wait(g2));
  for (const Handle& h : g2) EXPECT_TRUE(h.ok()) << h.error();
  idle(job, 0.2);
  EXPECT_TRUE(none_ready(g1)) << "generation 1 answered early";
  EXPECT_TRUE(raw_got(agg::ControlKind::kBarrierDone, 2));
  EXPECT_FALSE(raw_got(agg::ControlKind::kBarrierDone, 1));
  raw.barrier(1);
  ASSERT_TRUE(job.wait(g1));
  for (const Handle& h : g1) EXPECT_TRUE(h.ok()) << h.error();
  ASSERT_TRUE(job.poll_until([&] { return raw_got(agg::ControlKind::kBarrierDone, 1); }));

  // A declare repeated once running can only come from a new process of
  // rank 3 (a worker declares once per process): the job ends for every
  // rank, naming it.
  const size_t before = raw.control().size();
  raw.declare();
  ASSERT_TRUE(job.poll_until([&] { return raw.control().size() == before + 1; }));
  const std::string why =
      "worker w3 (rank 3) restarted mid-job (a new incarnation, declared again); a job cannot "
      "take a rank back: start the job again";
  EXPECT_EQ(raw.control().back().kind, agg::ControlKind::kRefused);
  EXPECT_EQ(raw.control().back().text, why);
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  std::vector<Handle> later;
  for (uint32_t w = 0; w < 3; ++w) later.push_back(job.worker(w).api().barrier_async());
  ASSERT_TRUE(job.wait(later, 5));
  for (const Handle& h : later) {
    EXPECT_FALSE(h.ok());
    EXPECT_NE(std::string(h.error()).find(") stopped the job: " + why), std::string::npos)
        << h.error();
  }

  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.declares, 5u);
  EXPECT_EQ(c.control.declares_repeated, 1u);
  EXPECT_EQ(c.control.declares_refused, 1u);
  EXPECT_EQ(c.control.workers_restarted, 1u);
  EXPECT_EQ(c.control.barriers, 14u);
  EXPECT_EQ(c.control.barriers_repeated, 2u);
  EXPECT_EQ(c.control.barriers_completed, 3u);
  for (size_t d = 0; d < server::kServerDropCount; ++d) {
    EXPECT_EQ(c.drops[d], 0u) << server::server_drop_name(static_cast<server::ServerDrop>(d));
  }
}

// Rank 2's model file differs from the others' (tensor 5 has 64 more
// elements): the server refuses the job, naming the rank and the tensor,
// and every rank's start fails with the server's whole text. Rank 3 is a
// RawPeer, to show what no worker sends: gradients are not taken, and a
// late declare is refused again.
TEST(PsControl, MismatchedDeclareIsRefusedNamingTheTensor) {
  JobOptions o;
  o.raw_ranks = {3};
  o.model_of = [](uint32_t rank, std::vector<agg::TensorDecl>& decls) {
    if (rank == 2) decls[5].elements += 64;
  };
  Job job(o);
  std::vector<Handle> started;
  for (uint32_t w = 0; w < 3; ++w) started.push_back(job.worker(w).start());
  job.raw(3).declare();
  ASSERT_TRUE(job.wait(started));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  const std::string& why = job.server().refusal_st();
  EXPECT_NE(why.find("rank 2"), std::string::npos) << why;
  EXPECT_NE(why.find(job.decls()[5].name), std::string::npos) << why;
  for (uint32_t w = 0; w < 3; ++w) {
    EXPECT_FALSE(started[w].ok());
    const std::string failure = job.worker(w).failure();
    EXPECT_EQ(failure.rfind("start: server ps0 (", 0), 0u) << failure;
    EXPECT_NE(failure.find(") refused the declarations: " + why), std::string::npos) << failure;
    EXPECT_THROW(job.worker(w).api().push(0, job.worker(w).grads()[0]), worker::WorkerError);
  }
  ASSERT_TRUE(job.poll_until([&] { return !job.raw(3).control().empty(); }));
  EXPECT_EQ(job.raw(3).control()[0].kind, agg::ControlKind::kRefused);
  EXPECT_EQ(job.raw(3).control()[0].text, why);
  // Gradients are not taken; a late declare is refused again.
  job.raw(3).push_all(wire::PacketType::kData, 0);
  job.raw(3).declare();
  ASSERT_TRUE(job.poll_until([&] { return job.raw(3).control().size() == 2; }));
  EXPECT_EQ(job.raw(3).control()[1].kind, agg::ControlKind::kRefused);
  ASSERT_TRUE(job.poll_until(
      [&] { return job.server().counters_st().drop(server::ServerDrop::kNotRunning) > 0; }));
}

// Worker w1's job file makes it rank 9 (there is none), then w2's makes it
// rank 0: each declare is refused naming both ranks, each start fails with
// that text, and the job waits. Restarted with the right rank, both join,
// and the job starts.
TEST(PsControl, WrongRankIsRefusedAndTheJobWaits) {
  Job job(JobOptions{});
  // Worker w restarts believing it is rank `rank`; returns why its start failed.
  auto start_as = [&](uint32_t w, uint32_t rank) {
    worker::NetCoreConfig c = job.worker_config(w);
    c.rank = rank;
    job.replace_worker(w, c);
    const Handle h = job.worker(w).start();
    EXPECT_TRUE(job.wait({h}));
    EXPECT_FALSE(h.ok());
    EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
    return job.worker(w).failure();
  };
  std::string failure = start_as(1, 9);
  EXPECT_NE(failure.find("refused the declarations: server: w1 is rank 1"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("rank 9, which is not in this job"), std::string::npos) << failure;
  failure = start_as(2, 0);
  EXPECT_NE(failure.find("refused the declarations: server: w2 is rank 2"), std::string::npos)
      << failure;

  job.replace_worker(1, job.worker_config(1));
  job.replace_worker(2, job.worker_config(2));
  std::vector<Handle> started;
  for (uint32_t w = 0; w < 4; ++w) started.push_back(job.worker(w).start());
  ASSERT_TRUE(job.wait(started));
  for (uint32_t w = 0; w < 4; ++w) EXPECT_TRUE(started[w].ok()) << job.worker(w).failure();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  EXPECT_EQ(job.server().counters_st().drop(server::ServerDrop::kWrongRank), 2u);
}

// A worker that dies once the job runs: the server's messages to it are
// never acknowledged, its transport gives up after the peer timeout, and
// the server ends the job for every rank with the reason (under BSP the
// others would otherwise wait for its gradients for ever): their pending
// push_pulls fail with the server's text (or their start, if the server
// gave up before version 0 was in).
TEST(PsControl, ALostWorkerEndsTheJobForEveryRank) {
  JobOptions o;
  o.server_peer_timeout_ms = 300;
  Job job(o);
  // Worker 3 declares, the server takes it, then worker 3 goes silent.
  (void)job.worker(3).start();
  ASSERT_TRUE(job.poll_until([&] { return job.server().counters_st().control.declares == 1; }));
  job.silence(3);
  std::vector<Handle> started;
  for (uint32_t w = 0; w < 3; ++w) started.push_back(job.worker(w).start());
  ASSERT_TRUE(job.wait(started, 10));
  std::vector<std::string> failures(3);
  std::vector<std::vector<Handle>> rounds(3);
  for (uint32_t w = 0; w < 3; ++w) {
    if (!started[w].ok()) {
      failures[w] = job.worker(w).failure();
    } else {
      rounds[w] = job.worker(w).push_pull_all();
    }
  }
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(job.wait(rounds[w], 10));
    for (const Handle& h : rounds[w]) {
      EXPECT_FALSE(h.ok());
      if (failures[w].empty()) failures[w] = std::string(h.error());
    }
  }
  for (uint32_t w = 0; w < 3; ++w) {
    // The server was ready, then stopped the job.
    const std::string& failure = failures[w];
    EXPECT_EQ(failure.rfind("server ps0 (", 0), 0u) << failure;
    EXPECT_NE(failure.find(") stopped the job: "), std::string::npos) << failure;
    EXPECT_NE(failure.find("worker w3 (rank 3) stopped answering"), std::string::npos) << failure;
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  EXPECT_EQ(job.server().counters_st().control.workers_lost, 1u);
  EXPECT_EQ(job.server().counters_st().control.declares_refused, 0u);
}

// A worker whose process dies mid-job and comes straight back, long before
// the server's liveness check would name it (peer timeout 20 s here): the
// new process has the same rank, port and job file and a new transport
// epoch, which the server's endpoint takes as a restart once the old
// process leaves its challenge unanswered (200 ms here). A job does not
// take a rank back: the server ends it for every rank, naming the restart.
// The others' pending push_pulls fail with the server's text, and so do
// their later calls; the new process's start fails with it instead of
// waiting for a version 0 that would never come. Within a second of the
// restart.
TEST(PsControl, ARestartedWorkerEndsTheJobForEveryRank) {
  JobOptions o;
  o.server_challenge_timeout_ms = 200;
  Job job(o);
  std::vector<std::vector<float>> reference = job.start();
  std::mt19937 rng(7);
  ASSERT_EQ(job.round(0, reference, rng), "");
  // Worker 3 dies between rounds (nothing polls it any more); the others
  // start round 1, which waits for its gradients.
  job.silence(3);
  std::vector<std::vector<Handle>> rounds(3);
  for (uint32_t w = 0; w < 3; ++w) rounds[w] = job.worker(w).push_pull_all();
  idle(job, 0.2);
  for (const auto& hs : rounds) EXPECT_TRUE(none_ready(hs));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);

  // Its process comes back: the same rank on the same port, a new epoch.
  pstest::TestWorker again(job.decls(), job.link(3).b(), job.worker_config(3), job.loop());
  const Handle start = again.start();
  const uint64_t t0 = rte_rdtsc();
  ASSERT_TRUE(job.poll_until(
      [&] {
        if (!start.ready()) return false;
        for (const auto& hs : rounds) {
          for (const Handle& h : hs) {
            if (!h.ready()) return false;
          }
        }
        return true;
      },
      5.0));
  const double seconds =
      static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(rte_get_tsc_hz());
  EXPECT_LT(seconds, 1.0);

  const std::string why =
      "worker w3 (rank 3) restarted mid-job (a new incarnation, new epoch); a job cannot take a "
      "rank back: start the job again";
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  EXPECT_EQ(job.server().refusal_st(), why);
  EXPECT_FALSE(start.ok());
  const std::string failure = again.failure();
  EXPECT_EQ(failure.rfind("start: server ps0 (", 0), 0u) << failure;
  EXPECT_NE(failure.find(") refused the declarations: " + why), std::string::npos) << failure;
  auto stopped = [&](const Handle& h) {
    EXPECT_FALSE(h.ok());
    const std::string error(h.error());
    EXPECT_EQ(error.rfind("server ps0 (", 0), 0u) << error;
    EXPECT_NE(error.find(") stopped the job: " + why), std::string::npos) << error;
  };
  for (const auto& hs : rounds) {
    for (const Handle& h : hs) stopped(h);
  }
  // Later calls fail with the same text.
  std::vector<Handle> later;
  for (uint32_t w = 0; w < 3; ++w) later.push_back(job.worker(w).api().barrier_async());
  ASSERT_TRUE(job.wait(later, 5));
  for (const Handle& h : later) stopped(h);

  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.workers_restarted, 1u);
  EXPECT_EQ(c.control.workers_lost, 0u);
  EXPECT_EQ(job.server().peer_totals_st().rx.peer_restarts, 1u);
  EXPECT_EQ(job.server().peer_totals_st().challenges, 1u);
  EXPECT_EQ(job.server().peer_totals_st().challenge_answers, 0u);
}

// A worker that stops says so (kLeave) and waits for the acknowledgement:
// the server sends it nothing more, so with a liveness timeout of 800 ms
// nothing names it lost. Under BSP the others' next push can never be
// aggregated without it: the job ends for them, naming both, instead of
// leaving them waiting.
TEST(PsControl, AWorkerThatLeavesEarlyEndsTheJobNamingIt) {
  JobOptions o;
  o.server_peer_timeout_ms = 800;  // heartbeats every 100 ms
  Job job(o);
  std::vector<std::vector<float>> reference = job.start();
  std::mt19937 rng(5);
  ASSERT_EQ(job.round(0, reference, rng), "");
  job.worker(3).api().shutdown();
  EXPECT_EQ(job.server().counters_st().control.leaves, 1u);
  idle(job, 1.5);
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  EXPECT_EQ(job.server().counters_st().control.workers_lost, 0u);
  std::vector<std::vector<Handle>> rounds(3);
  for (uint32_t w = 0; w < 3; ++w) rounds[w] = job.worker(w).push_pull_all();
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(job.wait(rounds[w], 10));
    for (const Handle& h : rounds[w]) {
      ASSERT_FALSE(h.ok());
      const std::string error(h.error());
      EXPECT_NE(error.find("stopped the job: worker w3 (rank 3) left the job, and w"),
                std::string::npos)
          << error;
    }
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.pushes_after_leave, 1u);
  EXPECT_GE(c.drops[static_cast<size_t>(server::ServerDrop::kAfterLeave)], 1u);
}

// Every worker leaving after its last round finishes the job.
TEST(PsControl, EveryWorkerLeavingFinishesTheJob) {
  Job job(JobOptions{});
  std::vector<std::vector<float>> reference = job.start();
  std::mt19937 rng(6);
  ASSERT_EQ(job.round(0, reference, rng), "");
  for (uint32_t w = 0; w < job.workers(); ++w) {
    EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning) << w;
    job.worker(w).api().shutdown();
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kFinished);
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.leaves, job.workers());
  EXPECT_EQ(c.control.workers_lost, 0u);
  for (size_t d = 0; d < server::kServerDropCount; ++d) {
    EXPECT_EQ(c.drops[d], 0u) << server::server_drop_name(static_cast<server::ServerDrop>(d));
  }
}

TEST(PsControl, SeveralWorkersOnOnePort) {
  JobOptions o;
  o.hub = true;
  Job job(o);
  EXPECT_EQ(job.server().ports(), 1u);
  EXPECT_EQ(job.server().endpoint(0).num_peers(), 4);
  std::vector<std::vector<float>> reference = job.start(5);
  EXPECT_EQ(job.compare(reference, "initial parameters"), "");
  std::mt19937 rng(9);
  for (uint32_t r = 0; r < 3; ++r) ASSERT_EQ(job.round(r, reference, rng), "");
  EXPECT_EQ(job.barrier(), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.shards.updates, job.chunks() * 4);
  EXPECT_EQ(c.shards.refused, 0u);
}

TEST(PsControl, UndersizedEndpointsDeferTheFanOutAndLoseNothing) {
  // 32 descriptors per server endpoint for ~10 000 chunk updates a round:
  // most slices are refused at first, kept, and resubmitted as acks free
  // descriptors.
  JobOptions o;
  o.server_max_messages = 32;
  Job job(o);
  std::vector<std::vector<float>> reference = job.start(11);
  EXPECT_EQ(job.compare(reference, "initial parameters"), "");
  std::mt19937 rng(13);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_EQ(job.round(r, reference, rng), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_GT(c.shards.fanout_refused, 0u);
  EXPECT_EQ(c.shards.fanout_retried, c.shards.fanout_refused);
  EXPECT_EQ(c.shards.fanout_lost, 0u);
  EXPECT_EQ(c.shards.updates, job.chunks() * 3);
}

// Two server nodes running 1 and 2 of the job's 3 shards, every node behind
// one switch: each runs its own shards only, each worker sends each
// block to the server that owns it and takes the updates of both, the
// aggregates are exact, and server 0 alone runs the barrier.
TEST(PsControl, TwoServerNodesEachRunTheirShards) {
  JobOptions o;
  o.hub = true;
  o.job_shards = {1, 2};
  Job job(o);
  std::vector<std::vector<float>> reference = job.start(17);
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(job.server(s).state_st(), server::NodeState::kRunning);
    EXPECT_EQ(job.server(s).placement_st()->shards(), 3u);
  }
  EXPECT_NE(job.server(0).shard(0), nullptr);
  EXPECT_EQ(job.server(0).shard(1), nullptr);
  EXPECT_EQ(job.server(1).shard(0), nullptr);
  EXPECT_NE(job.server(1).shard(1), nullptr);
  EXPECT_NE(job.server(1).shard(2), nullptr);
  EXPECT_EQ(job.compare(reference, "initial parameters"), "");
  std::mt19937 rng(19);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_EQ(job.round(r, reference, rng), "");
  EXPECT_EQ(job.barrier(), "");
  uint64_t chunks[2] = {0, 0};
  for (const agg::Block& p : job.server(0).placement_st()->blocks()) {
    chunks[p.shard == 0 ? 0 : 1] += (p.bytes() + job.chunk_bytes() - 1) / job.chunk_bytes();
  }
  ASSERT_GT(chunks[0], 0u);
  ASSERT_GT(chunks[1], 0u);
  for (uint32_t s = 0; s < 2; ++s) {
    const server::ServerCounters c = job.server(s).counters_st();
    EXPECT_EQ(c.shards.updates, chunks[s] * 3) << "server " << s;
    EXPECT_EQ(c.drop(server::ServerDrop::kNotOurs), 0u) << "server " << s;
    EXPECT_EQ(c.control.barriers, s == 0 ? 4u : 0u) << "server " << s;
  }
}

// What a worker must not send the second server node of such a job: rank
// 0 (a RawPeer) sends every block's initial values and a barrier to
// server 1, which takes those of its own shards, drops the others' as not
// ours, and leaves the barrier to server 0.
TEST(PsControl, SecondServerNodeDropsWhatIsNotItsOwn) {
  JobOptions o;
  o.hub = true;
  o.job_shards = {1, 2};
  o.workers = 1;
  o.raw_ranks = {0};
  Job job(o);
  pstest::RawPeer& raw = job.raw(0);
  raw.declare(0);
  raw.declare(1);
  ASSERT_TRUE(job.poll_until([&] { return raw.control().size() == 2; }));
  for (const agg::ControlMessage& m : raw.control()) {
    ASSERT_EQ(m.kind, agg::ControlKind::kReady) << m.text;
    EXPECT_EQ(m.shards, 3u);
  }
  uint64_t theirs = 0;  // init packets for shard 0
  for (const agg::Block& p : job.server(1).placement_st()->blocks()) {
    if (p.shard == 0) theirs += (p.bytes() + job.chunk_bytes() - 1) / job.chunk_bytes();
  }
  ASSERT_GT(theirs, 0u);
  raw.push_all(wire::PacketType::kInit, 0, 1);
  raw.barrier(0, 1);
  ASSERT_TRUE(job.poll_until([&] {
    const server::ServerCounters c = job.server(1).counters_st();
    return c.shards.initialized + c.drop(server::ServerDrop::kNotOurs) == job.chunks() &&
           c.drop(server::ServerDrop::kBarrierNotHere) == 1;
  }));
  EXPECT_EQ(job.server(1).counters_st().drop(server::ServerDrop::kNotOurs), theirs);
}

// Priorities the scheduler has no level for (a worker that declares the
// model's raw priorities, 0..160, instead of the levels its tensor table
// maps them onto): the server refuses the job and says why.
TEST(PsControl, PrioritiesThatAreNoSchedulerLevelAreRefused) {
  JobOptions o;
  o.model = "resnet50.txt";
  o.scale_down = 64;
  o.workers = 1;
  o.raw_ranks = {0};
  Job job(o);
  job.raw(0).declare(job.decls(), 0);
  ASSERT_TRUE(job.poll_until([&] { return !job.raw(0).control().empty(); }));
  const agg::ControlMessage& m = job.raw(0).control()[0];
  EXPECT_EQ(m.kind, agg::ControlKind::kRefused);
  EXPECT_NE(m.text.find("not a scheduler level"), std::string::npos) << m.text;
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
}

TEST(PsControl, BadJobShapesAreRefusedAtConstruction) {
  server::ServerNodeConfig sc;
  sc.chunk_bytes = 1408;
  sc.layout = job::ShardLayout::of({1, 2});
  sc.server_index = 2;
  EXPECT_THROW(server::ServerNode(std::vector<net::PacketPort*>{}, {}, sc, 0),
               std::invalid_argument);
  sc.layout = job::ShardLayout::of({1, 0});
  sc.server_index = 0;
  EXPECT_THROW(server::ServerNode(std::vector<net::PacketPort*>{}, {}, sc, 0),
               std::invalid_argument);
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
