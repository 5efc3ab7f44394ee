// Membership on the node layer, without EAL (the harness of nodes_test.cpp):
// a worker process restarted in an asynchronous job joins it with every
// chunk's newest version and pushes on, under ssp from the slowest rank's
// step, so that the job ends with every rank at the same clock; a new
// process with another tensor
// list is refused alone, a BSP job that shrinks goes on without a lost rank,
// bit for bit as documented, and one that waits takes the rank's new process
// into the round in progress, bit for bit the unbroken run
// (docs/membership.md).
#include "server/nodes_harness.h"

namespace mercury {
namespace {

using namespace nodes_test;

// Rank 0 pushes every tensor once more, alone: under asp and psplus its
// answers carry every chunk's newest version, so its buffers then hold what
// the server holds.
std::string rank0_pushes_last(Nodes& job, uint32_t version) {
  Rank& w0 = job.rank(0);
  std::vector<worker::Handle> hs;
  for (uint32_t t = 0; t < w0.params.size(); ++t) {
    for (size_t i = 0; i < w0.grads[t].size(); ++i) w0.grads[t][i] = 0.001f * (i % 5);
    hs.push_back(w0.api().push_pull(t, w0.grads[t], w0.params[t]));
  }
  if (!job.wait(hs)) return "rank 0's push timed out";
  for (const worker::Handle& h : hs) {
    if (!h.ok()) return std::string(h.error());
  }
  // psplus's push_pull completes once the push is acknowledged: wait for the
  // version it made (asp's pull had it already).
  hs.clear();
  for (uint32_t t = 0; t < w0.params.size(); ++t) {
    hs.push_back(w0.api().pull(t, w0.params[t], version));
  }
  if (!job.wait(hs)) return "rank 0's pull timed out";
  for (const worker::Handle& h : hs) {
    if (!h.ok()) return std::string(h.error());
  }
  return "";
}

void joins_with_the_newest_versions(config::Sync sync) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .sync = sync});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(21);
  for (int round = 0; round < 2; ++round) ASSERT_EQ(job.push_round(rng), "");
  // Every chunk had 2 x 3 pushes and rank 0's last one applied.
  constexpr uint32_t kVersion = 7;
  ASSERT_EQ(rank0_pushes_last(job, kVersion), "");
  for (uint32_t t = 0; t < job.rank(0).params.size(); ++t) {
    ASSERT_EQ(job.rank(0).api().version(t), kVersion);
  }

  job.restart(2, 200);
  const worker::Handle started = job.rank(2).api().start_async();
  ASSERT_TRUE(job.wait({started}));
  ASSERT_TRUE(started.ok()) << started.error();
  worker::Worker& joined = job.rank(2).api();
  joined.start();  // returns at once: the handle is complete
  // It joins at the slowest rank's step (ranks 1 and 2 pushed twice), from
  // which its pushes count.
  ASSERT_EQ(joined.joined_version(), std::optional<uint32_t>(2u));
  EXPECT_EQ(joined.start_version(), 2u);
  // Its first pull holds the newest versions: rank 0's buffers, bit for bit.
  for (uint32_t t = 0; t < job.rank(0).params.size(); ++t) {
    EXPECT_EQ(joined.version(t), kVersion) << t;
    EXPECT_EQ(std::memcmp(job.rank(2).params[t].data(), job.rank(0).params[t].data(),
                          job.rank(0).params[t].size() * 4),
              0)
        << t;
  }
  server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.workers_removed, 1u);
  EXPECT_EQ(c.control.workers_joined, 1u);
  EXPECT_GT(c.shards.join_owed, 0u);
  EXPECT_GE(c.shards.eager_sent, c.shards.join_owed);  // each owed copy went
  // The others were told, once each (counted on their next publication).
  ASSERT_TRUE(job.run([&] { return job.rank(0).api().stats().workers_joined == 1; }, 100 * kMs));
  EXPECT_EQ(job.rank(1).api().stats().workers_joined, 1u);
  EXPECT_EQ(job.rank(0).api().stats().workers_removed, 1u);
  EXPECT_EQ(joined.stats().workers_joined, 0u);  // it is the one that joined
  // It pushes from the current versions on, its clocks from the slowest
  // rank's: nothing is refused as a replay, and it reads its own update.
  for (int round = 0; round < 2; ++round) ASSERT_EQ(job.push_round(rng), "");
  c = job.server().counters_st();
  EXPECT_EQ(c.table.count(agg::Outcome::kDuplicate), 0u);
  EXPECT_EQ(c.table.rejected(), 0u);
  for (uint32_t t = 0; t < job.rank(2).params.size(); ++t) {
    EXPECT_GT(joined.version(t), kVersion) << t;
  }
}

TEST(NodesMembership, ARestartedWorkerJoinsUnderAsp) {
  joins_with_the_newest_versions(config::Sync::kAsp);
}

TEST(NodesMembership, ARestartedWorkerJoinsUnderPsPlus) {
  joins_with_the_newest_versions(config::Sync::kPsPlus);
}

// Rank 2 of 3 dies at step 2 and is removed; ranks 0 and 1 train on to step
// 7, and a new process of rank 2 joins. It joins at step 7, the slowest
// rank's (not at the versions' 16, which 3 ranks' steps would make 5), and
// counts its pushes from there: every rank trains to step 10 and ends at
// clock 10 on every chunk, and the final barrier completes. Under ssp (bound
// 1) a newcomer whose step and clock differed by more than the bound held
// the others for ever at the end of a job (or was held itself).
void joins_at_the_slowest_ranks_step(config::Sync sync) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .sync = sync, .staleness_bound = sync == config::Sync::kSsp ? 1u : 0u});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(26);
  for (int step = 0; step < 2; ++step) ASSERT_EQ(job.push_round(rng), "");
  job.kill(2);
  ASSERT_TRUE(job.run([&] { return job.server().counters_st().control.workers_removed == 1; },
                      10'000 * kMs));
  for (int step = 2; step < 7; ++step) ASSERT_EQ(job.push_round(rng), "");  // ranks 0 and 1
  job.revive(2, 200);
  const worker::Handle started = job.rank(2).api().start_async();
  ASSERT_TRUE(job.wait({started}));
  ASSERT_TRUE(started.ok()) << started.error();
  worker::Worker& joined = job.rank(2).api();
  joined.start();
  ASSERT_EQ(joined.joined_version(), std::optional<uint32_t>(7u));
  EXPECT_EQ(joined.start_version(), 7u);  // its pushes count from there
  for (uint32_t t = 0; t < job.rank(2).params.size(); ++t) {
    EXPECT_EQ(joined.version(t), 2u * 3 + 5u * 2) << t;  // every chunk's newest
  }
  constexpr uint32_t kSteps = 10;
  for (uint32_t step = *joined.joined_version(); step < kSteps; ++step) {
    ASSERT_EQ(job.push_round(rng), "") << step;
  }
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 3; ++r) hs.push_back(job.rank(r).api().barrier_async());
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) EXPECT_TRUE(h.ok()) << h.error();
  for (uint32_t id : job.server().own_shards()) {
    const agg::ChunkTable& table = job.server().shard(id)->table();
    for (uint64_t i = 0; i < table.chunks(); ++i) {
      const std::span<const uint32_t> clocks = table.clocks(i);
      ASSERT_EQ(clocks.size(), 3u);
      for (uint32_t r = 0; r < 3; ++r) EXPECT_EQ(clocks[r], kSteps) << id << " " << i << " " << r;
    }
  }
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.table.count(agg::Outcome::kDuplicate), 0u);
  EXPECT_EQ(c.table.rejected(), 0u);
  EXPECT_EQ(c.control.workers_joined, 1u);
}

TEST(NodesMembership, ASspJoinGoesOnFromTheSlowestRanksStep) {
  joins_at_the_slowest_ranks_step(config::Sync::kSsp);
}

TEST(NodesMembership, AnAspJoinGoesOnFromTheSlowestRanksStep) {
  joins_at_the_slowest_ranks_step(config::Sync::kAsp);
}

TEST(NodesMembership, APsPlusJoinGoesOnFromTheSlowestRanksStep) {
  joins_at_the_slowest_ranks_step(config::Sync::kPsPlus);
}

TEST(NodesMembership, AJoinWithAnotherTensorListIsRefusedAlone) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .sync = config::Sync::kAsp});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(22);
  ASSERT_EQ(job.push_round(rng), "");
  job.restart(2, 200, /*odd=*/true);
  const worker::Handle started = job.rank(2).api().start_async();
  ASSERT_TRUE(job.wait({started}));
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.error().find("cannot join the running job: its tensor list differs"),
            std::string_view::npos)
      << started.error();
  // The job goes on with ranks 0 and 1.
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 2; ++r) {
    Rank& k = job.rank(r);
    for (uint32_t t = 0; t < k.params.size(); ++t) {
      hs.push_back(k.api().push_pull(t, k.grads[t], k.params[t]));
    }
  }
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) EXPECT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(c.control.workers_joined, 0u);
  EXPECT_EQ(c.control.workers_removed, 1u);
}

// A round in which rank 3 of 4 is lost: every rank's gradients drawn, the
// reference moved on (tensors 0 and 1 averaged over the 4 ranks, the others
// over the first `later` ranks: SGD at kLr), and rank 3's pushes of tensors
// 0 and 1, acknowledged (the server took them).
void lose_rank3_mid_round(Nodes& job, std::mt19937& rng, std::vector<std::vector<float>>& reference,
                          uint32_t later) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (uint32_t r = 0; r < 4; ++r) {
    for (auto& g : job.rank(r).grads) {
      for (float& x : g) x = dist(rng);
    }
  }
  for (size_t t = 0; t < reference.size(); ++t) {
    const uint32_t n = t < 2 ? 4 : later;
    const float inv_n = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < reference[t].size(); ++i) {
      float s = job.rank(0).grads[t][i];
      for (uint32_t k = 1; k < n; ++k) s = s + job.rank(k).grads[t][i];
      reference[t][i] = reference[t][i] - kLr * (s * inv_n);
    }
  }
  Rank& dying = job.rank(3);
  const std::vector<worker::Handle> hs = {dying.api().push(0, dying.grads[0]),
                                          dying.api().push(1, dying.grads[1])};
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) ASSERT_TRUE(h.ok()) << h.error();
}

// Ranks 0..ranks-1 push_pull every tensor (their gradients as drawn), into `hs`.
void push_pull_all(Nodes& job, uint32_t ranks, std::vector<worker::Handle>& hs) {
  for (uint32_t r = 0; r < ranks; ++r) {
    Rank& k = job.rank(r);
    for (uint32_t t = 0; t < k.params.size(); ++t) {
      hs.push_back(k.api().push_pull(t, k.grads[t], k.params[t]));
    }
  }
}

// training.on_worker_loss shrink: rank 3 of 4 dies in round 2 after the
// server took its gradients of tensors 0 and 1. Those sets keep them (an
// average over 4), tensors 2 and 3 average over the 3 others, and every
// later round too; every survivor holds that, bit for bit.
TEST(NodesMembership, ABspJobShrinksWithoutALostRank) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 4, .shrink = true});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(23);
  ASSERT_EQ(job.round(reference, rng), "");  // version 1, over 4
  // The round's reference: tensors 0 and 1 over the 4 ranks, 2 and 3 over 0..2.
  ASSERT_NO_FATAL_FAILURE(lose_rank3_mid_round(job, rng, reference, 3));
  job.kill(3);
  std::vector<worker::Handle> hs;
  push_pull_all(job, 3, hs);
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(job.compare(reference, "the round of the loss"), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  EXPECT_EQ(c.control.workers_lost, 1u);
  EXPECT_EQ(c.control.workers_removed, 1u);
  // Later rounds average over the 3 (Nodes::round over the ranks left).
  for (int round = 0; round < 2; ++round) ASSERT_EQ(job.round(reference, rng), "");
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(job.rank(r).api().stats().workers_removed, 1u) << r;
    for (uint32_t t = 0; t < job.rank(r).params.size(); ++t) {
      EXPECT_EQ(job.rank(r).api().version(t), 4u) << r << " " << t;
    }
  }
  EXPECT_EQ(job.server().counters_st().table.rejected(), 0u);
}

// training.on_worker_loss wait: rank 3 of 4 dies in round 2 after the
// server took its gradients of tensors 0 and 1, and a new process of it
// starts. It joins at version 1, the round in progress, with every chunk of
// version 1 (those of tensors 0 and 1 from the kept copies) and pushes the
// round's gradients again: those the server had are answered with version 2,
// not counted again, and every rank ends the round, and the later ones, with
// the unbroken run's parameters.
TEST(NodesMembership, ABspJobWaitsForALostRanksNewProcess) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 4, .wait_s = 30});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(24);
  ASSERT_EQ(job.round(reference, rng), "");  // version 1
  const std::vector<std::vector<float>> at_1 = reference;
  // The unbroken run's round: every tensor over the 4 ranks.
  ASSERT_NO_FATAL_FAILURE(lose_rank3_mid_round(job, rng, reference, 4));
  const std::vector<std::vector<float>> grads3 = job.rank(3).grads;
  std::vector<worker::Handle> hs;
  push_pull_all(job, 3, hs);
  // Rank 3's process dies; a new one starts (a new transport epoch).
  job.restart(3, 300);
  const worker::Handle started = job.rank(3).api().start_async();
  ASSERT_TRUE(job.wait({started}, 10'000 * kMs));
  ASSERT_TRUE(started.ok()) << started.error();
  Rank& back = job.rank(3);
  back.api().start();
  EXPECT_EQ(back.api().joined_version(), std::optional<uint32_t>(1u));
  EXPECT_EQ(back.api().start_version(), 1u);
  for (uint32_t t = 0; t < back.params.size(); ++t) {
    EXPECT_EQ(std::memcmp(back.params[t].data(), at_1[t].data(), at_1[t].size() * 4), 0) << t;
  }
  // It recomputes the round's gradients (the same bits) and pushes them all.
  back.grads = grads3;
  for (uint32_t t = 0; t < back.params.size(); ++t) {
    hs.push_back(back.api().push_pull(t, back.grads[t], back.params[t]));
  }
  ASSERT_TRUE(job.wait(hs));
  for (const worker::Handle& h : hs) ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(job.compare(reference, "the round of the loss"), "");
  const server::ServerCounters c = job.server().counters_st();
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRunning);
  EXPECT_EQ(c.control.workers_joined, 1u);
  EXPECT_EQ(c.control.workers_removed, 0u);
  EXPECT_GT(c.shards.join_owed, 0u);
  EXPECT_EQ(c.shards.fanout_lost, 0u);
  // Its pushes of tensors 0 and 1 again: refused as stale and answered, not counted twice.
  EXPECT_GT(c.table.count(agg::Outcome::kStale), 0u);
  EXPECT_EQ(c.shards.answered_again, c.table.count(agg::Outcome::kStale));
  for (int round = 0; round < 2; ++round) ASSERT_EQ(job.round(reference, rng), "");
  ASSERT_TRUE(job.run([&] { return job.rank(0).api().stats().workers_joined == 1; }, 100 * kMs));
  EXPECT_EQ(back.api().version(0), 4u);
}

// Under wait, a rank whose new process does not come within worker_wait_s
// ends the job for every rank, naming it.
TEST(NodesMembership, ABspJobThatWaitsEndsAfterTheLimit) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3, .wait_s = 2});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(25);
  ASSERT_EQ(job.round(reference, rng), "");
  job.kill(2);
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 2; ++r) {
    Rank& k = job.rank(r);
    hs.push_back(k.api().push_pull(0, k.grads[0], k.params[0]));
  }
  ASSERT_TRUE(job.wait(hs, 10'000 * kMs));
  for (const worker::Handle& h : hs) {
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.error().find("no new process of it joined within training.worker_wait_s 2 s"),
              std::string_view::npos)
        << h.error();
  }
  EXPECT_EQ(job.server().state_st(), server::NodeState::kRefused);
}

}  // namespace
}  // namespace mercury
