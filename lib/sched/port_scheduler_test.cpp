// Single-threaded behaviour of PortScheduler: order, preemption, eligibility,
// retransmissions, back-pressure and completion, in every mode.
#include "sched/port_scheduler.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

namespace mercury::sched {
namespace {

constexpr uint32_t kPayload = 1416;
const PeerMask kAll = PeerMask::first(kMaxPeers);

struct Completions {
  std::vector<uint64_t> cookies;
  static void record(void* self, const Message& msg) {
    static_cast<Completions*>(self)->cookies.push_back(msg.cookie);
  }
};

class SchedTest : public ::testing::Test {
 protected:
  void build(SchedulerConfig c) {
    config_ = c;
    sched_.emplace(c, pool_, &Completions::record, &done_);
  }
  PortScheduler& s() { return *sched_; }

  Message* make(uint16_t peer, uint8_t priority, uint32_t len, uint64_t cookie) {
    Message* m = pool_.alloc();
    EXPECT_NE(m, nullptr);
    m->peer = peer;
    m->priority = priority;
    m->len = len;
    m->cookie = cookie;
    return m;
  }
  Message* submit(uint16_t peer, uint8_t priority, uint32_t len, uint64_t cookie) {
    Message* m = make(peer, priority, len, cookie);
    EXPECT_TRUE(s().submit(m));
    return m;
  }
  Slice next(const PeerMask& eligible = kAll) {
    Slice out;
    EXPECT_TRUE(s().next_slice_st(eligible, kPayload, out));
    return out;
  }
  bool none(const PeerMask& eligible = kAll) {
    Slice out;
    return !s().next_slice_st(eligible, kPayload, out);
  }
  // Carves everything eligible; returns the slices in order.
  std::vector<Slice> carve_all(const PeerMask& eligible = kAll) {
    std::vector<Slice> out;
    Slice sl;
    while (s().next_slice_st(eligible, kPayload, sl)) out.push_back(sl);
    return out;
  }

  MessagePool pool_{64};
  Completions done_;
  SchedulerConfig config_;
  std::optional<PortScheduler> sched_;
};

SchedulerConfig strict(uint16_t peers = 4) {
  SchedulerConfig c;
  c.mode = Mode::kStrict;
  c.num_peers = peers;
  return c;
}

TEST(SchedMode, ParsesConfigNames) {
  EXPECT_EQ(parse_mode("strict"), Mode::kStrict);
  EXPECT_EQ(parse_mode("fifo"), Mode::kFifo);
  EXPECT_EQ(parse_mode("partition"), Mode::kPartition);
  EXPECT_EQ(parse_mode("Strict"), std::nullopt);
  EXPECT_EQ(parse_mode(""), std::nullopt);
  for (Mode m : {Mode::kStrict, Mode::kFifo, Mode::kPartition})
    EXPECT_EQ(parse_mode(to_string(m)), m);
}

TEST(SchedConfig, RejectsBadConfigWithReason) {
  MessagePool pool(1);
  SchedulerConfig c;
  c.num_peers = 0;
  EXPECT_THROW(PortScheduler(c, pool), std::invalid_argument);
  c.num_peers = 257;
  EXPECT_THROW(PortScheduler(c, pool), std::invalid_argument);
  c = SchedulerConfig{};
  c.ingress_capacity = 0;
  EXPECT_THROW(PortScheduler(c, pool), std::invalid_argument);
  c = SchedulerConfig{};
  c.mode = Mode::kPartition;
  c.partition_bytes = 1 << 20;
  c.credit_bytes = 1 << 19;
  try {
    PortScheduler p(c, pool);
    FAIL() << "credit < partition accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("credit_bytes"), std::string::npos) << e.what();
  }
}

TEST_F(SchedTest, StrictSendsMostUrgentFirstCarvingContiguously) {
  build(strict());
  Message* low = submit(0, 5, 3000, 1);
  Message* high = submit(0, 2, 2000, 2);
  EXPECT_EQ(s().drain_ingress_st(), 2u);
  const std::vector<Slice> got = carve_all();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].msg, high);
  EXPECT_EQ(got[0].offset, 0u);
  EXPECT_EQ(got[0].len, kPayload);
  EXPECT_EQ(got[1].msg, high);
  EXPECT_EQ(got[1].offset, kPayload);
  EXPECT_EQ(got[1].len, 2000 - kPayload);
  uint32_t off = 0;
  for (size_t i = 2; i < 5; ++i) {
    EXPECT_EQ(got[i].msg, low);
    EXPECT_EQ(got[i].offset, off);
    EXPECT_FALSE(got[i].retransmit);
    EXPECT_EQ(got[i].kind, SliceKind::kData);
    off += got[i].len;
  }
  EXPECT_EQ(off, 3000u);
  EXPECT_FALSE(s().has_work_st());
}

TEST_F(SchedTest, StrictPreemptsAtTheNextPacketBoundaryAndResumes) {
  build(strict());
  Message* bulk = submit(0, 40, 100 * kPayload, 1);
  s().drain_ingress_st();
  EXPECT_EQ(next().offset, 0u);
  EXPECT_EQ(next().offset, kPayload);
  Message* urgent = submit(0, 0, 2 * kPayload, 2);
  s().drain_ingress_st();
  EXPECT_EQ(next().msg, urgent);
  EXPECT_EQ(next().msg, urgent);
  const Slice resumed = next();
  EXPECT_EQ(resumed.msg, bulk);
  EXPECT_EQ(resumed.offset, 2 * kPayload);  // exactly where it stopped
}

TEST_F(SchedTest, RoundRobinAcrossPeersWithinALevelFifoWithinAPeer) {
  build(strict());
  Message* a1 = submit(0, 4, 2 * kPayload, 1);
  Message* b1 = submit(1, 4, 2 * kPayload, 2);
  Message* a2 = submit(0, 4, kPayload, 3);
  Message* c1 = submit(2, 4, kPayload, 4);
  s().drain_ingress_st();
  std::vector<Message*> order;
  for (const Slice& sl : carve_all()) order.push_back(sl.msg);
  // Peers take turns packet by packet; peer 0's messages go one after the other.
  const std::vector<Message*> want = {a1, b1, c1, a1, b1, a2};
  EXPECT_EQ(order, want);
}

TEST_F(SchedTest, IneligiblePeerWaitsWhileOthersProceed) {
  build(strict());
  Message* blocked = submit(0, 0, 3 * kPayload, 1);  // most urgent, but its window is shut
  Message* other = submit(1, 9, 2 * kPayload, 2);
  s().drain_ingress_st();
  PeerMask only1;
  only1.set(1);
  const std::vector<Slice> first = carve_all(only1);
  ASSERT_EQ(first.size(), 2u);
  for (const Slice& sl : first) EXPECT_EQ(sl.msg, other);
  EXPECT_TRUE(s().has_work_st());
  const std::vector<Slice> rest = carve_all(kAll);
  ASSERT_EQ(rest.size(), 3u);
  uint32_t off = 0;
  for (const Slice& sl : rest) {
    EXPECT_EQ(sl.msg, blocked);
    EXPECT_EQ(sl.offset, off);
    off += sl.len;
  }
}

TEST_F(SchedTest, StrictRetransmissionGoesBeforeNewDataOfItsLevelOnly) {
  build(strict());
  Message* a = submit(0, 3, 4 * kPayload, 1);
  s().drain_ingress_st();
  const Slice a0 = next();
  const Slice a1 = next();
  Message* b = submit(0, 1, kPayload, 2);  // more urgent than the resend's level
  Message* c = submit(0, 3, kPayload, 3);  // same level, newer
  s().drain_ingress_st();
  ASSERT_TRUE(s().requeue_st(a1));
  ASSERT_TRUE(s().requeue_st(a0));
  const std::vector<Slice> got = carve_all();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[0].msg, b);
  EXPECT_FALSE(got[0].retransmit);
  // Resends in requeue order, ahead of a's and c's new data.
  EXPECT_EQ(got[1].msg, a);
  EXPECT_TRUE(got[1].retransmit);
  EXPECT_EQ(got[1].offset, a1.offset);
  EXPECT_EQ(got[2].msg, a);
  EXPECT_TRUE(got[2].retransmit);
  EXPECT_EQ(got[2].offset, a0.offset);
  EXPECT_EQ(got[3].msg, a);
  EXPECT_EQ(got[3].offset, 2 * kPayload);
  EXPECT_FALSE(got[3].retransmit);
  EXPECT_EQ(got[5].msg, c);
  EXPECT_EQ(s().stats_st().retransmit_slices, 2u);
}

TEST_F(SchedTest, FifoRetransmissionGoesBeforeAllNewData) {
  SchedulerConfig c = strict();
  c.mode = Mode::kFifo;
  build(c);
  Message* a = submit(0, 9, 2 * kPayload, 1);
  s().drain_ingress_st();
  const Slice a0 = next();
  submit(0, 0, kPayload, 2);
  s().drain_ingress_st();
  ASSERT_TRUE(s().requeue_st(a0));
  const Slice again = next();
  EXPECT_EQ(again.msg, a);
  EXPECT_TRUE(again.retransmit);
  EXPECT_EQ(again.offset, 0u);
}

TEST_F(SchedTest, RetransmissionHonoursEligibility) {
  build(strict());
  Message* a = submit(0, 3, kPayload, 1);
  Message* b = submit(1, 3, kPayload, 2);
  s().drain_ingress_st();
  const Slice sa = next();
  const Slice sb = next();
  ASSERT_EQ(sa.msg, a);
  ASSERT_EQ(sb.msg, b);
  ASSERT_TRUE(s().requeue_st(sa));
  PeerMask only1;
  only1.set(1);
  EXPECT_TRUE(none(only1));
  ASSERT_TRUE(s().requeue_st(sb));
  EXPECT_EQ(next(only1).msg, b);
  EXPECT_EQ(next().msg, a);
}

TEST_F(SchedTest, FifoIgnoresPriorityAndFinishesTheCurrentMessage) {
  SchedulerConfig c = strict();
  c.mode = Mode::kFifo;
  build(c);
  Message* first = submit(0, 60, 3 * kPayload, 1);
  s().drain_ingress_st();
  next();
  Message* urgent = submit(0, 0, kPayload, 2);
  s().drain_ingress_st();
  EXPECT_EQ(next().msg, first);
  EXPECT_EQ(next().msg, first);
  EXPECT_EQ(next().msg, urgent);
}

TEST_F(SchedTest, IngressFullReturnsFalseCleanly) {
  SchedulerConfig c = strict();
  c.ingress_capacity = 3;
  build(c);
  for (int i = 0; i < 3; ++i) submit(0, 1, 10, i);
  Message* extra = make(0, 1, 10, 99);
  EXPECT_FALSE(s().submit(extra));
  EXPECT_FALSE(s().submit(extra));
  EXPECT_EQ(s().stats_st().submit_full, 2u);
  EXPECT_EQ(s().drain_ingress_st(), 3u);
  EXPECT_TRUE(s().submit(extra));  // room again; the refused message was not half-queued
  EXPECT_EQ(s().drain_ingress_st(), 1u);
  EXPECT_EQ(carve_all().size(), 4u);
}

TEST_F(SchedTest, InvalidSubmitIsRefusedAndCounted) {
  build(strict(2));
  EXPECT_FALSE(s().submit(nullptr));
  EXPECT_FALSE(s().submit(make(2, 0, 1, 0)));   // peer out of range
  EXPECT_FALSE(s().submit(make(0, 64, 1, 0)));  // priority out of range
  EXPECT_EQ(s().stats_st().submit_invalid, 3u);
  EXPECT_EQ(s().drain_ingress_st(), 0u);
}

TEST_F(SchedTest, RequeueFullAndInvalidAreRefused) {
  SchedulerConfig c = strict();
  c.max_retransmits = 2;
  build(c);
  submit(0, 1, 3 * kPayload, 1);
  s().drain_ingress_st();
  const Slice a = next(), b = next(), d = next();
  EXPECT_TRUE(s().requeue_st(a));
  EXPECT_TRUE(s().requeue_st(b));
  EXPECT_FALSE(s().requeue_st(d));
  EXPECT_EQ(s().stats_st().requeue_full, 1u);
  Message* stray = make(0, 0, 1, 5);  // never submitted
  EXPECT_FALSE(s().requeue_st(Slice{stray, 0, 1, false, SliceKind::kData}));
  EXPECT_EQ(s().stats_st().requeue_invalid, 1u);
  EXPECT_EQ(next().offset, a.offset);
  EXPECT_TRUE(s().requeue_st(d));  // a slot came free
}

TEST_F(SchedTest, CompletionFiresOnceWhenFullyAckedAndDescriptorReturns) {
  build(strict());
  Message* m = submit(0, 1, 3000, 0xabc);
  s().drain_ingress_st();
  const std::vector<Slice> got = carve_all();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(s().on_acked_st(m, got[0].len));
  EXPECT_FALSE(s().on_acked_st(m, got[2].len));
  EXPECT_TRUE(done_.cookies.empty());
  EXPECT_TRUE(s().on_acked_st(m, got[1].len));
  EXPECT_EQ(done_.cookies, std::vector<uint64_t>{0xabc});
  EXPECT_EQ(s().stats_st().released, 1u);
  // The descriptor is back: the pool can hand out all 64 again.
  std::vector<Message*> all;
  while (Message* x = pool_.alloc()) all.push_back(x);
  EXPECT_EQ(all.size(), 64u);
}

TEST_F(SchedTest, ZeroLengthMessageIsOneEmptySlice) {
  build(strict());
  Message* m = submit(3, 7, 0, 5);
  s().drain_ingress_st();
  const std::vector<Slice> got = carve_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].msg, m);
  EXPECT_EQ(got[0].len, 0u);
  EXPECT_TRUE(s().on_acked_st(m, 0));
  EXPECT_EQ(done_.cookies.size(), 1u);
}

// A 0-byte message whose empty packet was lost: its resend goes out, and it
// completes only when that is acknowledged. (0 >= 0 bytes acked once made the
// resend look acked already: the scheduler dropped it and completed the
// message, delivered to nobody, and the transport later resent the lost
// packet under whatever message reused the descriptor. Found by
// fuzz_endpoint.)
TEST_F(SchedTest, ALostZeroLengthMessageIsResentAndCompletesOnlyWhenAcked) {
  build(strict());
  Message* m = submit(2, 3, 0, 11);
  s().drain_ingress_st();
  const Slice sl = next();
  ASSERT_EQ(sl.len, 0u);
  ASSERT_TRUE(s().requeue_st(sl));  // its packet was lost
  const Slice again = next();       // the resend is served, not skipped
  EXPECT_EQ(again.msg, m);
  EXPECT_TRUE(again.retransmit);
  EXPECT_EQ(s().stats_st().retransmit_skipped, 0u);
  EXPECT_TRUE(done_.cookies.empty());
  EXPECT_TRUE(s().on_acked_st(m, 0));  // the resend's ack
  EXPECT_EQ(done_.cookies, std::vector<uint64_t>{11});
}

TEST_F(SchedTest, AckWhileResendQueuedDropsTheResendThenReleases) {
  build(strict());
  Message* m = submit(0, 1, kPayload, 9);
  s().drain_ingress_st();
  const Slice sl = next();
  ASSERT_TRUE(s().requeue_st(sl));           // a spurious timeout
  EXPECT_FALSE(s().on_acked_st(m, sl.len));  // the original's ack arrives
  EXPECT_TRUE(done_.cookies.empty());        // still referenced by the resend queue
  EXPECT_FALSE(s().release_st(m));           // refused for the same reason
  EXPECT_EQ(s().stats_st().release_refused, 1u);
  EXPECT_TRUE(none());  // the resend is dropped, not sent
  EXPECT_EQ(s().stats_st().retransmit_skipped, 1u);
  EXPECT_EQ(done_.cookies, std::vector<uint64_t>{9});
}

TEST_F(SchedTest, ReleaseRefusedWhileQueuedAllowedOnceCarved) {
  build(strict());
  Message* m = submit(0, 1, 2 * kPayload, 4);
  s().drain_ingress_st();
  next();
  EXPECT_FALSE(s().release_st(m));
  next();
  EXPECT_TRUE(s().release_st(m));  // e.g. the peer was declared dead
  EXPECT_EQ(done_.cookies, std::vector<uint64_t>{4});
}

// ------------------------------------------------------------ partition mode

SchedulerConfig partition(uint32_t s_bytes, uint32_t c_bytes) {
  SchedulerConfig c = strict();
  c.mode = Mode::kPartition;
  c.partition_bytes = s_bytes;
  c.credit_bytes = c_bytes;
  return c;
}

TEST_F(SchedTest, PartitionStartsThenSendsDataOnlyWhenReady) {
  build(partition(4096, 8192));
  Message* m = submit(0, 2, 10000, 1);
  s().drain_ingress_st();
  const Slice st0 = next();
  EXPECT_EQ(st0.kind, SliceKind::kPartitionStart);
  EXPECT_EQ(st0.offset, 0u);
  EXPECT_EQ(st0.len, 0u);
  const Slice st1 = next();
  EXPECT_EQ(st1.kind, SliceKind::kPartitionStart);
  EXPECT_EQ(st1.offset, 4096u);
  EXPECT_EQ(s().credit_in_use_st(), 8192u);
  EXPECT_TRUE(none());  // credit spent, nothing ready
  s().partition_ready_st(m);
  std::vector<Slice> part0 = carve_all();
  ASSERT_EQ(part0.size(), 3u);  // 1416 + 1416 + 1264: stops at the partition end
  EXPECT_EQ(part0.back().offset + part0.back().len, 4096u);
  s().partition_ready_st(m);
  std::vector<Slice> part1 = carve_all();
  ASSERT_EQ(part1.size(), 3u);
  EXPECT_EQ(part1.front().offset, 4096u);
  // Credit returns when a partition's last byte is acked, not before.
  s().on_acked_st(m, 4000);
  EXPECT_EQ(s().credit_in_use_st(), 8192u);
  EXPECT_TRUE(none());
  s().on_acked_st(m, 96);
  EXPECT_EQ(s().credit_in_use_st(), 4096u);
  const Slice st2 = next();
  EXPECT_EQ(st2.kind, SliceKind::kPartitionStart);
  EXPECT_EQ(st2.offset, 8192u);
  EXPECT_EQ(s().credit_in_use_st(), 4096u + (10000 - 8192));
  s().partition_ready_st(m);
  std::vector<Slice> part2 = carve_all();
  ASSERT_EQ(part2.size(), 2u);
  EXPECT_EQ(part2.back().offset + part2.back().len, 10000u);
  EXPECT_TRUE(s().on_acked_st(m, 10000 - 4096));
  EXPECT_EQ(s().credit_in_use_st(), 0u);
  EXPECT_EQ(done_.cookies.size(), 1u);
}

TEST_F(SchedTest, PartitionIsNotPreemptedInsideAndStartsByPriority) {
  build(partition(4 * kPayload, 4 * kPayload));
  Message* bulk = submit(0, 30, 40 * kPayload, 1);
  s().drain_ingress_st();
  ASSERT_EQ(next().kind, SliceKind::kPartitionStart);
  s().partition_ready_st(bulk);
  EXPECT_EQ(next().offset, 0u);
  Message* urgent = submit(0, 0, kPayload, 2);
  s().drain_ingress_st();
  // No credit for the urgent partition; the started one is sent whole.
  for (uint32_t i = 1; i < 4; ++i) {
    const Slice sl = next();
    EXPECT_EQ(sl.msg, bulk);
    EXPECT_EQ(sl.offset, i * kPayload);
  }
  EXPECT_TRUE(none());
  s().on_acked_st(bulk, 4 * kPayload);
  // Credit is back: the most urgent unstarted partition starts, not bulk's next.
  const Slice st = next();
  EXPECT_EQ(st.msg, urgent);
  EXPECT_EQ(st.kind, SliceKind::kPartitionStart);
}

TEST_F(SchedTest, PartitionZeroLengthMessageStillPaysItsStartUp) {
  build(partition(4096, 4096));
  Message* m = submit(1, 0, 0, 3);
  s().drain_ingress_st();
  EXPECT_EQ(next().kind, SliceKind::kPartitionStart);
  EXPECT_TRUE(none());
  s().partition_ready_st(m);
  const Slice d = next();
  EXPECT_EQ(d.kind, SliceKind::kData);
  EXPECT_EQ(d.len, 0u);
  EXPECT_TRUE(s().on_acked_st(m, 0));
}

}  // namespace
}  // namespace mercury::sched
