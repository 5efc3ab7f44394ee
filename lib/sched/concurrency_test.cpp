// Many producers (oneTBB tasks) submit messages with random priorities, peers
// and sizes while the test thread is the port's TX core: it drains, carves
// with random eligibility masks and acks at once. Checked against an oracle
// that knows only what producers have published after submit() returned:
//  * every message is delivered exactly once, every byte range carved exactly
//    once, contiguously, in packets of at most max_payload;
//  * FIFO within (level, peer) in each producer's submission order (fifo
//    mode: within a peer, whatever the priority);
//  * strict mode: when a slice of level p is produced for an eligible peer,
//    no message of a more urgent level that was known submitted (hence
//    drained) and still pending exists for an eligible peer; and
//    next_slice_st() never says "nothing" while such a message exists.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "sched/port_scheduler.h"

namespace mercury::sched {
namespace {

constexpr int kProducers = 4;
constexpr uint32_t kPerProducer = 4000;
constexpr unsigned kPeers = 5;
constexpr unsigned kLevels = 12;  // few levels, so levels are shared and FIFO is tested
constexpr uint32_t kPayload = 1416;

struct Record {
  uint32_t len;
  uint16_t peer;
  uint8_t priority;
};

struct Tracking {
  uint32_t next = 0;  // next expected offset
  bool done = false;
  bool known = false;
};

class ConcurrentProducers : public ::testing::TestWithParam<Mode> {};

TEST_P(ConcurrentProducers, DeliverEverythingOnceInOrderWithStrictPriority) {
  const Mode mode = GetParam();
  MessagePool pool(256);
  SchedulerConfig c;
  c.mode = mode;
  c.num_peers = kPeers;
  c.ingress_capacity = 64;  // small: producers meet back-pressure and retry
  c.partition_bytes = 3 * kPayload;
  c.credit_bytes = 9 * kPayload;
  PortScheduler sched(c, pool);

  constexpr uint32_t kTotal = kProducers * kPerProducer;
  std::vector<Record> log(kTotal);  // [producer * kPerProducer + seq], written before publishing
  std::vector<std::atomic<uint32_t>> published(kProducers);  // value-initialised: 0
  std::atomic<uint64_t> refused{0};

  auto produce = [&](int p) {
    std::mt19937 rng(1000 + p);
    for (uint32_t i = 0; i < kPerProducer; ++i) {
      Message* m;
      while ((m = pool.alloc()) == nullptr) std::this_thread::yield();
      const uint32_t r = rng();
      const uint32_t len = r % 16 == 0 ? rng() % 40000 : rng() % 5000;
      m->len = len;
      m->peer = static_cast<uint16_t>(rng() % kPeers);
      m->priority = static_cast<uint8_t>(rng() % kLevels);
      m->msg_id = p * kPerProducer + i;
      log[m->msg_id] = Record{len, m->peer, m->priority};
      while (!sched.submit(m)) {
        refused.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::yield();
      }
      // Release pairs with the consumer's acquire: the log entry and the fact
      // that submit() returned are visible together.
      published[p].store(i + 1, std::memory_order_release);
    }
  };
  tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism, kProducers + 1);
  tbb::task_arena arena(kProducers, 0);
  std::thread producers([&] {
    arena.execute([&] { tbb::parallel_for(0, kProducers, 1, produce, tbb::simple_partitioner()); });
  });

  std::vector<Tracking> track(kTotal);
  std::vector<uint32_t> known(kProducers, 0);
  // pending[level][peer]: known messages not yet fully carved.
  std::vector<std::vector<int>> pending(kLevels, std::vector<int>(kPeers, 0));
  // last completed seq per (producer, fifo key); -1 = none.
  const unsigned kKeys = kLevels * kPeers;
  std::vector<int64_t> last_done(kProducers * kKeys, -1);
  std::vector<Message*> readiness;  // partition mode: start-ups acked one pass later
  std::mt19937 rng(42);
  uint32_t done = 0;
  uint64_t violations = 0, fifo_violations = 0, range_errors = 0, dup = 0, false_idle = 0;

  auto learn = [&] {
    for (int p = 0; p < kProducers; ++p) {
      const uint32_t n = published[p].load(std::memory_order_acquire);
      for (uint32_t i = known[p]; i < n; ++i) {
        const uint32_t id = p * kPerProducer + i;
        track[id].known = true;
        if (!track[id].done) ++pending[log[id].priority][log[id].peer];
      }
      known[p] = n;
    }
  };
  auto more_urgent_pending = [&](unsigned level, const PeerMask& eligible) {
    for (unsigned q = 0; q < level; ++q) {
      for (unsigned peer = 0; peer < kPeers; ++peer) {
        if (eligible.test(peer) && pending[q][peer] > 0) return true;
      }
    }
    return false;
  };

  uint64_t overlapped = 0;  // slices carved while some producer was still submitting
  while (done < kTotal) {
    learn();  // everything learnt here was submitted before this drain
    bool producing = false;
    for (int p = 0; p < kProducers; ++p) producing |= known[p] < kPerProducer;
    sched.drain_ingress_st();
    for (Message* m : readiness) sched.partition_ready_st(m);
    readiness.clear();
    for (int k = 0; k < 32; ++k) {
      PeerMask eligible;
      for (unsigned peer = 0; peer < kPeers; ++peer) {
        if (rng() % 4 != 0) eligible.set(peer);
      }
      Slice s;
      if (!sched.next_slice_st(eligible, kPayload, s)) {
        if (mode != Mode::kPartition && more_urgent_pending(kLevels, eligible)) ++false_idle;
        break;
      }
      Message* m = s.msg;
      overlapped += producing ? 1 : 0;
      if (!eligible.test(m->peer)) ++violations;
      if (s.kind == SliceKind::kPartitionStart) {
        readiness.push_back(m);
        continue;
      }
      const uint32_t id = m->msg_id;
      const Record rec = log[id];
      Tracking& t = track[id];
      if (t.done) ++dup;
      if (s.offset != t.next || s.len > kPayload || s.offset + s.len > rec.len) ++range_errors;
      if (mode == Mode::kStrict && more_urgent_pending(rec.priority, eligible)) ++violations;
      t.next = s.offset + s.len;
      if (t.next == rec.len) {
        t.done = true;
        ++done;
        if (t.known) --pending[rec.priority][rec.peer];
        const unsigned key = (mode == Mode::kFifo ? 0 : rec.priority) * kPeers + rec.peer;
        const int producer = static_cast<int>(id / kPerProducer);
        const int64_t seq = id % kPerProducer;
        int64_t& last = last_done[producer * kKeys + key];
        if (seq <= last) ++fifo_violations;
        last = seq;
      }
      sched.on_acked_st(m, s.len);  // may release m: nothing of m is read after this
    }
  }
  producers.join();

  EXPECT_EQ(violations, 0u);
  EXPECT_EQ(fifo_violations, 0u);
  EXPECT_EQ(range_errors, 0u);
  EXPECT_EQ(dup, 0u);
  EXPECT_EQ(false_idle, 0u);
  EXPECT_GT(overlapped, 0u);  // the consumer really ran against live producers
  for (uint32_t id = 0; id < kTotal; ++id) ASSERT_TRUE(track[id].done) << id;
  const SchedulerStats st = sched.stats_st();
  EXPECT_EQ(st.drained, kTotal);
  EXPECT_EQ(st.released, kTotal);
  EXPECT_EQ(st.submit_full, refused.load());
  EXPECT_FALSE(sched.has_work_st());
  EXPECT_EQ(sched.credit_in_use_st(), 0u);
  std::vector<Message*> all;
  while (Message* m = pool.alloc()) all.push_back(m);
  EXPECT_EQ(all.size(), 256u);  // every descriptor came back exactly once
}

INSTANTIATE_TEST_SUITE_P(Modes, ConcurrentProducers,
                         ::testing::Values(Mode::kStrict, Mode::kFifo, Mode::kPartition),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace mercury::sched
