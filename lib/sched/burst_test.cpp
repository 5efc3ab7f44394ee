// next_slices_st() against next_slice_st(): a differential test. Two
// schedulers get the same random workload (submits, bursts over random
// eligible sets with and without per-peer room, acks, partition start-ups,
// losses requeued); one is carved slice by slice, the other in bursts. The
// slice sequences, the peers left eligible, the rooms, the stats and the
// completions must be identical, in every mode. The burst side is also
// acknowledged the way a transport acknowledges a burst (bytes summed per
// message, one on_acked_st() per message per ACK), so that path is checked
// against per-packet acks too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "sched/port_scheduler.h"

namespace mercury::sched {
namespace {

struct Recorder {
  std::vector<uint64_t> cookies;
  static void record(void* self, const Message& msg) {
    static_cast<Recorder*>(self)->cookies.push_back(msg.cookie);
  }
};

// One side of the comparison: a scheduler, its pool and what it completed.
struct Side {
  explicit Side(const SchedulerConfig& c) : sched(c, pool, &Recorder::record, &done) {}
  MessagePool pool{512};
  Recorder done;
  PortScheduler sched;
};

// A slice as both sides can compare it: the message by its cookie.
struct Seen {
  uint64_t cookie;
  uint32_t offset, len;
  bool retransmit;
  SliceKind kind;
  uint16_t peer;
  bool operator==(const Seen&) const = default;
};
Seen seen(const Slice& s) {
  EXPECT_EQ(s.peer, s.msg->peer);
  return {s.msg->cookie, s.offset, s.len, s.retransmit, s.kind, s.peer};
}

std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << "{msg " << s.cookie << " @" << s.offset << "+" << s.len
            << (s.retransmit ? " rtx" : "") << (s.kind == SliceKind::kData ? "" : " start") << "}";
}

void expect_same_stats(const SchedulerStats& a, const SchedulerStats& b) {
  EXPECT_EQ(a.drained, b.drained);
  EXPECT_EQ(a.data_slices, b.data_slices);
  EXPECT_EQ(a.retransmit_slices, b.retransmit_slices);
  EXPECT_EQ(a.partition_starts, b.partition_starts);
  EXPECT_EQ(a.released, b.released);
  EXPECT_EQ(a.retransmit_skipped, b.retransmit_skipped);
  EXPECT_EQ(a.requeue_full, b.requeue_full);
}

struct Workload {
  Mode mode;
  uint16_t peers;
  unsigned levels;  // priorities drawn from [0, levels)
  uint32_t seed;
};

void run(const Workload& w) {
  SCOPED_TRACE(testing::Message() << "mode=" << to_string(w.mode) << " peers=" << w.peers
                                  << " levels=" << w.levels << " seed=" << w.seed);
  std::mt19937 rng(w.seed);
  SchedulerConfig c;
  c.mode = w.mode;
  c.num_peers = w.peers;
  c.partition_bytes = 5000;  // a few packets per partition at the payloads below
  c.credit_bytes = 12000;
  Side a(c), b(c);
  // Packets sent and not yet acked or lost: the same slice as each side saw it.
  struct Flight {
    Slice a, b;
  };
  std::vector<Flight> flight;
  uint64_t next_cookie = 1;
  const uint32_t payload = 100 + rng() % 1400;

  auto submit_some = [&] {
    for (int i = rng() % 4; i >= 0; --i) {
      // One draw per statement: the workload must not depend on the
      // compiler's order of evaluation.
      const bool empty = rng() % 8 == 0;
      const uint32_t packets = rng() % 2 ? 3 : 40;
      const uint32_t len = empty ? 0 : rng() % (payload * packets + 1);
      const auto priority = static_cast<uint8_t>(rng() % w.levels);
      const auto peer = static_cast<uint16_t>(rng() % w.peers);
      Message* ma = a.pool.alloc();
      Message* mb = b.pool.alloc();
      if (ma == nullptr || mb == nullptr) return;  // both pools drain alike
      for (Message* m : {ma, mb}) {
        m->len = len;
        m->priority = priority;
        m->peer = peer;
        m->cookie = next_cookie;
      }
      ++next_cookie;
      ASSERT_TRUE(a.sched.submit(ma));
      ASSERT_TRUE(b.sched.submit(mb));
    }
  };

  auto burst = [&](bool all) {
    PeerMask eligible;
    for (unsigned p = 0; p < w.peers; ++p) {
      if (all || rng() % 3 != 0) eligible.set(p);
    }
    const bool with_room = !all && rng() % 2 == 0;
    std::vector<uint32_t> room(w.peers, 0);
    for (unsigned p = 0; p < w.peers; ++p) {
      if (eligible.test(p)) room[p] = 1 + rng() % 12;
    }
    const size_t n = all ? 64 : 1 + rng() % 48;
    // Reference: n single calls, a full peer leaving the eligible set.
    PeerMask elig_a = eligible;
    std::vector<uint32_t> room_a = room;
    std::vector<Slice> out_a;
    Slice s;
    while (out_a.size() < n && a.sched.next_slice_st(elig_a, payload, s)) {
      out_a.push_back(s);
      if (with_room && --room_a[s.msg->peer] == 0) elig_a.reset(s.msg->peer);
    }
    // Burst.
    PeerMask elig_b = eligible;
    std::vector<uint32_t> room_b = room;
    std::vector<Slice> out_b(n);
    const size_t got = with_room
                           ? b.sched.next_slices_st(elig_b, payload, out_b.data(), n, room_b.data())
                           : b.sched.next_slices_st(elig_b, payload, out_b.data(), n);
    out_b.resize(got);
    std::vector<Seen> seen_a, seen_b;
    for (const Slice& x : out_a) seen_a.push_back(seen(x));
    for (const Slice& x : out_b) seen_b.push_back(seen(x));
    ASSERT_EQ(seen_a, seen_b) << "n=" << n << " room=" << with_room;
    EXPECT_EQ(elig_a, elig_b);
    if (with_room) {
      EXPECT_EQ(room_a, room_b);
    }
    for (size_t i = 0; i < got; ++i) flight.push_back({out_a[i], out_b[i]});
  };

  // Acks a random subset of the packets in flight: per packet on side a, as
  // the transport's ACK processing sums them (per message) on side b.
  auto ack_some = [&](bool all) {
    std::vector<Flight> keep;
    std::map<uint64_t, std::pair<Message*, uint32_t>> sums;  // b: bytes per message, by cookie
    for (const Flight& f : flight) {
      if (!all && rng() % 2 == 0) {
        keep.push_back(f);
        continue;
      }
      if (f.a.kind == SliceKind::kPartitionStart) {
        a.sched.partition_ready_st(f.a.msg);
        b.sched.partition_ready_st(f.b.msg);
        continue;
      }
      a.sched.on_acked_st(f.a.msg, f.a.len);
      auto& sum = sums[f.b.msg->cookie];
      sum.first = f.b.msg;
      sum.second += f.b.len;
    }
    for (const auto& [cookie, sum] : sums) b.sched.on_acked_st(sum.first, sum.second);
    flight = std::move(keep);
  };

  // A lost packet is requeued (it leaves the flight; its resend re-enters it).
  auto lose_some = [&] {
    for (size_t i = 0; i < flight.size();) {
      if (rng() % 6 != 0) {
        ++i;
        continue;
      }
      const bool ra = a.sched.requeue_st(flight[i].a);
      const bool rb = b.sched.requeue_st(flight[i].b);
      ASSERT_EQ(ra, rb);
      if (!ra) break;
      flight.erase(flight.begin() + static_cast<std::ptrdiff_t>(i));
    }
  };

  size_t checked = 0;  // completions compared so far
  for (int step = 0; step < 1500; ++step) {
    switch (rng() % 6) {
      case 0:
      case 1:
        submit_some();
        break;
      case 2:
        ack_some(false);
        break;
      case 3:
        lose_some();
        break;
      default:
        a.sched.drain_ingress_st();
        b.sched.drain_ingress_st();
        burst(false);
        break;
    }
    if (testing::Test::HasFatalFailure()) return;
    expect_same_stats(a.sched.stats_st(), b.sched.stats_st());
    EXPECT_EQ(a.sched.has_work_st(), b.sched.has_work_st());
    EXPECT_EQ(a.sched.credit_in_use_st(), b.sched.credit_in_use_st());
    // The same messages completed in this step (in an order that may differ
    // within one ACK).
    std::vector<uint64_t>& da = a.done.cookies;
    std::vector<uint64_t>& db = b.done.cookies;
    ASSERT_EQ(da.size(), db.size()) << "step " << step;
    std::sort(da.begin() + static_cast<std::ptrdiff_t>(checked), da.end());
    std::sort(db.begin() + static_cast<std::ptrdiff_t>(checked), db.end());
    ASSERT_EQ(da, db) << "step " << step;
    checked = da.size();
  }
  // Finish: everything goes out and is acked on both sides.
  a.sched.drain_ingress_st();
  b.sched.drain_ingress_st();
  for (int pass = 0; pass < 100000 && (!flight.empty() || a.sched.has_work_st()); ++pass) {
    burst(true);
    if (testing::Test::HasFatalFailure()) return;
    ack_some(true);
  }
  EXPECT_FALSE(a.sched.has_work_st());
  EXPECT_FALSE(b.sched.has_work_st());
  EXPECT_EQ(a.sched.stats_st().released, next_cookie - 1);
  EXPECT_EQ(b.sched.stats_st().released, next_cookie - 1);
  expect_same_stats(a.sched.stats_st(), b.sched.stats_st());
}

TEST(BurstDifferential, StrictSameSliceSequenceAsSingleCalls) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    run({Mode::kStrict, 1, 4, seed});
    run({Mode::kStrict, 3, 8, seed});
    run({Mode::kStrict, 70, 64, seed});  // peers across two mask words
    run({Mode::kStrict, 70, 2, seed});   // many peers per level: rounds of more than kMaxLanes
  }
}

TEST(BurstDifferential, FifoSameSliceSequenceAsSingleCalls) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    run({Mode::kFifo, 1, 4, seed});
    run({Mode::kFifo, 3, 64, seed});
    run({Mode::kFifo, 70, 8, seed});
  }
}

TEST(BurstDifferential, PartitionSameSliceSequenceAsSingleCalls) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    run({Mode::kPartition, 1, 4, seed});
    run({Mode::kPartition, 3, 8, seed});
    run({Mode::kPartition, 70, 64, seed});
  }
}

// The fast path itself: one message and one peer give one run of contiguous
// full slices, cut at the message's end, then the next message.
TEST(Burst, OneMessageIsCarvedAsOneContiguousRun) {
  MessagePool pool(4);
  PortScheduler sched(SchedulerConfig{}, pool);
  Message* m1 = pool.alloc();
  m1->len = 10 * 1000 + 7;
  Message* m2 = pool.alloc();
  m2->len = 1000;
  ASSERT_TRUE(sched.submit(m1));
  ASSERT_TRUE(sched.submit(m2));
  sched.drain_ingress_st();
  Slice out[32];
  ASSERT_EQ(sched.next_slices_st(PeerMask::first(1), 1000, out, 32), 12u);
  for (uint32_t i = 0; i < 11; ++i) {
    EXPECT_EQ(out[i].msg, m1);
    EXPECT_EQ(out[i].offset, i * 1000);
    EXPECT_EQ(out[i].len, i < 10 ? 1000u : 7u);
  }
  EXPECT_EQ(out[11].msg, m2);
  EXPECT_EQ(out[11].len, 1000u);
  EXPECT_EQ(sched.next_slices_st(PeerMask::first(1), 1000, out, 32), 0u);
  EXPECT_EQ(sched.next_slices_st(PeerMask::first(1), 0, out, 32), 0u);  // max_payload 0
  // Bulk acks: one call per message with the summed bytes completes each.
  EXPECT_TRUE(sched.on_acked_st(m1, 10 * 1000 + 7));
  EXPECT_TRUE(sched.on_acked_st(m2, 1000));
  EXPECT_EQ(sched.stats_st().released, 2u);
}

// Room: a peer whose budget runs out leaves the eligible set mid-burst and the
// rest of the burst goes to the others.
TEST(Burst, RoomRemovesAFullPeerAndTheBurstContinues) {
  MessagePool pool(4);
  SchedulerConfig c;
  c.num_peers = 2;
  PortScheduler sched(c, pool);
  Message* urgent = pool.alloc();
  urgent->len = 100 * 1000;
  urgent->peer = 0;
  urgent->priority = 0;
  Message* low = pool.alloc();
  low->len = 100 * 1000;
  low->peer = 1;
  low->priority = 9;
  ASSERT_TRUE(sched.submit(urgent));
  ASSERT_TRUE(sched.submit(low));
  sched.drain_ingress_st();
  PeerMask eligible = PeerMask::first(2);
  uint32_t room[2] = {3, 50};
  Slice out[8];
  ASSERT_EQ(sched.next_slices_st(eligible, 1000, out, 8, room), 8u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i].msg, urgent);
  for (int i = 3; i < 8; ++i) EXPECT_EQ(out[i].msg, low);
  EXPECT_FALSE(eligible.test(0));
  EXPECT_TRUE(eligible.test(1));
  EXPECT_EQ(room[0], 0u);
  EXPECT_EQ(room[1], 45u);
}

}  // namespace
}  // namespace mercury::sched
