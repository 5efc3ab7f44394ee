// The synchronisation modes as state machines, with no port and no clock
// but the order of the steps: one server shard's chunk table (lib/agg) whose
// updates go through the fan-out rules (fanout.h) into each worker's
// PullTracker (lib/worker), exactly as Shard and the net core chain them,
// minus the transport. Scripted pushes check who receives what, the
// answers a worker counts, the slowest clock it learns (SSP's wait), and that
// the staleness a worker computes for a push is the one the server records.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/sync_policy.h"
#include "server/fanout.h"
#include "worker/pull_tracker.h"
#include "worker/tensor_table.h"

namespace mercury::server {
namespace {

constexpr uint32_t kChunkBytes = 64;  // 16 floats: the tensor below is 3 chunks
constexpr uint32_t kElements = 40;

// One worker's side: its declared buffer, table and tracker.
struct Side {
  std::vector<float> params = std::vector<float>(kElements, -1.0f);
  worker::TensorTable table;
  std::unique_ptr<worker::PullTracker> tracker;
  uint32_t base = 0;   // the version its last pull delivered
  uint32_t clock = 0;  // its pushes so far
  Side() {
    table.declare("w", params);
    table.freeze(1, kChunkBytes);
    tracker = std::make_unique<worker::PullTracker>(
        table, worker::PullTrackerConfig{.window = 2, .first_version = 0, .async = true});
  }
};

// The shard: its table and the fan-out into the workers' trackers.
struct Modes : agg::ChunkSink {
  Fanout rule;
  uint32_t bound = 0;  // kSlowest's staleness bound
  SspAnswers ssp;
  std::vector<Side> sides;
  std::unique_ptr<agg::ChunkTable> table;
  std::vector<agg::Update> updates;  // every one applied (data not kept)
  std::vector<uint64_t> sent_to;     // per update: its recipients

  Modes(Fanout r, std::unique_ptr<agg::SyncPolicy> policy, uint32_t workers, uint32_t b = 0)
      : rule(r), bound(b), sides(workers) {
    agg::ShardConfig c;
    c.workers = workers;
    c.chunk_bytes = kChunkBytes;
    c.optimizer = {.kind = agg::OptimizerKind::kSgd, .learning_rate = 0.5f};
    table =
        std::make_unique<agg::ChunkTable>(sides[0].table.placement(), c, std::move(policy), *this);
    ssp.reset(chunks(), workers);
    std::vector<float> init(kElements);
    for (uint32_t i = 0; i < kElements; ++i) init[i] = static_cast<float>(i);
    table->initialize_block(key(), init);
  }
  uint32_t key() const { return sides[0].table.blocks(0)[0].key; }
  uint32_t chunks() const { return sides[0].table.tensor(0).chunks; }

  void on_update(const agg::Update& u) override {
    const SspAnswers::Route route = fanout_route(rule, ssp, u, u.offset / kChunkBytes,
                                                 static_cast<uint32_t>(sides.size()), bound);
    updates.push_back(u);
    sent_to.push_back(route.to);
    for (uint64_t left = route.first; left != 0; left &= left - 1) {
      sides[std::countr_zero(left)].tracker->deliver_async_st(
          u.key, u.offset, u.version, fanout_tag(u.slowest, true),
          std::span<const std::byte>(u.data, u.bytes));
    }
    for (uint16_t r = 0; r < sides.size(); ++r) {
      if (((route.to >> r) & 1) == 0) continue;
      sides[r].tracker->deliver_async_st(u.key, u.offset, u.version,
                                         fanout_tag(u.slowest, ((route.yours >> r) & 1) != 0),
                                         std::span<const std::byte>(u.data, u.bytes));
    }
  }
  void release(void* const*, uint32_t) override {}

  // Worker `rank` pushes a gradient of ones from its base, as its net core
  // would: every chunk, the base as `iteration`, its clock. Returns the
  // staleness it computes for the push.
  uint32_t push(uint16_t rank) {
    Side& s = sides[rank];
    const uint32_t stale = s.tracker->staleness_st(0, s.base);
    static const std::vector<float> ones(kElements, 1.0f);
    for (uint32_t j = 0; j < chunks(); ++j) {
      const uint32_t offset = j * kChunkBytes;
      const uint32_t bytes = std::min(kChunkBytes, kElements * 4 - offset);
      const agg::Outcome o = table->contribute(
          agg::Contribution{.key = key(),
                            .offset = offset,
                            .iteration = s.base,
                            .rank = rank,
                            .clock = s.clock,
                            .data = reinterpret_cast<const std::byte*>(ones.data()) + offset,
                            .bytes = bytes,
                            .token = &s});
      EXPECT_EQ(o, agg::Outcome::kApplied) << "rank " << rank;
    }
    ++s.clock;
    return stale;
  }
  // Worker `rank` completes a pull: its base is what it holds now.
  void pull(uint16_t rank) { sides[rank].base = sides[rank].tracker->least_version_st(0); }
};

TEST(ServerModes, AspAnswersOnlyTheContributor) {
  Modes m(Fanout::kContributor, agg::make_asp(), 3);
  ASSERT_EQ(m.chunks(), 3u);
  for (Side& s : m.sides) EXPECT_EQ(s.tracker->awaited_st(0), 1u);  // version 0 went to all
  m.push(0);
  m.push(2);
  EXPECT_EQ(m.sides[0].tracker->answers_st(0), 3u);
  EXPECT_EQ(m.sides[1].tracker->answers_st(0), 0u);
  EXPECT_EQ(m.sides[2].tracker->answers_st(0), 3u);
  // Rank 1 saw nothing after version 0; rank 2's copy carries rank 0's update too.
  EXPECT_EQ(m.sides[1].tracker->least_version_st(0), 0u);
  EXPECT_EQ(m.sides[0].tracker->least_version_st(0), 1u);
  EXPECT_EQ(m.sides[2].tracker->least_version_st(0), 2u);
  EXPECT_EQ(m.sides[2].params[0], 0.0f - 0.5f - 0.5f);
  for (size_t i = 3; i < m.updates.size(); ++i) {
    EXPECT_EQ(std::popcount(m.sent_to[i]), 1) << i;  // one recipient per update
  }
}

TEST(ServerModes, SspTellsTheWorkerAheadWhenTheSlowestMoves) {
  Modes m(Fanout::kSlowest, agg::make_asp(), 2, 1);
  // Rank 0 runs two pushes ahead: the slowest (rank 1) has pushed nothing,
  // so only rank 0 hears of them, and it learns that the slowest is at 0.
  m.push(0);
  m.pull(0);
  m.push(0);
  EXPECT_EQ(m.sides[0].tracker->least_slowest_st(0), 0u);
  EXPECT_EQ(m.sides[1].tracker->least_version_st(0), 0u);
  // SSP with bound 1: rank 0, about to compute its iteration 2, needs the
  // slowest at >= 1: it would wait here. Rank 1 pushes: the slowest moves,
  // and both hear it (rank 1 its own answer).
  m.push(1);
  EXPECT_EQ(m.sides[0].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[1].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[1].tracker->least_version_st(0), 3u);
  EXPECT_EQ(m.sides[0].tracker->answers_st(0), 6u);  // two pushes x 3 chunks
  EXPECT_EQ(m.sides[1].tracker->answers_st(0), 3u);  // its own, not rank 0's
}

TEST(ServerModes, SspCopiesTheMoveOnlyToTheRanksItHeldBack) {
  // Three workers, bound 2. Rank 0 is three pushes ahead, rank 2 two, rank 1
  // (the slowest) none: rank 0, about to compute iteration 3, waits for a
  // slowest clock of 1; rank 2 (iteration 2, needs 0) does not wait.
  Modes m(Fanout::kSlowest, agg::make_asp(), 3, 2);
  for (int i = 0; i < 3; ++i) {
    m.push(0);
    m.pull(0);
  }
  m.push(2);
  m.pull(2);
  m.push(2);
  const size_t before = m.updates.size();
  EXPECT_EQ(m.sides[0].tracker->least_slowest_st(0), 0u);
  EXPECT_EQ(m.sides[2].tracker->least_slowest_st(0), 0u);
  // Rank 1 pushes: the slowest moves to 1. Its own answer, and a copy for
  // rank 0, which now may go on; none for rank 2, which learns the clock
  // with its next answer.
  m.push(1);
  ASSERT_EQ(m.updates.size(), before + 3);
  for (size_t i = before; i < m.updates.size(); ++i) {
    EXPECT_EQ(m.updates[i].slowest, 1u) << i;
    EXPECT_EQ(m.sent_to[i], 0b011u) << i;
  }
  EXPECT_EQ(m.sides[0].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[1].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[2].tracker->least_slowest_st(0), 0u);
  EXPECT_EQ(m.sides[2].tracker->answers_st(0), 6u);  // its two pushes, nothing more
  m.pull(2);
  m.push(2);
  EXPECT_EQ(m.sides[2].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[2].tracker->least_version_st(0), 7u);  // every push so far applied
}

TEST(ServerModes, SspSendsAWorkerNotHeldBackOnlyItsOwnAnswers) {
  // Bound 2, nobody held back: as under asp, each update goes to its
  // contributor alone, also the one that completes a round of every rank.
  Modes m(Fanout::kSlowest, agg::make_asp(), 3, 2);
  for (uint16_t round = 1; round <= 2; ++round) {
    const size_t before = m.updates.size();
    for (uint16_t r : {0, 2, 1}) m.push(r);
    for (size_t i = before; i < m.updates.size(); ++i) {
      EXPECT_EQ(m.sent_to[i], m.updates[i].contributors) << i;
    }
    for (uint16_t r = 0; r < 3; ++r) m.pull(r);
  }
  // Rank 1 pushed last: it holds the state after every push.
  EXPECT_EQ(m.sides[1].tracker->least_version_st(0), 6u);
  EXPECT_EQ(m.sides[0].tracker->least_version_st(0), 4u);
  EXPECT_EQ(m.sides[1].tracker->least_slowest_st(0), 2u);
}

TEST(ServerModes, PsPlusSendsEveryVersionAndTheStalenessesAgree) {
  Modes m(Fanout::kEveryVersion, agg::make_staleness_scaled(), 2);
  // Rank 0 pushes from version 0: nothing happened since, staleness 0.
  EXPECT_EQ(m.push(0), 0u);
  // Both hear version 1 at once (the eager pull); rank 1 has not pulled, so
  // its gradient is from version 0, one version behind what it holds.
  EXPECT_EQ(m.sides[1].tracker->least_version_st(0), 1u);
  EXPECT_EQ(m.push(1), 1u);
  // Rank 0 pulls (version 2), rank 1 pushes again from its stale base 0.
  m.pull(0);
  EXPECT_EQ(m.push(1), 2u);
  EXPECT_EQ(m.push(0), 1u);
  // The server recorded, chunk by chunk, the staleness each worker computed.
  const uint32_t want[] = {0, 1, 2, 1};
  ASSERT_EQ(m.updates.size(), 3u + 4u * 3u);  // version 0, then 4 pushes of 3 chunks
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(m.updates[3 + i].staleness, want[i / 3]) << i;
    EXPECT_EQ(m.sent_to[3 + i], 3u) << i;  // both workers
  }
  // And scaled the step by it: 0 - 0.5 (s 0) - 0.25 (s 1) - 0.5/3 (s 2) - 0.25 (s 1).
  const float want_p = (((0.0f - 0.5f) - 0.25f) - 0.5f * (1.0f / 3.0f)) - 0.25f;
  EXPECT_EQ(m.table->parameters(m.key())[0], want_p);
  EXPECT_EQ(m.sides[0].params[0], want_p);
  EXPECT_EQ(m.sides[1].params[0], want_p);
}

TEST(ServerModes, TheRulesOneByOne) {
  agg::Update u;
  u.version = 4;
  u.contributors = 0b111;
  EXPECT_EQ(fanout_recipients(Fanout::kEvery, u, 3), 0b111u);
  u.contributors = 0b10;
  EXPECT_EQ(fanout_recipients(Fanout::kContributor, u, 3), 0b10u);
  EXPECT_EQ(fanout_recipients(Fanout::kEveryVersion, u, 3), 0b111u);
  // kSlowest: the contributor alone (SspAnswers holds and releases answers);
  // its packet says the slowest clock, and whose push it answers.
  u.slowest = 2;
  u.clock = 2;
  EXPECT_EQ(fanout_recipients(Fanout::kSlowest, u, 3), 0b10u);
  EXPECT_EQ(fanout_recipients(Fanout::kSlowest, u, 64), 0b10u);
  EXPECT_EQ(fanout_tag(u, 1), 2u | wire::kAggYours);
  EXPECT_EQ(fanout_tag(u, 0), 2u);
}

// SspAnswers on its own: one chunk, three ranks, bound 1; each update as the
// table would report it (the ranks' clocks after it, the slowest clock).
TEST(ServerModes, SspOwesTheAnswerWhileTheSlowestHoldsTheWorkerBack) {
  SspAnswers a;
  a.reset(1, 3);
  uint32_t clocks[3] = {0, 0, 0};
  auto update = [&](uint32_t rank) {
    ++clocks[rank];
    agg::Update u;
    u.version = clocks[0] + clocks[1] + clocks[2];
    u.contributors = uint64_t{1} << rank;
    u.clock = clocks[rank];
    u.slowest = std::min({clocks[0], clocks[1], clocks[2]});
    u.clocks = clocks;
    return a.route(u, 0, 1);
  };
  // Rank 0's first push needs a slowest clock of 0: answered.
  SspAnswers::Route r = update(0);
  EXPECT_EQ(r.to, 0b001u);
  EXPECT_EQ(r.yours, 0b001u);
  // Its second needs 1 while the slowest is 0: owed, nothing sent.
  r = update(0);
  EXPECT_EQ(r.to, 0u);
  EXPECT_EQ(a.owed(), 1u);
  // Rank 2 pushes: the slowest (rank 1) still at 0, rank 2's need is 0.
  r = update(2);
  EXPECT_EQ(r.to, 0b100u);
  EXPECT_EQ(a.owed(), 1u);
  // Rank 1 pushes: the slowest clock is 1: rank 0's answer goes with it;
  // rank 2, level with the new clock but not needing it, gets nothing.
  r = update(1);
  EXPECT_EQ(r.to, 0b011u);
  EXPECT_EQ(r.yours, 0b011u);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(a.owed(), 0u);
  // Rank 0 pushes twice without pulling: its owed answer goes apart, first.
  r = update(0);  // clock 3 needs 2: owed
  EXPECT_EQ(r.to, 0u);
  r = update(0);  // clock 4: the answer to 3 now, this one owed
  EXPECT_EQ(r.first, 0b001u);
  EXPECT_EQ(r.to, 0u);
  EXPECT_EQ(a.owed(), 1u);
}

// A rank that leaves the job (docs/membership.md), as Shard::remove_rank_st
// does it: the table's slowest clock leaves it out, its owed answers are
// dropped, and the answers the new slowest clock lets go are sent with the
// chunk's newest version.
TEST(ServerModes, SspGoesOnWithoutARankThatLeft) {
  Modes m(Fanout::kSlowest, agg::make_asp(), 3, 1);
  m.push(0);
  m.pull(0);
  m.push(0);                    // clock 2 needs a slowest of 1; ranks 1 and 2 are at 0: owed
  m.push(1);                    // rank 1 at 1; rank 2, at 0, holds rank 0 back
  EXPECT_EQ(m.ssp.owed(), 3u);  // rank 0's second push, one per chunk
  EXPECT_EQ(m.sides[0].tracker->answers_st(0), 3u);
  EXPECT_EQ(m.table->slowest(m.key(), 0), 0u);
  // Rank 2 is lost before it pushed anything.
  m.table->remove_rank(2);
  EXPECT_EQ(m.table->removed(), 0b100u);
  EXPECT_EQ(m.table->slowest(m.key(), 0), 1u);
  EXPECT_EQ(m.ssp.forget(2), 0u);  // it was owed nothing
  const std::span<const float> params = m.table->parameters(m.key());
  for (uint32_t j = 0; j < m.chunks(); ++j) {
    const uint32_t offset = j * kChunkBytes;
    const uint32_t slowest = m.table->slowest(m.key(), offset);
    const uint64_t to = m.ssp.release(j, m.table->clocks(j), slowest, m.bound);
    EXPECT_EQ(to, 0b001u) << j;
    const uint32_t bytes = std::min(kChunkBytes, kElements * 4 - offset);
    m.sides[0].tracker->deliver_async_st(m.key(), offset, m.table->version(m.key(), offset),
                                         fanout_tag(slowest, true),
                                         std::as_bytes(params.subspan(offset / 4, bytes / 4)));
  }
  EXPECT_EQ(m.ssp.owed(), 0u);
  // Rank 0 has the answers to both its pushes, and a slowest clock that lets
  // it compute its iteration 2.
  EXPECT_EQ(m.sides[0].tracker->answers_st(0), 6u);
  EXPECT_EQ(m.sides[0].tracker->least_slowest_st(0), 1u);
  EXPECT_EQ(m.sides[0].tracker->least_version_st(0), 3u);
  // A push of the removed rank still in flight applies (the server took it)
  // but is answered to nobody and owes nothing.
  const size_t before = m.updates.size();
  m.push(2);
  ASSERT_EQ(m.updates.size(), before + 3);
  for (size_t i = before; i < m.updates.size(); ++i) EXPECT_EQ(m.sent_to[i], 0u) << i;
  EXPECT_EQ(m.ssp.owed(), 0u);
  // Under BSP the rank is removed too (a job that shrinks: its sets,
  // agg/chunk_table_update_test.cpp).
  Modes bsp(Fanout::kEvery, agg::make_bsp(), 2);
  bsp.table->remove_rank(1);
  EXPECT_EQ(bsp.table->removed(), 0b10u);
}

// A new process of a removed rank joins (Shard::join_rank_st's table and
// answers): its clock is the slowest clock of the ranks in the job, from
// which its worker counts its pushes (the slowest clock its first pull
// carries), so the slowest does not move back, nothing it pushes is a
// replay, and SSP answers it again.
TEST(ServerModes, SspTakesAJoiningRankAtTheSlowestClock) {
  Modes m(Fanout::kSlowest, agg::make_asp(), 3, 1);
  for (int i = 0; i < 2; ++i) {
    for (uint16_t r = 0; r < 3; ++r) {
      m.push(r);
      m.pull(r);
    }
  }
  m.push(0);  // rank 0 at 3, ranks 1 and 2 at 2
  m.pull(0);
  m.table->remove_rank(2);
  m.ssp.forget(2);
  m.push(1);  // rank 1 at 3: the slowest in the job is 3
  m.pull(1);
  EXPECT_EQ(m.table->slowest(m.key(), 0), 3u);
  // Rank 2's new process: its pushes count from 3.
  m.table->join_rank(2);
  m.ssp.admit(2);
  m.sides[2].clock = 3;
  const uint64_t answered = m.sides[2].tracker->answers_st(0);
  EXPECT_EQ(m.table->removed(), 0u);
  for (uint32_t j = 0; j < m.chunks(); ++j) {
    EXPECT_EQ(m.table->clocks(j)[2], 3u) << j;
    EXPECT_EQ(m.table->slowest(m.key(), j * kChunkBytes), 3u) << j;
  }
  // Its first push (clock 3) is applied and answered to it alone.
  const size_t before = m.updates.size();
  m.push(2);
  ASSERT_EQ(m.updates.size(), before + m.chunks());
  for (size_t i = before; i < m.updates.size(); ++i) {
    EXPECT_EQ(m.sent_to[i], 0b100u) << i;
    EXPECT_EQ(m.updates[i].clock, 4u) << i;
  }
  EXPECT_EQ(m.sides[2].tracker->answers_st(0), answered + m.chunks());
  EXPECT_EQ(m.table->counters().count(agg::Outcome::kDuplicate), 0u);
  // A replay of its clock 3 is refused as one.
  static const std::vector<float> ones(kElements, 1.0f);
  EXPECT_EQ(
      m.table->contribute(agg::Contribution{.key = m.key(),
                                            .offset = 0,
                                            .iteration = 0,
                                            .rank = 2,
                                            .clock = 3,
                                            .data = reinterpret_cast<const std::byte*>(ones.data()),
                                            .bytes = kChunkBytes}),
      agg::Outcome::kDuplicate);
  // A rank in the job, or under BSP, is not joined again.
  m.table->join_rank(1);
  EXPECT_EQ(m.table->clocks(0)[1], 3u);
  Modes bsp(Fanout::kEvery, agg::make_bsp(), 2);
  bsp.table->remove_rank(1);
  bsp.table->join_rank(1);
  EXPECT_EQ(bsp.table->removed(), 0b10u);
}

// A joined rank's first push of a chunk sets its clock, even one behind the
// slowest clock it was given: its worker counts from the slowest clock its
// first pull carried, and a copy queued for its old process before the
// removal carries an older one (docs/membership.md, "Joining"). Not a replay;
// a second push at that clock is.
TEST(ServerModes, AJoinedRanksFirstPushSetsItsClock) {
  Modes m(Fanout::kSlowest, agg::make_asp(), 3, 1);
  for (int i = 0; i < 3; ++i) {
    for (uint16_t r = 0; r < 3; ++r) {
      m.push(r);
      m.pull(r);
    }
  }
  m.table->remove_rank(2);
  m.ssp.forget(2);
  m.table->join_rank(2);  // given clock 3
  m.ssp.admit(2);
  m.sides[2].clock = 1;  // its worker heard 1
  const size_t before = m.updates.size();
  m.push(2);
  ASSERT_EQ(m.updates.size(), before + m.chunks());
  EXPECT_EQ(m.table->counters().count(agg::Outcome::kDuplicate), 0u);
  for (uint32_t j = 0; j < m.chunks(); ++j) EXPECT_EQ(m.table->clocks(j)[2], 2u) << j;
  static const std::vector<float> ones(kElements, 1.0f);  // the same push again
  EXPECT_EQ(
      m.table->contribute(agg::Contribution{.key = m.key(),
                                            .offset = 0,
                                            .iteration = 0,
                                            .rank = 2,
                                            .clock = 1,
                                            .data = reinterpret_cast<const std::byte*>(ones.data()),
                                            .bytes = kChunkBytes}),
      agg::Outcome::kDuplicate);
}

TEST(ServerModes, SspDropsTheAnswersOwedToARankThatLeft) {
  SspAnswers a;
  a.reset(2, 2);
  uint32_t clocks[2] = {2, 0};
  agg::Update u;
  u.version = 2;
  u.contributors = 0b01;
  u.clock = 2;
  u.slowest = 0;
  u.clocks = clocks;
  EXPECT_EQ(a.route(u, 0, 1).to, 0u);  // owed on chunk 0
  EXPECT_EQ(a.route(u, 1, 1).to, 0u);  // and on chunk 1
  EXPECT_EQ(a.owed(), 2u);
  EXPECT_EQ(a.forget(0), 2u);
  EXPECT_EQ(a.owed(), 0u);
  EXPECT_EQ(a.release(0, clocks, 5, 1), 0u);
}

}  // namespace
}  // namespace mercury::server
