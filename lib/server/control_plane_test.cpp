// The control plane without DPDK: messages in, answers out, a fake clock.
#include "server/control_plane.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

namespace mercury::server {
namespace {

using agg::ControlKind;
using agg::ControlMessage;
using agg::TensorDecl;

std::vector<TensorDecl> model() {
  return {{"conv1.weight", 9408, 0}, {"conv1.bias", 64, 1}, {"fc.weight", 512000, 2}};
}

ControlMessage declare(uint32_t rank, std::vector<TensorDecl> tensors = model()) {
  ControlMessage m;
  m.kind = ControlKind::kDeclare;
  m.rank = rank;
  m.tensors = std::move(tensors);
  return m;
}

// Ranks 0..workers-1 each got one refusal, in rank order, saying `why`.
void expect_refused_to_every_rank(const std::vector<ControlReply>& replies, uint16_t workers,
                                  const std::string& why) {
  ASSERT_EQ(replies.size(), workers);
  for (uint16_t r = 0; r < workers; ++r) {
    EXPECT_EQ(replies[r].rank, r);
    EXPECT_EQ(replies[r].message.kind, ControlKind::kRefused);
    EXPECT_EQ(replies[r].message.text, why);
  }
}

// One answer only: a refusal to `rank` saying `why`.
void expect_refused_alone(const std::vector<ControlReply>& replies, uint16_t rank,
                          const std::string& why) {
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].rank, rank);
  EXPECT_EQ(replies[0].message.kind, ControlKind::kRefused);
  EXPECT_EQ(replies[0].message.text, why);
}

ControlMessage barrier(uint32_t rank, uint64_t generation) {
  ControlMessage m;
  m.kind = ControlKind::kBarrier;
  m.rank = rank;
  m.generation = generation;
  return m;
}

ControlMessage leave(uint32_t rank) {
  ControlMessage m;
  m.kind = ControlKind::kLeave;
  m.rank = rank;
  return m;
}

std::vector<std::string> names(uint32_t n) {
  std::vector<std::string> out;
  for (uint32_t r = 0; r < n; ++r) out.push_back(std::string("w").append(std::to_string(r)));
  return out;
}

// A control plane for `workers` ranks over `shards` global shards, whose
// Starter records the placement it was given (or fails with `fail`).
struct Plane {
  explicit Plane(uint32_t workers, uint32_t shards = 2, bool server0 = true, std::string fail = "",
                 bool asynchronous = false, bool shrinks = false)
      : cp(
            names(workers), shards, server0,
            [this, fail](const agg::Placement& p) {
              ++starts;
              started_with = &p;
              return fail;
            },
            kT0, {}, asynchronous, shrinks) {}
  // Every rank declares the same list, at `t`.
  void declare_all(uint32_t workers, uint64_t t) {
    for (uint32_t r = 0; r < workers; ++r) {
      EXPECT_EQ(cp.on_message_st(static_cast<uint16_t>(r), declare(r), t), ControlVerdict::kTaken);
    }
  }
  static constexpr uint64_t kT0 = 1000;
  ControlPlane cp;
  int starts = 0;
  const agg::Placement* started_with = nullptr;
};

// The replies' kinds, in order, with the rank each went to.
std::vector<std::pair<uint16_t, ControlKind>> kinds(const std::vector<ControlReply>& replies) {
  std::vector<std::pair<uint16_t, ControlKind>> out;
  for (const ControlReply& r : replies) out.emplace_back(r.rank, r.message.kind);
  return out;
}

TEST(ControlPlane, DeclaresFromEveryRankStartTheJobAndAnswerReady) {
  Plane p(3);
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);
  EXPECT_EQ(p.cp.since(), Plane::kT0);
  EXPECT_EQ(p.cp.on_message_st(0, declare(0), 2000), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.on_message_st(2, declare(2), 2001), ControlVerdict::kTaken);
  // No answer before the last rank is in.
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.placement(), nullptr);
  EXPECT_EQ(p.starts, 0);

  EXPECT_EQ(p.cp.on_message_st(1, declare(1), 3000), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.since(), 3000u);
  ASSERT_NE(p.cp.placement(), nullptr);
  EXPECT_EQ(p.starts, 1);
  EXPECT_EQ(p.started_with, p.cp.placement());
  const agg::Placement expected = agg::Placement::compute(model(), 2);
  EXPECT_EQ(p.cp.placement()->fingerprint(), expected.fingerprint());

  const std::vector<ControlReply> replies = p.cp.take_replies_st();
  ASSERT_EQ(replies.size(), 3u);
  for (uint16_t r = 0; r < 3; ++r) {
    EXPECT_EQ(replies[r].rank, r);
    EXPECT_EQ(replies[r].message.kind, ControlKind::kReady);
    EXPECT_EQ(replies[r].message.fingerprint, expected.fingerprint());
    EXPECT_EQ(replies[r].message.shards, 2u);
  }
  EXPECT_EQ(p.cp.counters().declares, 3u);
  EXPECT_EQ(p.cp.counters().declares_repeated, 0u);
  EXPECT_EQ(p.cp.counters().replies, 3u);
}

TEST(ControlPlane, ARankDeclaringAgainWhileWaitingReplacesItsList) {
  Plane p(2);
  std::vector<TensorDecl> other = model();
  other[1].elements = 65;
  p.cp.on_message_st(0, declare(0, other), 1);
  p.cp.on_message_st(0, declare(0), 2);  // restarted, with the job's list
  p.cp.on_message_st(1, declare(1), 3);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.counters().declares_repeated, 1u);
}

TEST(ControlPlane, MismatchedDeclaresAreRefusedNamingTheFirstDifferenceAndAgainLater) {
  Plane p(3);
  std::vector<TensorDecl> other = model();
  other[1] = {"conv1.bias", 65, 1};
  p.cp.on_message_st(0, declare(0), 1);
  p.cp.on_message_st(1, declare(1), 2);
  p.cp.on_message_st(2, declare(2, other), 3);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.since(), 3u);
  EXPECT_EQ(p.starts, 0);
  EXPECT_EQ(p.cp.placement(), nullptr);
  const std::string why = p.cp.refusal();
  EXPECT_NE(why.find("rank 2's tensor list differs from rank 0's"), std::string::npos) << why;
  EXPECT_NE(why.find("tensor 1 is 'conv1.bias' (64 elements, priority 1) on one side and "
                     "'conv1.bias' (65 elements, priority 1) on the other"),
            std::string::npos)
      << why;
  const std::vector<ControlReply> replies = p.cp.take_replies_st();
  ASSERT_EQ(replies.size(), 3u);
  for (const ControlReply& r : replies) {
    EXPECT_EQ(r.message.kind, ControlKind::kRefused);
    EXPECT_EQ(r.message.text, why);
  }
  EXPECT_EQ(p.cp.counters().declares_refused, 3u);

  // A later declare, even of the right list, gets the same answer.
  p.cp.on_message_st(1, declare(1), 4);
  const std::vector<ControlReply> again = p.cp.take_replies_st();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].rank, 1);
  EXPECT_EQ(again[0].message.kind, ControlKind::kRefused);
  EXPECT_EQ(again[0].message.text, why);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.counters().declares_refused, 4u);
  EXPECT_EQ(p.cp.counters().declares_repeated, 1u);
}

TEST(ControlPlane, AStarterThatFailsRefusesTheJobWithItsReason) {
  Plane p(2, 2, true, "shard 1 needs 5 GB, the limit is 4 GB");
  p.declare_all(2, 7);
  EXPECT_EQ(p.starts, 1);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.refusal(), "server: cannot start the job: shard 1 needs 5 GB, the limit is 4 GB");
  EXPECT_EQ(p.cp.placement(), nullptr);
  EXPECT_EQ(kinds(p.cp.take_replies_st()),
            (std::vector<std::pair<uint16_t, ControlKind>>{{0, ControlKind::kRefused},
                                                           {1, ControlKind::kRefused}}));
}

TEST(ControlPlane, AClaimedRankThatIsNotTheSendersIsRefusedToItAloneAndTheJobWaits) {
  Plane p(2);
  EXPECT_EQ(p.cp.on_message_st(1, declare(9), 1), ControlVerdict::kWrongRank);
  EXPECT_EQ(p.cp.on_message_st(0, declare(1), 2), ControlVerdict::kWrongRank);
  const std::vector<ControlReply> replies = p.cp.take_replies_st();
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].rank, 1);
  EXPECT_EQ(replies[0].message.kind, ControlKind::kRefused);
  EXPECT_EQ(replies[0].message.text,
            "server: w1 is rank 1 in the job file, but its declare says rank 9, which is not in "
            "this job (2 workers: ranks 0..1)");
  EXPECT_EQ(replies[1].rank, 0);
  EXPECT_EQ(replies[1].message.text,
            "server: w0 is rank 0 in the job file, but its declare says rank 1");
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);
  EXPECT_EQ(p.cp.counters().declares_refused, 2u);

  // A wrong barrier too; then the right declares still start the job.
  EXPECT_EQ(p.cp.on_message_st(0, barrier(1, 0), 3), ControlVerdict::kWrongRank);
  EXPECT_NE(p.cp.take_replies_st().at(0).message.text.find("its barrier says rank 1"),
            std::string::npos);
  p.declare_all(2, 4);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
}

TEST(ControlPlane, BarrierGenerationsCompleteOutOfOrder) {
  Plane p(2);
  // Rank 0 is in generations 0 and 1 at once (two trainer threads); rank 1
  // reaches 1 first: generation 1 completes before 0.
  p.cp.on_message_st(0, barrier(0, 0), 1);
  p.cp.on_message_st(0, barrier(0, 1), 2);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_message_st(1, barrier(1, 1), 3);
  std::vector<ControlReply> done = p.cp.take_replies_st();
  ASSERT_EQ(done.size(), 2u);
  for (const ControlReply& r : done) {
    EXPECT_EQ(r.message.kind, ControlKind::kBarrierDone);
    EXPECT_EQ(r.message.generation, 1u);
  }
  // Generation 1 is complete above the floor (0 is not): rank 1 asking
  // about 1 again is answered again, and rank 1 reaching 0 completes it.
  p.cp.on_message_st(1, barrier(1, 1), 4);
  done = p.cp.take_replies_st();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].rank, 1);
  EXPECT_EQ(done[0].message.generation, 1u);
  p.cp.on_message_st(1, barrier(1, 0), 5);
  done = p.cp.take_replies_st();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].message.generation, 0u);
  EXPECT_EQ(done[1].message.generation, 0u);
  // Both are below the floor now: asking about either is answered.
  p.cp.on_message_st(0, barrier(0, 0), 6);
  p.cp.on_message_st(0, barrier(0, 1), 7);
  done = p.cp.take_replies_st();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].message.generation, 0u);
  EXPECT_EQ(done[1].message.generation, 1u);
  EXPECT_EQ(p.cp.counters().barriers, 7u);
  EXPECT_EQ(p.cp.counters().barriers_completed, 2u);
  EXPECT_EQ(p.cp.counters().barriers_repeated, 3u);
}

TEST(ControlPlane, ARepeatedBarrierOfAnIncompleteGenerationIsOnlyCounted) {
  Plane p(3);
  p.cp.on_message_st(2, barrier(2, 4), 1);
  p.cp.on_message_st(2, barrier(2, 4), 2);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.counters().barriers_repeated, 1u);
  p.cp.on_message_st(0, barrier(0, 4), 3);
  p.cp.on_message_st(1, barrier(1, 4), 4);
  EXPECT_EQ(kinds(p.cp.take_replies_st()),
            (std::vector<std::pair<uint16_t, ControlKind>>{{0, ControlKind::kBarrierDone},
                                                           {1, ControlKind::kBarrierDone},
                                                           {2, ControlKind::kBarrierDone}}));
}

TEST(ControlPlane, ABarrierSentToAServerOtherThanServer0IsNotTakenThere) {
  Plane p(2, 2, /*server0=*/false);
  EXPECT_EQ(p.cp.on_message_st(0, barrier(0, 0), 1), ControlVerdict::kBarrierNotHere);
  EXPECT_EQ(p.cp.on_message_st(1, barrier(1, 0), 2), ControlVerdict::kBarrierNotHere);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.counters().barriers, 2u);
  EXPECT_EQ(p.cp.counters().barriers_completed, 0u);
  // Declares work as on server 0.
  p.declare_all(2, 3);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
}

TEST(ControlPlane, KindsOnlyServersSendAreBadControl) {
  Plane p(1);
  ControlMessage m;
  for (ControlKind k : {ControlKind::kReady, ControlKind::kRefused, ControlKind::kBarrierDone}) {
    m.kind = k;
    EXPECT_EQ(p.cp.on_message_st(0, m, 1), ControlVerdict::kBadControl);
  }
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);
}

TEST(ControlPlane, AWorkerTheTransportGaveUpOnEndsTheJobForEveryRank) {
  Plane p(3);
  // Silent before the job runs: nothing is held up yet.
  p.cp.on_worker_lost_st(2, 10);
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);
  EXPECT_EQ(p.cp.counters().workers_lost, 0u);

  p.declare_all(3, 20);
  p.cp.take_replies_st();
  p.cp.on_worker_lost_st(2, 5000);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.since(), 5000u);
  EXPECT_EQ(p.cp.counters().workers_lost, 1u);
  EXPECT_EQ(p.cp.counters().declares_refused, 0u);  // no declare was answered
  const std::string why = p.cp.refusal();
  EXPECT_EQ(why,
            "worker w2 (rank 2) stopped answering and its transport gave up on it "
            "(network.peer_timeout_ms): the job cannot continue without its gradients");
  expect_refused_to_every_rank(p.cp.take_replies_st(), 3, why);
  // A second silent worker changes nothing more.
  p.cp.on_worker_lost_st(1, 6000);
  EXPECT_EQ(p.cp.counters().workers_lost, 1u);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  // A worker that declares again learns why.
  p.cp.on_message_st(0, declare(0), 7000);
  EXPECT_EQ(p.cp.take_replies_st().at(0).message.text, why);
}

TEST(ControlPlane, EveryRankLeavingFinishesTheJob) {
  Plane p(3);
  p.declare_all(3, 20);
  p.cp.take_replies_st();
  EXPECT_EQ(p.cp.on_message_st(0, leave(0), 100), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.on_message_st(2, leave(2), 110), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.left(), 0b101u);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  p.cp.on_message_st(2, leave(2), 115);  // again: nothing more
  EXPECT_EQ(p.cp.left(), 0b101u);
  EXPECT_EQ(p.cp.on_message_st(1, leave(1), 120), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.state(), NodeState::kFinished);
  EXPECT_EQ(p.cp.since(), 120u);
  EXPECT_EQ(p.cp.counters().leaves, 4u);
  EXPECT_TRUE(p.cp.take_replies_st().empty());  // a leave is not answered
  // The job is done: a late declare learns so, and nothing else changes it.
  p.cp.on_message_st(1, declare(1), 130);
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].message.kind, ControlKind::kRefused);
  EXPECT_EQ(r[0].message.text, "server: the job is finished: every worker left");
  p.cp.on_worker_lost_st(1, 140);
  p.cp.on_push_after_leave_st(1, 150);
  EXPECT_EQ(p.cp.state(), NodeState::kFinished);
  EXPECT_EQ(p.cp.counters().workers_lost + p.cp.counters().pushes_after_leave, 0u);
}

TEST(ControlPlane, APushAfterALeaveEndsTheJobNamingBoth) {
  Plane p(3);
  p.declare_all(3, 20);
  p.cp.take_replies_st();
  p.cp.on_push_after_leave_st(0, 50);  // nobody left: nothing
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  p.cp.on_message_st(2, leave(2), 100);
  p.cp.on_push_after_leave_st(0, 200);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.counters().pushes_after_leave, 1u);
  const std::string why = p.cp.refusal();
  EXPECT_EQ(why,
            "worker w2 (rank 2) left the job, and w0 (rank 0) pushed gradients after it: under "
            "BSP every round needs every rank's (did the workers run different numbers of "
            "rounds?)");
  const std::vector<ControlReply> replies = p.cp.take_replies_st();
  ASSERT_EQ(replies.size(), 3u);
  for (const ControlReply& r : replies) EXPECT_EQ(r.message.text, why);
}

TEST(ControlPlane, ALeaveBeforeTheStartWithdrawsTheDeclareAndAWrongRankIsRefused) {
  Plane p(2);
  p.cp.on_message_st(0, declare(0), 10);
  EXPECT_EQ(p.cp.on_message_st(0, leave(0), 20), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.left(), 0u);
  p.cp.on_message_st(1, declare(1), 30);
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);  // rank 0 must declare again
  p.cp.on_message_st(0, declare(0), 40);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  p.cp.take_replies_st();
  EXPECT_EQ(p.cp.on_message_st(1, leave(0), 50), ControlVerdict::kWrongRank);
  EXPECT_EQ(p.cp.left(), 0u);
  EXPECT_EQ(kinds(p.cp.take_replies_st()),
            (std::vector<std::pair<uint16_t, ControlKind>>{{1, ControlKind::kRefused}}));
}

// A worker whose process restarted comes back with a new transport epoch
// (the node reports it) and none of the job's state: the job ends for
// every rank, the new incarnation included, as for a lost worker.
TEST(ControlPlane, ARestartedWorkerEndsTheJobForEveryRank) {
  Plane p(3);
  // Before the job runs, a restart withdraws the rank's declare: the job
  // waits for the new incarnation's, whatever the others do.
  p.cp.on_message_st(0, declare(0), 10);
  p.cp.on_message_st(2, declare(2), 11);
  p.cp.on_worker_restarted_st(2, 12);
  p.cp.on_message_st(1, declare(1), 13);
  EXPECT_EQ(p.cp.state(), NodeState::kWaiting);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_message_st(2, declare(2), 14);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.counters().workers_restarted, 0u);
  p.cp.take_replies_st();

  p.cp.on_worker_restarted_st(1, 5000);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.since(), 5000u);
  EXPECT_EQ(p.cp.counters().workers_restarted, 1u);
  EXPECT_EQ(p.cp.counters().workers_lost, 0u);
  const std::string why = p.cp.refusal();
  EXPECT_EQ(why,
            "worker w1 (rank 1) restarted mid-job (a new incarnation, new epoch); a job cannot "
            "take a rank back: start the job again");
  // Every rank hears it: the others' calls fail with it, and the new
  // incarnation's start does.
  expect_refused_to_every_rank(p.cp.take_replies_st(), 3, why);
  // The new incarnation's declare (or anyone's) gets the same answer;
  // nothing else changes the refused job.
  p.cp.on_message_st(1, declare(1), 5001);
  std::vector<ControlReply> r = p.cp.take_replies_st();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 1);
  EXPECT_EQ(r[0].message.text, why);
  p.cp.on_worker_restarted_st(0, 5002);
  p.cp.on_worker_lost_st(2, 5003);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.refusal(), why);
  EXPECT_EQ(p.cp.counters().workers_restarted + p.cp.counters().workers_lost, 1u);
}

// A declare from a rank of the running job is a new incarnation too (a
// worker declares once per process): the job ends for every rank. A rank
// that left is done with the job: its new declare is refused to it alone.
TEST(ControlPlane, ADeclareInTheRunningJobEndsItUnlessItsRankLeft) {
  Plane p(3);
  p.declare_all(3, 1);
  p.cp.take_replies_st();
  p.cp.on_message_st(2, leave(2), 2);
  p.cp.on_worker_restarted_st(2, 3);  // it left: nothing
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_message_st(2, declare(2), 4);
  std::vector<ControlReply> r = p.cp.take_replies_st();
  expect_refused_alone(r, 2,
                       "server: worker w2 (rank 2) left this job; a job cannot take a rank back: "
                       "start the job again");
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);  // the others finish their rounds

  p.cp.on_message_st(0, declare(0), 5);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  const std::string why = p.cp.refusal();
  EXPECT_EQ(why,
            "worker w0 (rank 0) restarted mid-job (a new incarnation, declared again); a job "
            "cannot take a rank back: start the job again");
  r = p.cp.take_replies_st();
  ASSERT_EQ(r.size(), 3u);
  for (const ControlReply& reply : r) {
    EXPECT_EQ(reply.message.kind, ControlKind::kRefused);
    EXPECT_EQ(reply.message.text, why);
  }
  EXPECT_EQ(p.starts, 1);
  EXPECT_EQ(p.cp.counters().declares_repeated, 2u);
  EXPECT_EQ(p.cp.counters().declares_refused, 2u);
  EXPECT_EQ(p.cp.counters().workers_restarted, 1u);
}

TEST(ControlPlane, StoppingARunningJobSilencesDeclares) {
  Plane p(1);
  p.declare_all(1, 1);
  p.cp.take_replies_st();
  p.cp.on_stopped_st(9);
  EXPECT_EQ(p.cp.state(), NodeState::kStopped);
  EXPECT_EQ(p.cp.since(), 9u);
  p.cp.on_message_st(0, declare(0), 10);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
}

// Membership (docs/membership.md): an asynchronous job goes on without a
// rank that is lost, restarted or left.
struct AsyncPlane : Plane {
  explicit AsyncPlane(uint32_t workers, bool server0 = true)
      : Plane(workers, 2, server0, "", true) {
    declare_all(workers, 1);
    cp.take_replies_st();
  }
};

// The kWorkerGone messages in `replies`: (recipient, rank gone, lost).
std::vector<std::tuple<uint16_t, uint32_t, bool>> gone_messages(
    const std::vector<ControlReply>& replies) {
  std::vector<std::tuple<uint16_t, uint32_t, bool>> out;
  for (const ControlReply& r : replies) {
    if (r.message.kind == ControlKind::kWorkerGone) {
      out.emplace_back(r.rank, r.message.rank, r.message.lost);
    }
  }
  return out;
}

TEST(ControlPlaneMembership, ALostRankIsRemovedAndEveryOtherRankIsTold) {
  AsyncPlane p(4);
  p.cp.on_worker_lost_st(2, 50);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.removed(), 0b0100u);
  EXPECT_TRUE(p.cp.gone(2));
  EXPECT_FALSE(p.cp.gone(1));
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  using G = std::tuple<uint16_t, uint32_t, bool>;
  EXPECT_EQ(gone_messages(r), (std::vector<G>{{0, 2, true}, {1, 2, true}, {3, 2, true}}));
  EXPECT_EQ(r.size(), 3u);  // nothing else, nothing to the lost rank
  EXPECT_EQ(r[0].message.text,
            "worker w2 (rank 2) stopped answering and its transport gave up on it "
            "(network.peer_timeout_ms): removed from the job, which goes on with 3 ranks");
  EXPECT_EQ(p.cp.take_notices_st(), std::vector<std::string>{r[0].message.text});
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, false}}));
  EXPECT_TRUE(p.cp.take_membership_st().empty());  // each change once
  EXPECT_EQ(p.cp.counters().workers_lost, 1u);
  EXPECT_EQ(p.cp.counters().workers_removed, 1u);
  // Named lost again (another check before the node's filter saw it): nothing.
  p.cp.on_worker_lost_st(2, 51);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.counters().workers_removed, 1u);
}

TEST(ControlPlaneMembership, UnderBspALostRankStillEndsTheJob) {
  Plane p(3);
  p.declare_all(3, 1);
  p.cp.take_replies_st();
  p.cp.on_worker_lost_st(1, 50);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_TRUE(p.cp.take_membership_st().empty());
  EXPECT_EQ(p.cp.take_replies_st().size(), 3u);
  EXPECT_EQ(p.cp.counters().workers_removed, 0u);
}

TEST(ControlPlaneMembership, ABarrierCompletesWithoutTheRanksThatAreGone) {
  AsyncPlane p(3);
  // Ranks 0 and 1 wait in generation 4; rank 2 dies: the barrier completes.
  EXPECT_EQ(p.cp.on_message_st(0, barrier(0, 4), 10), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.on_message_st(1, barrier(1, 4), 11), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_worker_lost_st(2, 12);
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(p.cp.take_replies_st()), (std::vector<K>{{0, ControlKind::kWorkerGone},
                                                           {1, ControlKind::kWorkerGone},
                                                           {0, ControlKind::kBarrierDone},
                                                           {1, ControlKind::kBarrierDone}}));
  EXPECT_EQ(p.cp.counters().barriers_completed, 1u);
  // The next generation needs ranks 0 and 1 only; one that left counts out too.
  EXPECT_EQ(p.cp.on_message_st(0, barrier(0, 5), 13), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.on_message_st(1, leave(1), 14), ControlVerdict::kTaken);
  EXPECT_EQ(kinds(p.cp.take_replies_st()),
            (std::vector<K>{{0, ControlKind::kWorkerGone}, {0, ControlKind::kBarrierDone}}));
}

TEST(ControlPlaneMembership, TheJobIsFinishedOnceEveryRankLeftOrWasRemoved) {
  AsyncPlane p(3);
  p.cp.on_worker_lost_st(1, 10);
  EXPECT_EQ(p.cp.on_message_st(0, leave(0), 11), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  // A leave is told to the others still in (not lost), not said on the node's output.
  using G = std::tuple<uint16_t, uint32_t, bool>;
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  EXPECT_EQ(gone_messages(r), (std::vector<G>{{0, 1, true}, {2, 1, true}, {2, 0, false}}));
  EXPECT_EQ(p.cp.take_notices_st().size(), 1u);
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{1, false}, {0, false}}));
  EXPECT_EQ(p.cp.on_message_st(2, leave(2), 12), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.state(), NodeState::kFinished);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.counters().workers_removed, 1u);
  EXPECT_EQ(p.cp.counters().leaves, 2u);
}

// Rank 1 of 3 restarts in a job that goes on without it: removed, the two
// others told (kWorkerGone), the job not ended.
void restart_removes_rank1(ControlPlane& cp) {
  cp.on_worker_restarted_st(1, 10);
  EXPECT_EQ(cp.state(), NodeState::kRunning);
  EXPECT_EQ(cp.removed(), 0b010u);
  EXPECT_EQ(cp.take_replies_st().size(), 2u);  // kWorkerGone to ranks 0 and 2
  EXPECT_EQ(cp.counters().workers_restarted, 0u);
}

TEST(ControlPlaneMembership, ARestartRemovesTheRankAndItsNewProcessJoins) {
  AsyncPlane p(3);
  restart_removes_rank1(p.cp);
  p.cp.take_notices_st();
  EXPECT_EQ(p.cp.on_message_st(1, declare(1), 11), ControlVerdict::kTaken);
  std::vector<ControlReply> r = p.cp.take_replies_st();
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerJoined},
                                      {2, ControlKind::kWorkerJoined},
                                      {1, ControlKind::kJoined}}));
  const std::string text =
      "worker w1 (rank 1) joined the running job (a new process): it goes on with 3 ranks";
  EXPECT_EQ(r[0].message.rank, 1u);
  EXPECT_EQ(r[0].message.text, text);
  EXPECT_EQ(p.cp.take_notices_st(), std::vector<std::string>{text});
  // Its answer is kReady's: the same placement and start version.
  const agg::Placement expected = agg::Placement::compute(model(), 2);
  EXPECT_EQ(r[2].message.fingerprint, expected.fingerprint());
  EXPECT_EQ(r[2].message.shards, 2u);
  EXPECT_EQ(r[2].message.version, 0u);
  EXPECT_EQ(r[2].message.generation, 0u);
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_FALSE(p.cp.gone(1));
  EXPECT_EQ(p.cp.counters().workers_joined, 1u);
  EXPECT_EQ(p.cp.counters().declares_refused, 0u);
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{1, false}, {1, true}}));
  // A declare whose restart went unseen removes the rank first, then joins it.
  EXPECT_EQ(p.cp.on_message_st(2, declare(2), 12), ControlVerdict::kTaken);
  r = p.cp.take_replies_st();
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerGone},
                                      {1, ControlKind::kWorkerGone},
                                      {0, ControlKind::kWorkerJoined},
                                      {1, ControlKind::kWorkerJoined},
                                      {2, ControlKind::kJoined}}));
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, false}, {2, true}}));
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_EQ(p.cp.counters().workers_removed, 2u);
  EXPECT_EQ(p.cp.counters().workers_joined, 2u);
  // A rank that left is done with the job: its new process is refused.
  EXPECT_EQ(p.cp.on_message_st(0, leave(0), 13), ControlVerdict::kTaken);
  p.cp.take_replies_st();
  EXPECT_EQ(p.cp.on_message_st(0, declare(0), 14), ControlVerdict::kTaken);
  expect_refused_alone(p.cp.take_replies_st(), 0,
                       "server: worker w0 (rank 0) left this job; a job cannot take a rank "
                       "back: start the job again");
}

TEST(ControlPlaneMembership, AJoinWithAnotherTensorListIsRefusedAlone) {
  AsyncPlane p(3);
  p.cp.on_worker_lost_st(2, 10);
  p.cp.take_replies_st();
  p.cp.take_membership_st();
  std::vector<TensorDecl> other = model();
  other[1].elements = 65;
  EXPECT_EQ(p.cp.on_message_st(2, declare(2, other), 11), ControlVerdict::kTaken);
  expect_refused_alone(p.cp.take_replies_st(), 2,
                       "server: worker w2 (rank 2) cannot join the running job: its tensor list "
                       "differs from the job's (the job's vs its): tensor 1 is 'conv1.bias' (64 "
                       "elements, priority 1) on one side and 'conv1.bias' (65 elements, "
                       "priority 1) on the other");
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.removed(), 0b100u);  // still out; the job goes on
  EXPECT_TRUE(p.cp.take_membership_st().empty());
  EXPECT_EQ(p.cp.counters().workers_joined, 0u);
  EXPECT_EQ(p.cp.counters().declares_refused, 1u);
  // The same rank with the job's list joins afterwards.
  EXPECT_EQ(p.cp.on_message_st(2, declare(2), 12), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.take_replies_st().back().message.kind, ControlKind::kJoined);
  EXPECT_EQ(p.cp.counters().workers_joined, 1u);
}

TEST(ControlPlaneMembership, AJoinedRankTakesPartInBarriersFromTheGenerationItWasGiven) {
  AsyncPlane p(3);
  // Generations 0 and 1 complete; ranks 0 and 1 wait in 2; rank 2 is lost.
  for (uint64_t g = 0; g < 2; ++g) {
    for (uint32_t r = 0; r < 3; ++r) p.cp.on_message_st(static_cast<uint16_t>(r), barrier(r, g), g);
  }
  p.cp.on_message_st(0, barrier(0, 2), 5);
  p.cp.on_worker_lost_st(2, 6);
  p.cp.on_message_st(0, barrier(0, 3), 7);  // rank 0 is ahead, in 3
  p.cp.take_replies_st();
  EXPECT_EQ(p.cp.counters().barriers_completed, 2u);
  // Rank 2's new process joins: it counts from generation 4, after every one reached.
  p.cp.on_message_st(2, declare(2), 8);
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  ASSERT_EQ(r.back().message.kind, ControlKind::kJoined);
  EXPECT_EQ(r.back().message.generation, 4u);
  // Generations 2 and 3 need ranks 0 and 1 only.
  p.cp.on_message_st(1, barrier(1, 2), 9);
  p.cp.on_message_st(1, barrier(1, 3), 10);
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(p.cp.take_replies_st()), (std::vector<K>{{0, ControlKind::kBarrierDone},
                                                           {1, ControlKind::kBarrierDone},
                                                           {2, ControlKind::kBarrierDone},
                                                           {0, ControlKind::kBarrierDone},
                                                           {1, ControlKind::kBarrierDone},
                                                           {2, ControlKind::kBarrierDone}}));
  // Generation 4 needs it.
  p.cp.on_message_st(0, barrier(0, 4), 11);
  p.cp.on_message_st(1, barrier(1, 4), 12);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_message_st(2, barrier(2, 4), 13);
  EXPECT_EQ(p.cp.take_replies_st().size(), 3u);
  EXPECT_EQ(p.cp.counters().barriers_completed, 5u);
}

// A BSP job that shrinks (training.on_worker_loss shrink): running, 4 ranks.
struct ShrinkPlane : Plane {
  explicit ShrinkPlane(uint32_t workers) : Plane(workers, 2, true, "", false, true) {
    declare_all(workers, 1);
    cp.take_replies_st();
  }
};

TEST(ControlPlaneShrink, ALostRankIsRemovedEveryOtherRankToldAndTheShardsToo) {
  ShrinkPlane p(4);
  // Ranks 0, 1 and 3 wait in a barrier; rank 2 is lost: the barrier completes.
  for (uint16_t r : {0, 1, 3})
    EXPECT_EQ(p.cp.on_message_st(r, barrier(r, 6), 10), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  p.cp.on_worker_lost_st(2, 50);
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.removed(), 0b0100u);
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerGone},
                                      {1, ControlKind::kWorkerGone},
                                      {3, ControlKind::kWorkerGone},
                                      {0, ControlKind::kBarrierDone},
                                      {1, ControlKind::kBarrierDone},
                                      {3, ControlKind::kBarrierDone}}));
  const std::string text =
      "worker w2 (rank 2) stopped answering and its transport gave up on it "
      "(network.peer_timeout_ms): removed from the job, which goes on with 3 ranks "
      "(training.on_worker_loss shrink: its rounds average over them)";
  EXPECT_EQ(r[0].message.text, text);
  EXPECT_TRUE(r[0].message.lost);
  EXPECT_EQ(p.cp.take_notices_st(), std::vector<std::string>{text});
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, false}}));
  EXPECT_EQ(p.cp.counters().workers_lost, 1u);
  EXPECT_EQ(p.cp.counters().workers_removed, 1u);
  // Later generations need the three others only.
  for (uint16_t r3 : {0, 1})
    EXPECT_EQ(p.cp.on_message_st(r3, barrier(r3, 7), 60), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.on_message_st(3, barrier(3, 7), 61), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.take_replies_st().size(), 3u);
}

TEST(ControlPlaneShrink, ARestartRemovesTheRankAndItsNewProcessIsRefusedAlone) {
  ShrinkPlane p(3);
  restart_removes_rank1(p.cp);
  EXPECT_EQ(p.cp.on_message_st(1, declare(1), 11), ControlVerdict::kTaken);
  expect_refused_alone(p.cp.take_replies_st(), 1,
                       "server: worker w1 (rank 1) was removed from the job "
                       "(training.on_worker_loss shrink): a BSP job that shrank does not take a "
                       "rank back");
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  // A declare whose restart went unseen removes the rank, and is refused.
  EXPECT_EQ(p.cp.on_message_st(2, declare(2), 12), ControlVerdict::kTaken);
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(p.cp.take_replies_st()),
            (std::vector<K>{{0, ControlKind::kWorkerGone}, {2, ControlKind::kRefused}}));
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{1, false}, {2, false}}));
  EXPECT_EQ(p.cp.counters().workers_removed, 2u);
  EXPECT_EQ(p.cp.counters().workers_joined, 0u);
  // The last rank still in leaves: the job is done.
  EXPECT_EQ(p.cp.on_message_st(0, leave(0), 13), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.state(), NodeState::kFinished);
}

TEST(ControlPlaneShrink, LosingRank0EndsTheJob) {
  ShrinkPlane p(3);
  p.cp.on_worker_lost_st(0, 50);
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_TRUE(p.cp.take_membership_st().empty());
  expect_refused_to_every_rank(
      p.cp.take_replies_st(), 3,
      "worker w0 (rank 0) stopped answering and its transport gave up on it "
      "(network.peer_timeout_ms): the job cannot continue without its gradients (a job shrinks "
      "without any rank but rank 0)");
  ShrinkPlane q(3);
  q.cp.on_worker_restarted_st(0, 50);
  EXPECT_EQ(q.cp.state(), NodeState::kRefused);
  EXPECT_EQ(q.cp.counters().workers_restarted, 1u);
}

// A BSP job that waits (training.on_worker_loss wait): running, the limit
// 100 ticks.
struct WaitPlane : Plane {
  explicit WaitPlane(uint32_t workers) : Plane(workers) {
    cp.wait_for_lost(100, "training.worker_wait_s 1 s");
    declare_all(workers, 1);
    cp.take_replies_st();
  }
};

TEST(ControlPlaneWait, ALostRankIsWaitedForAndItsNewProcessJoinsAtTheVersionGiven) {
  WaitPlane p(3);
  EXPECT_EQ(p.cp.on_message_st(0, barrier(0, 4), 10), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.on_message_st(1, barrier(1, 4), 10), ControlVerdict::kTaken);
  p.cp.on_worker_lost_st(2, 50);
  // Nobody is told; its sets and barriers still need it; it is not in the job.
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.state(), NodeState::kRunning);
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_EQ(p.cp.waited_for(), 0b100u);
  EXPECT_FALSE(p.cp.in_job(2));
  EXPECT_TRUE(p.cp.in_job(1));
  EXPECT_EQ(p.cp.take_notices_st(),
            std::vector<std::string>{
                "worker w2 (rank 2) stopped answering and its transport gave up on it "
                "(network.peer_timeout_ms): the round waits for its new process "
                "(training.worker_wait_s 1 s)"});
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, false}}));
  EXPECT_FALSE(p.cp.check_waits_st(149));
  // A new process with another list is refused alone and the rank still waited for.
  EXPECT_EQ(p.cp.on_message_st(2, declare(2, {{"conv1.weight", 9408, 0}}), 60),
            ControlVerdict::kTaken);
  ASSERT_EQ(p.cp.take_replies_st().size(), 1u);
  EXPECT_EQ(p.cp.waited_for(), 0b100u);
  // One with the job's list joins once the node gives the version.
  EXPECT_EQ(p.cp.on_message_st(2, declare(2), 70), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_TRUE(p.cp.joining(2));
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, true}}));
  EXPECT_TRUE(p.cp.finish_join_st(2, 7));
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerJoined},
                                      {1, ControlKind::kWorkerJoined},
                                      {2, ControlKind::kJoined}}));
  EXPECT_EQ(r[0].message.text,
            "worker w2 (rank 2) joined the running job (a new process) at version 7: the round "
            "goes on with 3 ranks");
  EXPECT_EQ(r[2].message.version, 7u);
  EXPECT_EQ(r[2].message.generation, 4u);  // the highest reached: its first call
  EXPECT_EQ(p.cp.waited_for(), 0u);
  EXPECT_TRUE(p.cp.in_job(2));
  EXPECT_FALSE(p.cp.finish_join_st(2, 7));  // once
  EXPECT_EQ(p.cp.counters().workers_joined, 1u);
  EXPECT_EQ(p.cp.counters().workers_removed, 0u);
  // Its barrier completes generation 4 for everyone.
  EXPECT_EQ(p.cp.on_message_st(2, barrier(2, 4), 80), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.take_replies_st().size(), 3u);
  EXPECT_FALSE(p.cp.check_waits_st(1000));
}

TEST(ControlPlaneWait, ARankNotBackWithinTheLimitEndsTheJob) {
  WaitPlane p(3);
  p.cp.on_worker_restarted_st(1, 50);
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_EQ(p.cp.counters().workers_restarted, 0u);
  EXPECT_FALSE(p.cp.check_waits_st(149));
  EXPECT_TRUE(p.cp.check_waits_st(150));
  EXPECT_EQ(p.cp.state(), NodeState::kRefused);
  expect_refused_to_every_rank(
      p.cp.take_replies_st(), 3,
      "worker w1 (rank 1): no new process of it joined within training.worker_wait_s 1 s (it "
      "restarted mid-job (a new incarnation, new epoch)): the job cannot continue without its "
      "gradients");
}

TEST(ControlPlane, ConstructionRefusesNoRanksTooManyOrNoShards) {
  EXPECT_THROW(ControlPlane(names(0), 1, true, {}, 0), std::invalid_argument);
  EXPECT_THROW(ControlPlane(names(65), 1, true, {}, 0), std::invalid_argument);
  EXPECT_THROW(ControlPlane(names(2), 0, true, {}, 0), std::invalid_argument);
}

// ---- spare workers (docs/membership.md, "Spare workers") ----

// An asynchronous job of 4 ranks with spares w4 and w5 (peers 4 and 5),
// a grace of 100 ticks, running.
struct SparePlane : Plane {
  explicit SparePlane(bool server0 = true) : Plane(4, 2, server0, "", true) {
    cp.add_spares({"w4", "w5"}, 100);
    declare_all(4, 1);
    cp.take_replies_st();
  }
};

ControlMessage announce() { return declare(agg::kSpareRank); }

TEST(ControlPlaneSpares, ServerZeroGivesARemovedRankToASpareAfterTheGrace) {
  SparePlane p;
  EXPECT_EQ(p.cp.peers(), 6u);
  EXPECT_EQ(p.cp.rank_of_peer(4), std::nullopt);
  EXPECT_EQ(p.cp.on_peer_message_st(4, announce(), 2), ControlVerdict::kTaken);
  EXPECT_TRUE(p.cp.take_replies_st().empty());  // it waits
  EXPECT_TRUE(p.cp.spare_waits(4));
  EXPECT_FALSE(p.cp.spare_waits(5));
  p.cp.on_peer_lost_st(2, 10);  // rank 2's node
  EXPECT_EQ(p.cp.removed(), 0b0100u);
  p.cp.take_replies_st();
  p.cp.take_notices_st();
  EXPECT_FALSE(p.cp.check_spares_st(109));  // its own new process may still come
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_TRUE(p.cp.check_spares_st(110));
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerJoined},
                                      {1, ControlKind::kWorkerJoined},
                                      {3, ControlKind::kWorkerJoined},
                                      {4, ControlKind::kJoined}}));
  const std::string text = "spare w4 took over worker w2 (rank 2): it goes on with 4 ranks";
  EXPECT_EQ(r[0].message.text, text);
  EXPECT_EQ(r[0].message.rank, 2u);
  EXPECT_EQ(r[3].message.rank, 2u);  // the rank it joins as
  EXPECT_EQ(p.cp.take_notices_st(), std::vector<std::string>{text});
  EXPECT_EQ(p.cp.rank_of_peer(4), std::optional<uint32_t>(2u));
  EXPECT_EQ(p.cp.rank_of_peer(2), std::nullopt);
  EXPECT_EQ(p.cp.peer_of(2), 4u);
  EXPECT_FALSE(p.cp.spare_waits(4));
  using T = ControlPlane::Takeover;
  EXPECT_EQ(p.cp.take_takeovers_st(), (std::vector<T>{{2, 4}}));
  using C = ControlPlane::MembershipChange;
  EXPECT_EQ(p.cp.take_membership_st(), (std::vector<C>{{2, false}, {2, true}}));
  EXPECT_EQ(p.cp.removed(), 0u);
  EXPECT_EQ(p.cp.counters().spares_joined, 1u);
  EXPECT_EQ(p.cp.counters().workers_joined, 1u);
  // The spare's messages are rank 2's now; rank 2's own node is refused alone.
  EXPECT_EQ(p.cp.on_peer_message_st(4, barrier(2, 0), 111), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.on_peer_message_st(2, declare(2), 112), ControlVerdict::kTaken);
  expect_refused_alone(p.cp.take_replies_st(), 2,
                       "server: worker w2 (rank 2) was taken over by spare w4: the job does not "
                       "take w2 back");
  EXPECT_EQ(p.cp.on_peer_message_st(2, barrier(2, 0), 113), ControlVerdict::kNoRank);
  // A spare that waits when the job ends is released; the job's end is not a failure.
  EXPECT_EQ(p.cp.on_peer_message_st(5, announce(), 114), ControlVerdict::kTaken);
  for (uint16_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(p.cp.on_peer_message_st(p.cp.peer_of(rank), leave(rank), 115),
              ControlVerdict::kTaken);
  }
  EXPECT_EQ(p.cp.state(), NodeState::kFinished);
  const std::vector<ControlReply> end = p.cp.take_replies_st();
  ASSERT_FALSE(end.empty());
  EXPECT_EQ(end.back().rank, 5u);
  EXPECT_EQ(end.back().message.kind, ControlKind::kReleased);
  EXPECT_EQ(end.back().message.text,
            "server: the job is finished (every rank left or was removed): spare w5 was not "
            "needed");
  EXPECT_EQ(p.cp.counters().spares_released, 1u);
  // One that announces itself after the end is released at once.
  EXPECT_EQ(p.cp.on_peer_message_st(5, announce(), 116), ControlVerdict::kTaken);
  EXPECT_EQ(kinds(p.cp.take_replies_st()), (std::vector<K>{{5, ControlKind::kReleased}}));
}

TEST(ControlPlaneSpares, ARanksOwnNewProcessWithinTheGraceKeepsItsRank) {
  SparePlane p;
  p.cp.on_peer_message_st(4, announce(), 2);
  p.cp.on_peer_lost_st(1, 10);
  EXPECT_EQ(p.cp.on_peer_message_st(1, declare(1), 50), ControlVerdict::kTaken);
  p.cp.take_replies_st();
  EXPECT_FALSE(p.cp.check_spares_st(500));
  EXPECT_TRUE(p.cp.take_replies_st().empty());
  EXPECT_TRUE(p.cp.spare_waits(4));
  EXPECT_EQ(p.cp.peer_of(1), 1u);
  // A rank that left is not taken over: its process was done with the job.
  p.cp.on_peer_message_st(3, leave(3), 600);
  EXPECT_FALSE(p.cp.check_spares_st(1000));
  EXPECT_TRUE(p.cp.spare_waits(4));
  // A spare that waits and dies is forgotten.
  p.cp.on_peer_lost_st(4, 1001);
  EXPECT_FALSE(p.cp.spare_waits(4));
}

TEST(ControlPlaneSpares, ARemovedRankGoesToASpareThatAnnouncesItselfLater) {
  SparePlane p;
  p.cp.on_peer_lost_st(3, 10);
  p.cp.take_replies_st();
  EXPECT_FALSE(p.cp.check_spares_st(500));  // no spare waits
  // The second spare announces itself: the rank is its at once.
  EXPECT_EQ(p.cp.on_peer_message_st(5, announce(), 501), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.take_replies_st().back().message.kind, ControlKind::kJoined);
  EXPECT_EQ(p.cp.peer_of(3), 5u);
  // A spare whose list is not the job's is refused alone.
  std::vector<TensorDecl> other = model();
  other[0].elements = 1;
  EXPECT_EQ(p.cp.on_peer_message_st(4, declare(agg::kSpareRank, other), 502),
            ControlVerdict::kTaken);
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 4u);
  EXPECT_NE(r[0].message.text.find("spare w4 cannot join the running job: its tensor list "
                                   "differs"),
            std::string::npos)
      << r[0].message.text;
  EXPECT_FALSE(p.cp.spare_waits(4));
}

TEST(ControlPlaneSpares, AnotherServerTakesTheSpareInWhenItDeclaresItsRank) {
  SparePlane p(/*server0=*/false);
  // Spares announce themselves to server 0 only.
  EXPECT_EQ(p.cp.on_peer_message_st(4, announce(), 2), ControlVerdict::kTaken);
  EXPECT_EQ(p.cp.take_replies_st().back().message.kind, ControlKind::kRefused);
  // Server 0 gave it rank 1, which this server has not named lost yet.
  EXPECT_EQ(p.cp.on_peer_message_st(4, declare(1), 3), ControlVerdict::kTaken);
  const std::vector<ControlReply> r = p.cp.take_replies_st();
  using K = std::pair<uint16_t, ControlKind>;
  EXPECT_EQ(kinds(r), (std::vector<K>{{0, ControlKind::kWorkerGone},
                                      {2, ControlKind::kWorkerGone},
                                      {3, ControlKind::kWorkerGone},
                                      {0, ControlKind::kWorkerJoined},
                                      {2, ControlKind::kWorkerJoined},
                                      {3, ControlKind::kWorkerJoined},
                                      {4, ControlKind::kJoined}}));
  EXPECT_EQ(r[0].message.text,
            "worker w1 (rank 1) was taken over by spare w4: removed from the job, which goes on "
            "with 3 ranks");
  EXPECT_EQ(r[6].message.rank, 1u);
  EXPECT_EQ(p.cp.peer_of(1), 4u);
  EXPECT_EQ(p.cp.counters().spares_joined, 1u);
}

}  // namespace
}  // namespace mercury::server
