// The server node's control plane end to end over real ports: workers
// declare, the server answers ready (or refused, naming the difference),
// rank 0's initial parameters reach every worker as version 0 bit for bit,
// gradients then aggregate from there (version 1, 2, ...), and the barrier
// completes a generation only when every rank has arrived. Also: several
// workers behind one server port (one endpoint, a peer per worker), and the
// repeats and mistakes a control plane must survive (a declare sent twice, a
// wrong rank, a barrier sent twice). Everything runs on this thread, shards
// inline.
#include <gtest/gtest.h>

#include "pmd_env.h"
#include "ps_job.h"

namespace mercury {
namespace {

using pstest::Job;
using pstest::JobOptions;

TEST(PsControl, DeclareReadyInitRoundsAndBarrier) {
  Job job(JobOptions{});
  EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
  // Three of four ranks declared: no answer yet.
  for (uint32_t w = 0; w < 3; ++w) job.worker(w).declare();
  job.poll_until([] { return false; }, 0.2);
  for (uint32_t w = 0; w < 4; ++w) EXPECT_TRUE(job.worker(w).control().empty());
  EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
  job.worker(3).declare();
  ASSERT_TRUE(job.each_has_control(1));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  for (uint32_t w = 0; w < 4; ++w) {
    const agg::ControlMessage& m = job.worker(w).control()[0];
    ASSERT_EQ(m.kind, agg::ControlKind::kReady) << m.text;
    EXPECT_EQ(m.fingerprint, job.worker(w).table().fingerprint());
    EXPECT_EQ(m.shards, 2u);
  }

  // Rank 0's initial parameters, as version 0 at every worker, bit for bit.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> reference(job.decls().size());
  for (size_t t = 0; t < job.decls().size(); ++t) {
    for (float& p : job.worker(0).params()[t]) p = dist(rng);
    reference[t] = job.worker(0).params()[t];
  }
  job.worker(0).push_all(wire::PacketType::kInit, 0);
  ASSERT_TRUE(job.poll_until([&] {
    for (uint32_t w = 0; w < 4; ++w) {
      if (!job.worker(w).has_version(0)) return false;
    }
    return true;
  }));
  EXPECT_EQ(job.compare(reference, "initial parameters"), "");
  const uint64_t chunks = job.chunks();
  EXPECT_EQ(job.server().counters_st().shards.initialized, chunks);

  // Gradients of iteration 0 and 1 give versions 1 and 2, from those values.
  for (uint32_t r = 0; r < 2; ++r) ASSERT_EQ(job.round(r, reference, rng), "");

  // Barrier generation 1: not done until the last rank arrives.
  for (uint32_t w = 0; w < 3; ++w) job.worker(w).barrier(1);
  job.worker(1).barrier(1);  // sent twice
  job.poll_until([] { return false; }, 0.2);
  for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(job.worker(w).control().size(), 1u);
  job.worker(3).barrier(1);
  ASSERT_TRUE(job.each_has_control(2));
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(job.worker(w).control()[1].kind, agg::ControlKind::kBarrierDone);
    EXPECT_EQ(job.worker(w).control()[1].generation, 1u);
  }
  // A rank asking again about a finished generation is answered again.
  job.worker(2).barrier(1);
  ASSERT_TRUE(job.poll_until([&] { return job.worker(2).control().size() == 3; }));
  EXPECT_EQ(job.worker(2).control()[2].kind, agg::ControlKind::kBarrierDone);

  // Generations completing out of order (two trainer threads of a process in
  // barriers at once): generation 3 completes before 2; a rank arriving at 2
  // afterwards must not be answered as if 2 were done, and when 2 completes
  // every rank hears it.
  for (uint32_t w = 0; w < 4; ++w) job.worker(w).barrier(3);
  for (uint32_t w = 0; w < 3; ++w) job.worker(w).barrier(2);
  ASSERT_TRUE(job.poll_until([&] {
    for (uint32_t w = 0; w < 4; ++w) {
      if (job.worker(w).control().size() < (w == 2 ? 4u : 3u)) return false;
    }
    return true;
  }));
  job.poll_until([] { return false; }, 0.2);
  for (uint32_t w = 0; w < 4; ++w) {
    const auto& got = job.worker(w).control();
    ASSERT_EQ(got.size(), w == 2 ? 4u : 3u) << "rank " << w << ": generation 2 answered early";
    EXPECT_EQ(got.back().generation, 3u);
  }
  job.worker(3).barrier(2);
  ASSERT_TRUE(job.poll_until([&] {
    for (uint32_t w = 0; w < 4; ++w) {
      if (job.worker(w).control().size() < (w == 2 ? 5u : 4u)) return false;
    }
    return true;
  }));
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(job.worker(w).control().back().kind, agg::ControlKind::kBarrierDone);
    EXPECT_EQ(job.worker(w).control().back().generation, 2u);
  }
  const uint32_t declare_reply = 5;  // worker 1 holds 4 control messages here; the ready is its 5th

  // A declare repeated once running is answered ready again.
  job.worker(1).declare();
  ASSERT_TRUE(job.poll_until([&] { return job.worker(1).control().size() == declare_reply; }));
  EXPECT_EQ(job.worker(1).control().back().kind, agg::ControlKind::kReady);

  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.declares, 5u);
  EXPECT_EQ(c.control.declares_repeated, 1u);
  EXPECT_EQ(c.control.barriers, 14u);
  EXPECT_EQ(c.control.barriers_repeated, 2u);
  EXPECT_EQ(c.control.barriers_completed, 3u);
  EXPECT_EQ(c.shards.updates, chunks * 3);  // version 0, 1, 2 of every chunk
  EXPECT_EQ(c.shards.refused, 0u);
  EXPECT_EQ(c.held, 0u);
  for (size_t d = 0; d < server::kServerDropCount; ++d) {
    EXPECT_EQ(c.drops[d], 0u) << server::server_drop_name(static_cast<server::ServerDrop>(d));
  }
}

TEST(PsControl, MismatchedDeclareIsRefusedNamingTheTensor) {
  Job job(JobOptions{});
  std::vector<agg::TensorDecl> other = job.worker(2).table().declarations();
  other[5].elements += 64;
  for (uint32_t w = 0; w < 4; ++w) {
    if (w == 2) {
      job.worker(w).declare(other, 2);
    } else {
      job.worker(w).declare();
    }
  }
  ASSERT_TRUE(job.each_has_control(1));
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  const std::string& why = job.server().refusal_st();
  EXPECT_NE(why.find("rank 2"), std::string::npos) << why;
  EXPECT_NE(why.find(job.decls()[5].name), std::string::npos) << why;
  for (uint32_t w = 0; w < 4; ++w) {
    const agg::ControlMessage& m = job.worker(w).control()[0];
    EXPECT_EQ(m.kind, agg::ControlKind::kRefused);
    EXPECT_EQ(m.text, why);
  }
  // Gradients are not taken; a late declare is refused again.
  job.worker(0).push_all(wire::PacketType::kData, 0);
  job.worker(3).declare();
  ASSERT_TRUE(job.poll_until([&] { return job.worker(3).control().size() == 2; }));
  EXPECT_EQ(job.worker(3).control()[1].kind, agg::ControlKind::kRefused);
  ASSERT_TRUE(job.poll_until(
      [&] { return job.server().counters_st().drop(server::ServerDrop::kNotRunning) > 0; }));
}

TEST(PsControl, WrongRankIsRefusedAndTheJobWaits) {
  Job job(JobOptions{});
  job.worker(1).declare(job.worker(1).table().declarations(), 9);  // no rank 9
  ASSERT_TRUE(job.poll_until([&] { return job.worker(1).control().size() == 1; }));
  const agg::ControlMessage& m = job.worker(1).control()[0];
  EXPECT_EQ(m.kind, agg::ControlKind::kRefused);
  EXPECT_NE(m.text.find("w1 is rank 1"), std::string::npos) << m.text;
  EXPECT_NE(m.text.find("rank 9, which is not in this job"), std::string::npos) << m.text;
  EXPECT_EQ(job.server().state_st(), server::NodeState::kWaiting);
  // Rank 2 claiming to be rank 0 is refused too; the right declares start the job.
  job.worker(2).declare(job.worker(2).table().declarations(), 0);
  for (uint32_t w = 0; w < 4; ++w) job.worker(w).declare();
  ASSERT_TRUE(job.poll_until([&] {
    return job.worker(1).control().size() == 2 && job.worker(2).control().size() == 2 &&
           job.worker(0).control().size() == 1 && job.worker(3).control().size() == 1;
  }));
  EXPECT_EQ(job.worker(2).control()[0].kind, agg::ControlKind::kRefused);
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(job.worker(w).control().back().kind, agg::ControlKind::kReady);
  }
  EXPECT_EQ(job.server().counters_st().drop(server::ServerDrop::kWrongRank), 2u);
}

// A worker that dies once the job runs: the server's answer to it is never
// acknowledged, its transport gives up after the peer timeout, and the server
// ends the job for every rank with the reason (under BSP the others would
// otherwise wait for its gradients for ever).
TEST(PsControl, ALostWorkerEndsTheJobForEveryRank) {
  JobOptions o;
  o.server_peer_timeout_ms = 300;
  Job job(o);
  // Worker 3 declares, the server takes it, then worker 3 goes silent.
  job.worker(3).declare();
  ASSERT_TRUE(job.poll_until([&] { return job.server().counters_st().control.declares == 1; }));
  job.silence(3);
  for (uint32_t w = 0; w < 3; ++w) job.worker(w).declare();
  auto refused = [&](uint32_t w) {
    const auto& got = job.worker(w).control();
    return !got.empty() && got.back().kind == agg::ControlKind::kRefused;
  };
  ASSERT_TRUE(job.poll_until([&] { return refused(0) && refused(1) && refused(2); }, 10));
  for (uint32_t w = 0; w < 3; ++w) {
    const auto& got = job.worker(w).control();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].kind, agg::ControlKind::kReady);
    EXPECT_NE(got[1].text.find("worker w3 (rank 3) stopped answering"), std::string::npos)
        << got[1].text;
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
  EXPECT_EQ(job.server().counters_st().control.workers_lost, 1u);
  EXPECT_EQ(job.server().counters_st().control.declares_refused, 0u);
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
  for (uint32_t w = 0; w < 4; ++w) job.worker(w).barrier(7);
  ASSERT_TRUE(job.each_has_control(2));
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(job.worker(w).control()[1].kind, agg::ControlKind::kBarrierDone);
  }
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

TEST(PsControl, SecondServerNodeRunsItsShardsOnly) {
  // The node is server 1 of a job whose servers run 1 and 2 shards: it runs
  // global shards 1 and 2 of 3, drops packets of shard 0 as not ours, and
  // leaves the barrier to server 0.
  JobOptions o;
  o.job_shards = {1, 2};
  o.server_index = 1;
  Job job(o);
  for (uint32_t w = 0; w < 4; ++w) job.worker(w).declare();
  ASSERT_TRUE(job.each_has_control(1));
  ASSERT_EQ(job.worker(0).control()[0].kind, agg::ControlKind::kReady);
  EXPECT_EQ(job.worker(0).control()[0].shards, 3u);
  EXPECT_EQ(job.server().shard(0), nullptr);
  ASSERT_NE(job.server().shard(1), nullptr);
  ASSERT_NE(job.server().shard(2), nullptr);
  uint64_t theirs = 0;  // init packets for shard 0
  for (const agg::Partition& p : job.server().placement_st()->partitions()) {
    if (p.shard == 0) theirs += (p.bytes() + job.chunk_bytes() - 1) / job.chunk_bytes();
  }
  ASSERT_GT(theirs, 0u);
  job.worker(0).push_all(wire::PacketType::kInit, 0);
  job.worker(1).barrier(1);
  ASSERT_TRUE(job.poll_until([&] {
    const server::ServerCounters c = job.server().counters_st();
    return c.shards.initialized + c.drop(server::ServerDrop::kNotOurs) == job.chunks() &&
           c.drop(server::ServerDrop::kBarrierNotHere) == 1;
  }));
  EXPECT_EQ(job.server().counters_st().drop(server::ServerDrop::kNotOurs), theirs);
}

TEST(PsControl, BadJobShapesAreRefusedAtConstruction) {
  server::ServerNodeConfig sc;
  sc.chunk_bytes = 1408;
  sc.layout = job::ShardLayout::of({1, 2});
  sc.server_index = 2;
  EXPECT_THROW(server::ServerNode(std::vector<net::Interface*>{}, {}, sc, 0),
               std::invalid_argument);
  sc.layout = job::ShardLayout::of({1, 0});
  sc.server_index = 0;
  EXPECT_THROW(server::ServerNode(std::vector<net::Interface*>{}, {}, sc, 0),
               std::invalid_argument);
}

}  // namespace
}  // namespace mercury

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
