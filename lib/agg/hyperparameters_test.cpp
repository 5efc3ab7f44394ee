#include "agg/hyperparameters.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace mercury::agg {
namespace {

Hyperparameters lr(float v) { return Hyperparameters{.learning_rate = v}; }

HyperparameterTable table(SettingsMode mode = SettingsMode::kFromVersion) {
  return HyperparameterTable(OptimizerKind::kMomentum, false, lr(1.0f), mode);
}

TEST(AggHyperparameters, AChangeAppliesFromItsVersion) {
  HyperparameterTable t = table();
  EXPECT_EQ(t.at(0).learning_rate, 1.0f);
  EXPECT_EQ(t.at(1000).learning_rate, 1.0f);
  EXPECT_EQ(t.change(5, lr(0.5f), 3, 4), Change::kAdded);
  EXPECT_EQ(t.at(3).learning_rate, 1.0f);
  EXPECT_EQ(t.at(4).learning_rate, 1.0f);
  EXPECT_EQ(t.at(5).learning_rate, 0.5f);
  EXPECT_EQ(t.at(99).learning_rate, 0.5f);
  // Another change from the same version replaces it.
  EXPECT_EQ(t.change(5, lr(0.25f), 3, 4), Change::kReplaced);
  EXPECT_EQ(t.at(5).learning_rate, 0.25f);
  EXPECT_EQ(t.entries().size(), 2u);
}

TEST(AggHyperparameters, AChangeForAVersionAChunkHasPassedIsTooLate) {
  HyperparameterTable t = table();
  const uint64_t g = t.generation();
  // A chunk at version 7 has updated from 6: a change from 6 would split the shards.
  EXPECT_EQ(t.change(6, lr(0.5f), 6, 7), Change::kTooLate);
  EXPECT_EQ(t.generation(), g);
  EXPECT_EQ(t.at(6).learning_rate, 1.0f);
  EXPECT_EQ(t.change(7, lr(0.5f), 6, 7), Change::kAdded);  // from the newest chunk's version on
  EXPECT_EQ(t.at(6).learning_rate, 1.0f);
  EXPECT_EQ(t.at(7).learning_rate, 0.5f);
}

TEST(AggHyperparameters, ChangesScheduledAheadKeepTheirOrder) {
  HyperparameterTable t = table();
  EXPECT_EQ(t.change(10, lr(0.1f), 0, 0), Change::kAdded);
  EXPECT_EQ(t.change(7, lr(0.7f), 0, 0), Change::kAdded);  // before the one scheduled
  EXPECT_EQ(t.change(20, lr(0.2f), 0, 0), Change::kAdded);
  const float want[] = {1.0f, 1.0f, 0.7f, 0.7f, 0.1f, 0.1f, 0.2f};
  const uint32_t at[] = {0, 6, 7, 9, 10, 19, 20};
  for (size_t i = 0; i < std::size(at); ++i) EXPECT_EQ(t.at(at[i]).learning_rate, want[i]) << at[i];
}

TEST(AggHyperparameters, TheTableIsBoundedAndDropsWhatNoChunkNeeds) {
  HyperparameterTable t = table();
  // Every step of a schedule: the chunks reach each version before its change.
  for (uint32_t v = 1; v <= 100; ++v) {
    ASSERT_EQ(t.change(v, lr(1.0f / static_cast<float>(v)), v, v), Change::kAdded) << v;
    ASSERT_LE(t.entries().size(), 2u);
  }
  EXPECT_EQ(t.at(100).learning_rate, 0.01f);
  // Changes scheduled ahead of every chunk fill it; the next one is refused.
  HyperparameterTable ahead = table();
  for (uint32_t i = 1; i < HyperparameterTable::kCapacity; ++i) {
    ASSERT_EQ(ahead.change(10 * i, lr(0.5f), 0, 0), Change::kAdded) << i;
  }
  EXPECT_EQ(ahead.change(1000, lr(0.5f), 0, 0), Change::kFull);
  EXPECT_EQ(ahead.change(10, lr(0.25f), 0, 0), Change::kReplaced);  // no room needed
  // Once the chunks pass the first scheduled changes, their room is free again.
  EXPECT_EQ(ahead.change(1000, lr(0.125f), 25, 25), Change::kAdded);
  EXPECT_EQ(ahead.entries().front().from, 20u);  // the one in effect at 25 stays
  EXPECT_EQ(ahead.at(25).learning_rate, 0.5f);
  EXPECT_EQ(ahead.at(1000).learning_rate, 0.125f);
}

TEST(AggHyperparameters, InvalidValuesAreRefusedAndChangeNothing) {
  HyperparameterTable t = table();
  EXPECT_EQ(t.change(3, lr(-1.0f), 0, 0), Change::kInvalid);
  EXPECT_EQ(t.change(3, Hyperparameters{.momentum = 1.5f}, 0, 0), Change::kInvalid);
  EXPECT_EQ(t.entries().size(), 1u);
  EXPECT_THROW(
      HyperparameterTable(OptimizerKind::kAdam, false, {.beta1 = 1.0f}, SettingsMode::kFromVersion),
      std::invalid_argument);
  EXPECT_THROW(ShardOptimizer({.kind = OptimizerKind::kSgd, .decoupled_weight_decay = true},
                              SettingsMode::kFromVersion),
               std::invalid_argument);
}

TEST(AggHyperparameters, AsynchronousModesApplyAChangeFromTheNextUpdate) {
  HyperparameterTable t = table(SettingsMode::kNextUpdate);
  EXPECT_EQ(t.change(40, lr(0.5f), 30, 50), Change::kReplaced);  // no version is too late
  EXPECT_EQ(t.at(0).learning_rate, 0.5f);
  EXPECT_EQ(t.at(49).learning_rate, 0.5f);
  EXPECT_EQ(t.change(0, lr(0.25f), 30, 50), Change::kReplaced);
  EXPECT_EQ(t.at(60).learning_rate, 0.25f);
  EXPECT_EQ(t.entries().size(), 1u);
}

TEST(AggHyperparameters, VersionsCompareSerially) {
  HyperparameterTable t = table();
  const uint32_t near_end = UINT32_MAX - 4;
  const HyperparameterTable::Entry late[] = {{.from = near_end, .values = lr(0.5f)}};
  t.restore(late);  // a job 4 billion versions in
  ASSERT_EQ(t.change(3, lr(0.25f), near_end, near_end), Change::kAdded);  // after the wrap
  EXPECT_EQ(t.at(near_end).learning_rate, 0.5f);
  EXPECT_EQ(t.at(UINT32_MAX).learning_rate, 0.5f);
  EXPECT_EQ(t.at(2).learning_rate, 0.5f);
  EXPECT_EQ(t.at(3).learning_rate, 0.25f);
  EXPECT_EQ(t.change(UINT32_MAX, lr(0.1f), 2, 2), Change::kTooLate);
}

TEST(AggHyperparameters, RestoreTakesACheckpointsEntriesOrRefusesThem) {
  HyperparameterTable t = table();
  const std::vector<HyperparameterTable::Entry> good = {{.from = 4, .values = lr(0.5f)},
                                                        {.from = 9, .values = lr(0.25f)}};
  t.restore(good);
  EXPECT_EQ(std::vector(t.entries().begin(), t.entries().end()), good);
  EXPECT_EQ(t.at(8).learning_rate, 0.5f);
  const std::vector<HyperparameterTable::Entry> unsorted = {{.from = 9, .values = lr(0.5f)},
                                                            {.from = 4, .values = lr(0.25f)}};
  EXPECT_THROW(t.restore(unsorted), std::invalid_argument);
  const std::vector<HyperparameterTable::Entry> bad = {{.from = 0, .values = lr(-1.0f)}};
  EXPECT_THROW(t.restore(bad), std::invalid_argument);
  EXPECT_THROW(t.restore({}), std::invalid_argument);
  HyperparameterTable async = table(SettingsMode::kNextUpdate);
  EXPECT_THROW(async.restore(good), std::invalid_argument);
  EXPECT_EQ(std::vector(t.entries().begin(), t.entries().end()), good);  // unchanged by refusals
}

// The scalars follow the version's entry and are recomputed when the entry
// changes under the same version, as a cached lookup could miss.
TEST(AggHyperparameters, StepForFollowsTheEntryInEffect) {
  ShardOptimizer o({.kind = OptimizerKind::kAdam, .learning_rate = 0.5f},
                   SettingsMode::kFromVersion);
  auto same = [](const StepParams& a, const StepParams& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  };
  const Hyperparameters first = o.hyperparameters().at(0);
  EXPECT_TRUE(
      same(o.step_for(0, 4, 1, 1.0f), step_params(OptimizerKind::kAdam, false, first, 4, 1, 1.0f)));
  const Hyperparameters later{.learning_rate = 0.125f, .weight_decay = 0.5f, .beta1 = 0.5f};
  ASSERT_EQ(o.hyperparameters().change(1, later, 1, 1), Change::kAdded);
  EXPECT_TRUE(
      same(o.step_for(1, 4, 2, 1.0f), step_params(OptimizerKind::kAdam, false, later, 4, 2, 1.0f)));
  // A chunk still at version 0 (ASP-like lag) gets the first settings.
  EXPECT_TRUE(
      same(o.step_for(0, 4, 1, 1.0f), step_params(OptimizerKind::kAdam, false, first, 4, 1, 1.0f)));
  const Hyperparameters replaced{.learning_rate = 0.0625f};
  ASSERT_EQ(o.hyperparameters().change(1, replaced, 1, 1), Change::kReplaced);
  EXPECT_TRUE(same(o.step_for(1, 4, 2, 1.0f),
                   step_params(OptimizerKind::kAdam, false, replaced, 4, 2, 1.0f)));
  EXPECT_TRUE(same(o.step_for(1, 4, 2, 0.5f),
                   step_params(OptimizerKind::kAdam, false, replaced, 4, 2, 0.5f)));
}

}  // namespace
}  // namespace mercury::agg
