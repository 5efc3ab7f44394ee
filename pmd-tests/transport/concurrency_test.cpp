// The endpoint's any-thread send path under a real concurrent producer: a
// second lcore submits messages while the net core polls, completes and
// reuses their descriptors, over a lossy, reordering, duplicating link.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_pause.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fixture.h"
#include "pmd_env.h"
#include "transport/endpoint.h"

namespace mercury::transport {
namespace {

using testing::CheckingReceiver;
using testing::faults;
using testing::PlannedMessage;
using testing::RingLink;

EndpointConfig config(uint16_t epoch, uint16_t sender, PeerSpec peer, uint32_t messages) {
  EndpointConfig c;
  c.transport.tsc_hz = rte_get_tsc_hz();
  c.transport.window_packets = 128;
  c.transport.peer_timeout_us = 30'000'000;
  c.local_epoch = epoch;
  c.sender_id = sender;
  c.max_messages = messages;  // small: descriptors are reused all the time
  c.peers = {std::move(peer)};
  return c;
}

struct Producer {
  Endpoint* ep;
  const std::vector<std::byte>* pattern;
  const std::vector<PlannedMessage>* plan;
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> failed{0};
  std::atomic<bool> done{false};
  std::atomic<int> first_status{-1};
  std::string first_error;  // written once, by the net core
};

void on_done(void* ctx, const SendResult& r) {
  auto& p = *static_cast<Producer*>(ctx);
  if (!r.ok() && p.first_status.load() < 0) {
    p.first_error = std::string(r.error);
    p.first_status = static_cast<int>(r.status);
  }
  (r.ok() ? p.completed : p.failed).fetch_add(1, std::memory_order_relaxed);
}

int produce(void* arg) {
  auto& p = *static_cast<Producer*>(arg);
  for (size_t i = 0; i < p.plan->size(); ++i) {
    const PlannedMessage& m = (*p.plan)[i];
    MessageMeta meta;
    meta.block_key = static_cast<uint32_t>(i);
    meta.iteration = 0;  // sender index for CheckingReceiver
    for (;;) {
      const SubmitStatus st = p.ep->send(0, p.pattern->data() + m.start, m.len, m.priority, meta,
                                         Completion{on_done, &p, i});
      if (st == SubmitStatus::kQueued) break;
      if (st == SubmitStatus::kInvalid) return 1;
      rte_pause();  // no descriptor or ingress full: the net core frees them
    }
  }
  p.done = true;
  return 0;
}

void run_case(double loss, uint64_t seed, uint32_t descriptors, bool same_thread = false,
              uint32_t deadline_s = 20) {
  static int n = 0;
  const auto net = static_cast<uint8_t>(200 + n);
  RingLink link("cc" + std::to_string(n++), net, 1500, faults(loss, seed));
  const std::vector<std::byte> pattern = testing::random_pattern(1 << 20, seed);
  std::vector<PlannedMessage> plan;
  uint64_t x = seed | 1;
  for (int i = 0; i < 20000; ++i) {  // 1 to 12 packets each
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint32_t len = 64 + static_cast<uint32_t>(x % (16 * 1024));
    plan.push_back({len, static_cast<size_t>((x >> 20) % (pattern.size() - len)),
                    static_cast<uint8_t>((x >> 50) % 8)});
  }
  const std::vector<std::vector<PlannedMessage>> plans{plan};  // rx keeps a reference
  CheckingReceiver rx(pattern, plans);
  const uint64_t now = rte_rdtsc();
  struct Nothing final : MessageReceiver {
    std::byte* on_message_begin(uint16_t, const wire::HeaderFields&) override { return nullptr; }
    void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {}
  } nothing;
  Endpoint a(link.a(), config(3, 1, {"b", RingLink::ip_b(net), 47101}, descriptors), nothing, now);
  Endpoint b(link.b(), config(5, 0, {"a", RingLink::ip_a(net), 47100}, 64), rx, now);
  Producer p{&a, &pattern, &plan};
  if (!same_thread) {
    ASSERT_EQ(rte_eal_remote_launch(produce, &p, 1), 0);
  }
  size_t next = 0;  // same_thread: the next message to submit
  const uint64_t deadline = rte_rdtsc() + deadline_s * rte_get_tsc_hz();
  while (rte_rdtsc() < deadline &&
         !(p.done && p.completed + p.failed == plan.size() && rx.all_exactly_once())) {
    if (same_thread && next < plan.size()) {
      MessageMeta meta;
      meta.block_key = static_cast<uint32_t>(next);
      const PlannedMessage& m = plan[next];
      if (a.send(0, pattern.data() + m.start, m.len, m.priority, meta,
                 Completion{on_done, &p, next}) == SubmitStatus::kQueued) {
        if (++next == plan.size()) p.done = true;
      }
    }
    const uint64_t t = rte_rdtsc();
    a.poll_st(t);
    b.poll_st(t);
  }
  if (!(p.done && p.completed + p.failed == plan.size())) {
    const EndpointPeerStats st = a.peer_stats_st(0);
    const EndpointCounters c = a.counters_st();
    ADD_FAILURE() << "stuck: outstanding " << st.outstanding << ", waiting_resend "
                  << st.waiting_resend << ", sent " << st.messages_sent << ", failed "
                  << st.messages_failed << ", idle " << a.idle_st() << ", tx_data " << c.tx_data
                  << ", retransmits " << c.tx_retransmits << ", no_room " << c.resends_no_room
                  << ", deferred " << c.deferred << ", stashed " << c.requeue_stashed
                  << ", not_needed " << c.resends_not_needed << ", window_blocked "
                  << c.resends_window_blocked << ", stale "
                  << c.drops[static_cast<size_t>(EndpointDrop::kRetransmitStale)]
                  << ", stage_failed " << c.drops[static_cast<size_t>(EndpointDrop::kStageFailed)]
                  << ", receiver done " << rx.all_exactly_once();
  }
  const bool finished = p.done.load();
  if (!finished && !same_thread) {
    // Let the producer finish submitting, so the lcore can be joined.
    while (!p.done) {
      const uint64_t t = rte_rdtsc();
      a.poll_st(t);
      b.poll_st(t);
    }
  }
  if (!same_thread) {
    EXPECT_EQ(rte_eal_wait_lcore(1), 0);
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(p.completed.load(), plan.size()) << "failed " << p.failed.load() << ", the first as "
                                             << p.first_status.load() << ": " << p.first_error;
  EXPECT_TRUE(rx.all_exactly_once());
}

TEST(EndpointConcurrency, ProducerOnAnotherLcoreNoLoss) { run_case(0, 7, 256); }
TEST(EndpointConcurrency, ProducerOnAnotherLcoreUnderLoss) { run_case(0.02, 13, 8192); }
TEST(EndpointConcurrency, SameThreadUnderLoss) { run_case(0.02, 17, 8192, true); }

// Few descriptors: each is completed and reused many times while packets of
// other messages wait for their resends (the stall fixed in docs/transport.md).
TEST(EndpointConcurrency, FewDescriptorsProducerOnAnotherLcoreUnderLoss) {
  run_case(0.02, 11, 256);
}
TEST(EndpointConcurrency, FewDescriptorsSameThreadUnderLoss) { run_case(0.02, 11, 256, true); }

// By hand, not in CI: a sweep of seeds (odd seeds on one thread, even ones
// with the producer on lcore 1), e.g.
//   SWEEP_LOSS=0.1 SWEEP_DESCRIPTORS=1024 SWEEP_SEEDS=6 pmd_transport_concurrency_test
//       --gtest_also_run_disabled_tests --gtest_filter=*Sweep*
// Each seed prints its time; the deadline is 60 s per seed.
TEST(EndpointConcurrency, DISABLED_Sweep) {
  auto env = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : fallback);
  };
  const double loss = std::stod(env("SWEEP_LOSS", "0.02"));
  const auto descriptors = static_cast<uint32_t>(std::stoul(env("SWEEP_DESCRIPTORS", "256")));
  const int seeds = std::stoi(env("SWEEP_SEEDS", "12"));
  for (int seed = 1; seed <= seeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const uint64_t t0 = rte_rdtsc();
    run_case(loss, static_cast<uint64_t>(seed), descriptors, (seed & 1) != 0, 60);
    std::printf("loss %.3f, %u descriptors, seed %d: %.1f s\n", loss, descriptors, seed,
                double(rte_rdtsc() - t0) / double(rte_get_tsc_hz()));
  }
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) {
  return mercury::pmdtest::run_all_tests(argc, argv, {"--lcores=0@0,1@1"});
}
