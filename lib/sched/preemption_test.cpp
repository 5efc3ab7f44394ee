// Preemption behind a 256 MiB low-priority backlog, in the TX loop of
// docs/sched.md (sim_link.h: acks after D packet-times, window W, burst B).
// Strict must preempt within the head-of-line bound; fifo must not preempt;
// partition must preempt only at partition boundaries.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "sched/port_scheduler.h"
#include "sched/sim_link.h"

namespace mercury::sched {
namespace {

constexpr uint32_t kBacklog = 256u << 20;
constexpr uint32_t kUrgentLen = 64 * 1024;

struct Outcome {
  uint64_t low_after = 0;          // backlog packets sent after the urgent submit, before its first
  uint64_t low_in_flight = 0;      // backlog packets un-acked at the urgent submit
  uint32_t backlog_at_first = 0;   // backlog bytes carved when the urgent's first data went
  uint32_t index_in_burst = 0;     // where in its burst the urgent submit happened
  uint64_t sent_before = 0;        // backlog packets sent before the urgent submit
  uint64_t wait_packets = 0;       // packet-times from urgent submit to its first data packet
  bool urgent_contiguous = true;   // no backlog packet inside the urgent message's packets
  bool backlog_contiguous = true;  // every backlog byte carved once, in order
  bool partition_whole = true;     // no other data inside a started backlog partition
  uint64_t cookies_done = 0;
};

struct Scenario {
  Mode mode;
  sim::LinkParams link;
  uint32_t partition_bytes = 0;
  uint32_t credit_bytes = 0;
  uint64_t inject_after_packets;  // backlog packets sent before the urgent submit
  uint32_t inject_index;          // ... at this index of a burst (or the next burst that has it)
};

Outcome run(const Scenario& sc) {
  MessagePool pool(8);
  SchedulerConfig c;
  c.mode = sc.mode;
  c.num_peers = 2;
  if (sc.mode == Mode::kPartition) {
    c.partition_bytes = sc.partition_bytes;
    c.credit_bytes = sc.credit_bytes;
  }
  Outcome o;
  PortScheduler sched(
      c, pool, [](void* ctx, const Message&) { ++static_cast<Outcome*>(ctx)->cookies_done; }, &o);
  sim::SimLink link(sched, sc.link);

  Message* backlog = pool.alloc();
  backlog->len = kBacklog;  // descriptors only: the scheduler never reads the bytes
  backlog->priority = 50;
  backlog->peer = 0;
  EXPECT_TRUE(sched.submit(backlog));
  Message* urgent = pool.alloc();
  urgent->len = kUrgentLen;
  urgent->priority = 0;
  urgent->peer = 0;

  uint64_t backlog_sent = 0;
  uint32_t backlog_next = 0;
  bool injected = false, urgent_started = false, urgent_done = false;
  uint64_t inject_time = 0;
  uint32_t urgent_next = 0;
  bool in_partition = false;  // a started backlog partition is part-way through
  auto on_slice = [&](const Slice& s, uint64_t now, uint32_t index) {
    if (s.kind != SliceKind::kData) return;
    if (s.msg == backlog) {
      if (s.offset != backlog_next) o.backlog_contiguous = false;
      backlog_next = s.offset + s.len;
      in_partition = sc.mode == Mode::kPartition && backlog_next % sc.partition_bytes != 0;
      if (urgent_started && !urgent_done) o.urgent_contiguous = false;
      if (injected && !urgent_started) ++o.low_after;
      ++backlog_sent;
    } else {
      if (in_partition) o.partition_whole = false;
      if (!urgent_started) {
        urgent_started = true;
        o.backlog_at_first = backlog_next;
        o.wait_packets = now - inject_time;
      }
      if (s.offset != urgent_next) o.urgent_contiguous = false;
      urgent_next = s.offset + s.len;
      urgent_done = urgent_next == kUrgentLen;
    }
    if (!injected && backlog_sent >= sc.inject_after_packets && index == sc.inject_index) {
      // A producer on another core submits between two packets of this burst.
      EXPECT_TRUE(sched.submit(urgent));
      injected = true;
      inject_time = now + 1;
      o.index_in_burst = index;
      o.sent_before = backlog_sent;
      o.low_in_flight = link.count_in_flight([&](const Slice& f) { return f.msg == backlog; });
    }
  };
  EXPECT_TRUE(link.run_until_idle(on_slice, 10'000'000));
  EXPECT_TRUE(injected);
  EXPECT_TRUE(urgent_done);
  EXPECT_EQ(backlog_next, kBacklog);
  return o;
}

sim::LinkParams link(uint32_t window, uint32_t burst, uint32_t delay) {
  return sim::LinkParams{window, burst, delay, 1416};
}

// Open window (W > in-flight needed for D) and a shut one (W < D): strict
// sends at most the rest of the current burst before the urgent message, and
// at most W + B backlog packets are ever ahead of it, whatever the backlog.
TEST(Preemption, StrictPreemptsA256MiBBacklogWithinTheHolBound) {
  std::mt19937 rng(7);
  for (const sim::LinkParams& lp : {link(64, 32, 32), link(16, 32, 40), link(128, 8, 16)}) {
    for (int trial = 0; trial < 2; ++trial) {
      Scenario sc{Mode::kStrict, lp};
      sc.inject_after_packets = 500 + rng() % 5000;
      // A window-limited link is ack-clocked: bursts of one packet.
      sc.inject_index = lp.window < lp.ack_delay ? 0 : rng() % lp.burst;
      const Outcome o = run(sc);
      SCOPED_TRACE(testing::Message() << "W=" << lp.window << " B=" << lp.burst
                                      << " D=" << lp.ack_delay << " index=" << sc.inject_index);
      EXPECT_LE(o.low_after, lp.burst - 1 - o.index_in_burst);  // the rest of this burst only
      EXPECT_LE(o.low_in_flight + o.low_after, lp.window + lp.burst);
      EXPECT_TRUE(o.urgent_contiguous);
      EXPECT_TRUE(o.backlog_contiguous);
      EXPECT_EQ(o.cookies_done, 2u);
    }
  }
}

TEST(Preemption, FifoDoesNotPreemptItFinishesTheBacklog) {
  Scenario sc{Mode::kFifo, link(64, 32, 32)};
  sc.inject_after_packets = 1000;
  sc.inject_index = 5;
  const Outcome o = run(sc);
  EXPECT_EQ(o.backlog_at_first, kBacklog);  // the urgent message waited for the last byte
  const uint64_t total = (uint64_t{kBacklog} + 1415) / 1416;
  EXPECT_EQ(o.low_after, total - o.sent_before);
  EXPECT_TRUE(o.backlog_contiguous);
  EXPECT_EQ(o.cookies_done, 2u);
}

TEST(Preemption, PartitionPreemptsOnlyAtPartitionBoundaries) {
  for (uint32_t s_bytes : {4u << 20, 1u << 20}) {
    for (uint32_t credit_parts : {1u, 2u}) {
      Scenario sc{Mode::kPartition, link(64, 32, 32), s_bytes, credit_parts * s_bytes};
      sc.inject_after_packets = 4000;  // mid-partition for both sizes
      sc.inject_index = 3;
      const Outcome o = run(sc);
      SCOPED_TRACE(testing::Message() << "S=" << s_bytes << " C=" << sc.credit_bytes);
      EXPECT_EQ(o.backlog_at_first % s_bytes, 0u);  // the started partition went whole
      EXPECT_TRUE(o.partition_whole);
      EXPECT_LT(o.backlog_at_first, kBacklog);  // but it did preempt the backlog
      // Everything started before credit freed, and no more: <= C bytes of
      // backlog (plus the burst in progress) ahead of the urgent data.
      const uint64_t bound = (uint64_t{sc.credit_bytes} + 1415) / 1416 + credit_parts + 32;
      EXPECT_LE(o.low_after, bound);
      EXPECT_GT(o.low_after, 32u);  // far more than strict's bound: this is the cost
      EXPECT_TRUE(o.urgent_contiguous);
      EXPECT_TRUE(o.backlog_contiguous);
      EXPECT_EQ(o.cookies_done, 2u);
    }
  }
}

// The burst API with per-peer room (the window) must give the very same
// schedule as slice-by-slice carving: every outcome, to the packet.
TEST(Preemption, BurstApiGivesTheSameScheduleInEveryMode) {
  auto same = [](Scenario sc) {
    const Outcome single = run(sc);
    sc.link.burst_api = true;
    const Outcome burst = run(sc);
    EXPECT_EQ(burst.low_after, single.low_after);
    EXPECT_EQ(burst.low_in_flight, single.low_in_flight);
    EXPECT_EQ(burst.backlog_at_first, single.backlog_at_first);
    EXPECT_EQ(burst.sent_before, single.sent_before);
    EXPECT_EQ(burst.wait_packets, single.wait_packets);
    EXPECT_TRUE(burst.urgent_contiguous);
    EXPECT_TRUE(burst.backlog_contiguous);
    EXPECT_EQ(burst.partition_whole, single.partition_whole);
    EXPECT_EQ(burst.cookies_done, 2u);
  };
  Scenario strict{Mode::kStrict, link(16, 32, 40)};
  strict.inject_after_packets = 3000;
  strict.inject_index = 0;
  same(strict);
  Scenario strict_open{Mode::kStrict, link(64, 32, 32)};
  strict_open.inject_after_packets = 2000;
  strict_open.inject_index = 7;
  same(strict_open);
  Scenario partition{Mode::kPartition, link(64, 32, 32), 1u << 20, 2u << 20};
  partition.inject_after_packets = 4000;
  partition.inject_index = 3;
  same(partition);
}

}  // namespace
}  // namespace mercury::sched
