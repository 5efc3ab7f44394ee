#include "concurrency_case.h"

#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_pause.h>

#include <atomic>
#include <vector>

#include "endpoint_config.h"
#include "messages.h"
#include "ring_link.h"
#include "transport/endpoint.h"

namespace mercury::pmdtest {

namespace {

using transport::Completion;
using transport::Endpoint;
using transport::MessageMeta;
using transport::SendResult;
using transport::SubmitStatus;

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

struct Nothing final : transport::MessageReceiver {
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields&) override { return nullptr; }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {}
};

}  // namespace

ConcurrencyResult run_concurrency_case(const ConcurrencyCase& k) {
  static int n = 0;
  const auto net = static_cast<uint8_t>(200 + n % 50);
  RingLink link("cc" + std::to_string(n++), net, {.end = {.impair = faults(k.loss, k.seed)}});
  const std::vector<std::byte> pattern = random_pattern(1 << 20, k.seed);
  std::vector<PlannedMessage> plan;
  uint64_t x = k.seed | 1;
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
  Nothing nothing;
  const uint64_t now = rte_rdtsc();
  const EndpointOptions slow_peers{.peer_timeout_ms = 30'000};
  transport::EndpointConfig ca =
      endpoint_config(3, 1, {{"b", RingLink::ip_b(net), 47101}}, slow_peers);
  ca.max_messages = k.descriptors;
  ca.ingress_capacity = 4096;
  transport::EndpointConfig cb =
      endpoint_config(5, 0, {{"a", RingLink::ip_a(net), 47100}}, slow_peers);
  cb.max_messages = 64;
  cb.ingress_capacity = 4096;
  Endpoint a(link.a(), ca, nothing, now);
  Endpoint b(link.b(), cb, rx, now);
  Producer p{&a, &pattern, &plan};
  ConcurrencyResult r;
  r.messages = plan.size();
  const uint64_t t0 = rte_rdtsc();
  if (!k.same_thread) {
    r.launch = rte_eal_remote_launch(produce, &p, k.producer_lcore);
    if (r.launch != 0) return r;
  }
  size_t next = 0;  // same_thread: the next message to submit
  const uint64_t deadline = t0 + static_cast<uint64_t>(k.deadline_s * rte_get_tsc_hz());
  while (rte_rdtsc() < deadline &&
         !(p.done && p.completed + p.failed == plan.size() && rx.all_exactly_once())) {
    if (k.same_thread && next < plan.size()) {
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
  r.seconds = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(rte_get_tsc_hz());
  if (!(p.done && p.completed + p.failed == plan.size())) {
    const transport::EndpointPeerStats st = a.peer_stats_st(0);
    const transport::EndpointCounters c = a.counters_st();
    using transport::EndpointDrop;
    r.stuck = "stuck: outstanding " + std::to_string(st.outstanding) + ", waiting_resend " +
              std::to_string(st.waiting_resend) + ", sent " + std::to_string(st.messages_sent) +
              ", failed " + std::to_string(st.messages_failed) + ", idle " +
              std::to_string(a.idle_st()) + ", tx_data " + std::to_string(c.tx_data) +
              ", retransmits " + std::to_string(c.tx_retransmits) + ", no_room " +
              std::to_string(c.resends_no_room) + ", deferred " + std::to_string(c.deferred) +
              ", stashed " + std::to_string(c.requeue_stashed) + ", not_needed " +
              std::to_string(c.resends_not_needed) + ", window_blocked " +
              std::to_string(c.resends_window_blocked) + ", stale " +
              std::to_string(c.drops[static_cast<size_t>(EndpointDrop::kRetransmitStale)]) +
              ", stage_failed " +
              std::to_string(c.drops[static_cast<size_t>(EndpointDrop::kStageFailed)]) +
              ", receiver done " + std::to_string(rx.all_exactly_once());
  }
  r.submitted = p.done.load();
  if (!r.submitted && !k.same_thread) {
    // Let the producer finish submitting, so the lcore can be joined.
    while (!p.done) {
      const uint64_t t = rte_rdtsc();
      a.poll_st(t);
      b.poll_st(t);
    }
  }
  if (!k.same_thread) r.producer_exit = rte_eal_wait_lcore(k.producer_lcore);
  r.completed = p.completed.load();
  r.failed = p.failed.load();
  r.first_status = p.first_status.load();
  r.first_error = p.first_error;
  r.exactly_once = rx.all_exactly_once();
  return r;
}

}  // namespace mercury::pmdtest
