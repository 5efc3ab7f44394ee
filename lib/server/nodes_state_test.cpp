// Settings and the job's state on the node layer, without EAL (the harness
// of nodes_test.cpp): rank 0's hyperparameters applied by every shard from
// its next push on, and another rank's left alone; a job's state pulled
// from the servers and a new job resumed from it on rank 0 going on bit for
// bit as the job that never stopped, under momentum and AdamW; the average
// and rank 0 update rules beside the optimizer; what does not fit refused.
#include "agg/shard_state.h"
#include "server/nodes_harness.h"

namespace mercury {
namespace {

using namespace nodes_test;

worker::Hyperparameters with_lr(worker::Worker& w, float lr) {
  worker::Hyperparameters h = w.hyperparameters();
  h.learning_rate = lr;
  return h;
}

TEST(NodesState, RankZerosSettingsApplyFromItsNextPushOnEveryShard) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 3});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(11);
  ASSERT_EQ(job.round(reference, rng), "");
  // Another rank's change is its own business: recorded, not sent.
  const worker::Handle other =
      job.rank(1).api().set_hyperparameters(with_lr(job.rank(1).api(), 4.0f));
  EXPECT_TRUE(other.ok());
  EXPECT_EQ(job.rank(1).api().hyperparameters().learning_rate, 4.0f);
  const worker::Handle set =
      job.rank(0).api().set_hyperparameters(with_lr(job.rank(0).api(), 0.125f));
  ASSERT_TRUE(job.wait({set}));
  ASSERT_TRUE(set.ok()) << set.error();
  EXPECT_EQ(job.rank(0).api().hyperparameters().learning_rate, 0.125f);
  for (int round = 0; round < 2; ++round) ASSERT_EQ(job.round(reference, rng, 0.125f), "");
  EXPECT_EQ(job.server().counters_st().control.settings, 1u);
  // Values the optimizer cannot take are refused before they leave.
  EXPECT_THROW(job.rank(0).api().set_hyperparameters(with_lr(job.rank(0).api(), -1.0f)),
               worker::UsageError);
}

// A change sent while rank 0's pushes are already queued, on links that
// lose and reorder packets: rank 0's pushes of the version it applies from
// wait for every server's answer, so no chunk is updated at the old rate
// (the other rank's pushes, sent before it, are held by the servers).
TEST(NodesState, PushesQueuedBehindSettingsWaitForThem) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .impair = {.loss = 0.3, .reorder = 0.05}});
  ASSERT_EQ(job.start(reference), "");
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int round = 0; round < 6; ++round) {
    const float lr = 0.5f / static_cast<float>(1 << round);
    std::vector<worker::Handle> hs;
    for (uint32_t r : {1u, 0u}) {
      Rank& k = job.rank(r);
      if (r == 0) hs.push_back(k.api().set_hyperparameters(with_lr(k.api(), lr)));
      for (uint32_t t = 0; t < k.params.size(); ++t) {
        for (float& g : k.grads[t]) g = dist(rng);
        hs.push_back(k.api().push_pull(t, k.grads[t], k.params[t]));
      }
    }
    ASSERT_TRUE(job.wait(hs));
    for (const worker::Handle& h : hs) ASSERT_TRUE(h.ok()) << h.error();
    for (size_t t = 0; t < reference.size(); ++t) {
      for (size_t i = 0; i < reference[t].size(); ++i) {
        const float s = job.rank(0).grads[t][i] + job.rank(1).grads[t][i];
        reference[t][i] = reference[t][i] - lr * (s * 0.5f);
      }
    }
    ASSERT_EQ(job.compare(reference, "round " + std::to_string(round)), "");
  }
  EXPECT_GT(job.server().counters_st().net.tx_retransmits, 0u);
}

// Resumes `state` on a new job of the same kind: every rank's buffers hold
// the state's parameters and its version is every rank's start.
std::string resume(Nodes& job, const std::vector<std::byte>& state, uint32_t version) {
  job.rank(0).api().resume_from(state);
  std::vector<worker::Handle> hs;
  for (uint32_t r = 0; r < 3; ++r) hs.push_back(job.rank(r).api().start_async());
  if (!job.wait(hs)) return "the resumed start timed out";
  for (const worker::Handle& h : hs) {
    if (!h.ok()) return std::string(h.error());
  }
  for (uint32_t r = 0; r < 3; ++r) {
    job.rank(r).api().start();  // done: returns at once
    if (job.rank(r).api().start_version() != version) return "rank's start version differs";
  }
  return "";
}

std::vector<std::byte> pull_state(Nodes& job, uint32_t rank) {
  std::vector<std::byte> state;
  const worker::Handle h = job.rank(rank).api().server_state_async(state);
  EXPECT_TRUE(job.wait({h}));
  EXPECT_TRUE(h.ok()) << h.error();
  return state;
}

// 4 rounds straight, against 2 rounds, a checkpoint pulled by rank 1, every
// process gone, a new job resumed from it on rank 0 and 2 more rounds: the
// same parameters bit for bit, with a rate change at round 2 in both.
TEST(NodesState, ACheckpointResumesBitExact) {
  for (const agg::OptimizerConfig& opt :
       {agg::OptimizerConfig{
            .kind = agg::OptimizerKind::kMomentum, .learning_rate = 0.05f, .momentum = 0.9f},
        agg::OptimizerConfig{.kind = agg::OptimizerKind::kAdam,
        .learning_rate = 0.01f,
        .weight_decay = 0.1f,
        .decoupled_weight_decay = true}}) {
    SCOPED_TRACE(std::string(agg::optimizer_name(opt.kind)));
    const Options o{.workers = 3, .optimizer = opt};
    std::vector<std::vector<float>> straight;
    {
      std::vector<std::vector<float>> initial;
      Nodes job(o);
      ASSERT_EQ(job.start(initial), "");
      std::mt19937 rng(21);
      for (int round = 0; round < 4; ++round) {
        if (round == 2) {
          const worker::Handle h =
              job.rank(0).api().set_hyperparameters(with_lr(job.rank(0).api(), 0.02f));
          ASSERT_TRUE(job.wait({h}));
        }
        ASSERT_EQ(job.push_round(rng), "");
      }
      straight = job.rank(0).params;
    }
    std::vector<std::byte> state;
    std::vector<std::vector<float>> half;
    std::mt19937 rng(21);
    {
      std::vector<std::vector<float>> initial;
      Nodes job(o);
      ASSERT_EQ(job.start(initial), "");
      for (int round = 0; round < 2; ++round) ASSERT_EQ(job.push_round(rng), "");
      const worker::Handle h =
          job.rank(0).api().set_hyperparameters(with_lr(job.rank(0).api(), 0.02f));
      ASSERT_TRUE(job.wait({h}));
      state = pull_state(job, 1);
      half = job.rank(1).params;
      // The state file holds every chunk at version 2.
      EXPECT_EQ(
          agg::check_state(state, *job.server().placement_st(), job.server().config().chunk_bytes,
                           opt.kind, opt.decoupled_weight_decay)
              .version,
          2u);
      EXPECT_GE(job.server().counters_st().control.state_pages, 2u);  // one per shard at least
    }
    Nodes job(o);
    ASSERT_EQ(resume(job, state, 2), "");
    EXPECT_EQ(job.compare(half, "the resumed parameters"), "");
    const server::ServerCounters c = job.server().counters_st();
    EXPECT_GE(c.control.seed_pages, 1u);
    EXPECT_EQ(c.drop(server::ServerDrop::kInitResumed), 0u);
    for (int round = 2; round < 4; ++round) ASSERT_EQ(job.push_round(rng), "");
    EXPECT_EQ(job.compare(straight, "the resumed run"), "");
    EXPECT_EQ(job.rank(2).api().version(0), 4u);
  }
}

// BatchNorm's statistics beside the optimizer's parameters: one tensor
// averaged, one taken from rank 0, the others SGD's.
TEST(NodesState, AveragedAndRank0TensorsBesideTheOptimizer) {
  std::vector<agg::TensorDecl> model = kModel;
  model.push_back({"bn.running_mean", 100, 4, wire::Dtype::kFloat32, agg::UpdateRule::kAverage});
  model.push_back({"bn.running_var", 2000, 5, wire::Dtype::kFloat32, agg::UpdateRule::kRank0});
  std::vector<std::vector<float>> initial;
  Nodes job({.workers = 3, .model = model});
  ASSERT_EQ(job.start(initial), "");
  std::mt19937 rng(31);
  ASSERT_EQ(job.push_round(rng), "");
  for (uint32_t r = 0; r < 3; ++r) {
    const Rank& k = job.rank(r);
    for (size_t i = 0; i < 100; ++i) {
      const float s = (job.rank(0).grads[4][i] + job.rank(1).grads[4][i]) + job.rank(2).grads[4][i];
      ASSERT_EQ(k.params[4][i], s * (1.0f / 3.0f)) << r << " " << i;
    }
    EXPECT_EQ(std::memcmp(k.params[5].data(), job.rank(0).grads[5].data(), 2000 * 4), 0) << r;
    const float s0 = (job.rank(0).grads[0][0] + job.rank(1).grads[0][0]) + job.rank(2).grads[0][0];
    EXPECT_EQ(k.params[0][0], initial[0][0] - kLr * (s0 * (1.0f / 3.0f))) << r;
  }
}

TEST(NodesState, AStateThatDoesNotFitIsRefusedAtStart) {
  std::vector<std::byte> state;
  {
    std::vector<std::vector<float>> initial;
    Nodes job({.workers = 3});
    ASSERT_EQ(job.start(initial), "");
    state = pull_state(job, 0);
  }
  // The same tensors, one with another rule: another job.
  std::vector<agg::TensorDecl> model = kModel;
  model[3].update = agg::UpdateRule::kRank0;
  Nodes job({.workers = 3, .model = model});
  job.rank(0).api().resume_from(state);
  try {
    job.rank(0).api().start_async();
    FAIL() << "a state of another job was accepted";
  } catch (const worker::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("another job"), std::string::npos) << e.what();
  }
  // Torn: its last byte gone.
  Nodes other({.workers = 3});
  state.pop_back();
  other.rank(0).api().resume_from(state);
  EXPECT_THROW(other.rank(0).api().start_async(), worker::UsageError);
}

// ASP: a change applies from each chunk's next update.
TEST(NodesState, SettingsUnderAspApplyFromTheNextUpdate) {
  std::vector<std::vector<float>> reference;
  Nodes job({.workers = 2, .sync = config::Sync::kAsp});
  ASSERT_EQ(job.start(reference), "");
  Rank& w0 = job.rank(0);
  const worker::Handle set = w0.api().set_hyperparameters(with_lr(w0.api(), 0.5f));
  ASSERT_TRUE(job.wait({set}));
  ASSERT_TRUE(set.ok()) << set.error();
  for (size_t i = 0; i < w0.grads[2].size(); ++i) w0.grads[2][i] = static_cast<float>(i % 5) - 2;
  const worker::Handle pushed = w0.api().push_pull(2, w0.grads[2], w0.params[2]);
  ASSERT_TRUE(job.wait({pushed}));
  ASSERT_TRUE(pushed.ok()) << pushed.error();
  for (size_t i = 0; i < w0.params[2].size(); ++i) {
    ASSERT_EQ(w0.params[2][i], reference[2][i] - 0.5f * w0.grads[2][i]) << i;
  }
  EXPECT_THROW(w0.api().resume_from({}), worker::UsageError);  // bsp only
}

}  // namespace
}  // namespace mercury
