// The transport endpoint over real PMD ports: net_ring links, the link
// emulator on every TX queue (both directions, so data and ACKs are
// impaired alike), and every byte of every message checked in the
// destination buffers.
//
// Everything runs in one thread that polls every endpoint in turn (the
// deterministic choice: no cross-core timing, and the 2-core CI machine is
// not oversubscribed). The incast comes twice: four senders each on its own
// ring link into one receiving core that polls four Interfaces (one Endpoint
// each, one MessageReceiver), and four senders through a software switch
// into ONE server Endpoint with four peers on one Interface.
#include <gtest/gtest.h>
#include <rte_cycles.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "endpoint_config.h"
#include "messages.h"
#include "pmd_env.h"
#include "ring_link.h"

namespace mercury::transport {
namespace {

using pmdtest::CheckingReceiver;
using pmdtest::CompletionLog;
using pmdtest::endpoint_config;
using pmdtest::faults;
using pmdtest::PlannedMessage;
using pmdtest::RingLink;
using pmdtest::run;

constexpr uint32_t kMtu = 9000;
constexpr uint64_t kMiB = 1ull << 20;
// Holds every message cut from it; larger than the largest message.
constexpr size_t kPatternBytes = 80 * kMiB;

const std::vector<std::byte>& pattern() {
  static const std::vector<std::byte> p = pmdtest::random_pattern(kPatternBytes, 42);
  return p;
}

// Peers declared dead after 5 s without progress.
constexpr pmdtest::EndpointOptions kEndpoint = {.peer_timeout_ms = 5'000};

void print_stats(const char* what, const Endpoint& tx, double seconds, uint64_t bytes) {
  const EndpointPeerStats s = tx.peer_stats_st(0);
  const EndpointCounters c = tx.counters_st();
  std::printf(
      "[ %s ] %.1f MiB in %.2f s (%.2f Gbit/s); sent %llu, resent %llu (fast %llu, rto %llu), "
      "rto expiries %llu, probes %llu (answered %llu), deferred %llu, stale %llu, no room %llu, "
      "not needed %llu, false losses %llu, cwnd %u, spurious timeouts %llu\n",
      what, bytes / double(kMiB), seconds, bytes * 8 / seconds / 1e9,
      (unsigned long long)s.transport.tx.packets_sent, (unsigned long long)c.tx_retransmits,
      (unsigned long long)s.transport.tx.retransmits_fast,
      (unsigned long long)s.transport.tx.retransmits_timeout,
      (unsigned long long)s.transport.tx.rto_expirations,
      (unsigned long long)s.transport.tx.rto_probes,
      (unsigned long long)s.transport.tx.probe_answers, (unsigned long long)c.deferred,
      (unsigned long long)c.drops[static_cast<size_t>(EndpointDrop::kRetransmitStale)],
      (unsigned long long)c.resends_no_room, (unsigned long long)c.resends_not_needed,
      (unsigned long long)s.transport.tx.false_losses, s.transport.tx.cwnd,
      (unsigned long long)s.transport.tx.spurious_timeouts);
}

// A sends `forward` bytes to B, B sends `back` bytes to A, over one link.
void two_endpoints(const std::string& name, uint8_t net, uint32_t mtu, const net::LinkParams& lp,
                   uint64_t forward, uint64_t back, double limit_s, bool known_epochs,
                   void (*tune)(EndpointConfig&) = nullptr) {
  RingLink link(name, net, {.end = {.mtu = mtu, .impair = lp}});
  std::vector<std::vector<PlannedMessage>> plans = {
      pmdtest::plan_messages(forward, 64 << 20, kPatternBytes, lp.seed + 1),
      pmdtest::plan_messages(back, 4 << 20, kPatternBytes, lp.seed + 2)};
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  EndpointConfig ca =
      endpoint_config(3, 0, {{"b", RingLink::ip_b(net), 47101, known_epochs ? 5u : 0u}}, kEndpoint);
  EndpointConfig cb =
      endpoint_config(5, 1, {{"a", RingLink::ip_a(net), 47100, known_epochs ? 3u : 0u}}, kEndpoint);
  if (tune != nullptr) {
    tune(ca);
    tune(cb);
  }
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), ca, rx_a, now);
  Endpoint b(link.b(), cb, rx_b, now);
  CompletionLog log_a(plans[0].size()), log_b(plans[1].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log_a);
  pmdtest::submit_plan(b, 0, 1, plans[1], pattern(), log_b);

  const uint64_t t0 = rte_rdtsc();
  const bool finished = run(
      {&a, &b},
      [&] {
        return log_a.total_ok() == plans[0].size() && log_b.total_ok() == plans[1].size() &&
               rx_b.all_exactly_once(0) && rx_a.all_exactly_once(1);
      },
      limit_s);
  const double secs = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
  print_stats(name.c_str(), a, secs, forward);
  EXPECT_TRUE(finished) << "time out: " << log_a.total_ok() << "/" << plans[0].size() << " and "
                        << log_b.total_ok() << "/" << plans[1].size() << " completed";
  EXPECT_TRUE(log_a.each_once());
  EXPECT_TRUE(log_b.each_once());
  EXPECT_EQ(log_a.first_error, "");
  EXPECT_EQ(log_b.first_error, "");
  // Every byte, checked against the source in the destination buffers.
  EXPECT_EQ(rx_b.corrupt(), 0u);
  EXPECT_EQ(rx_a.corrupt(), 0u);
  EXPECT_EQ(rx_b.unexpected() + rx_a.unexpected(), 0u);
  EXPECT_EQ(rx_b.bytes_ok(), forward);
  EXPECT_EQ(rx_a.bytes_ok(), back);
  EXPECT_TRUE(rx_b.all_exactly_once(0));
  EXPECT_TRUE(rx_a.all_exactly_once(1));
  EXPECT_EQ(rx_b.open_buffers() + rx_a.open_buffers(), 0u);
  if (lp.loss > 0) {
    // The faults were real and the transport recovered from them.
    EXPECT_GT(link.emu_a()->lost, 0u);
    EXPECT_GT(link.emu_a()->duplicated, 0u);
    EXPECT_GT(link.emu_a()->reordered, 0u);
    EXPECT_GT(a.counters_st().tx_retransmits, 0u);
    EXPECT_GT(b.peer_stats_st(0).transport.rx.duplicates, 0u);
  }
  if (lp.corrupt > 0) {
    // Corrupted frames were caught by the checksums below the transport.
    const auto& d = link.b().counters().drops;
    EXPECT_GT(d[static_cast<size_t>(net::DropReason::kUdpBadChecksum)] +
                  d[static_cast<size_t>(net::DropReason::kIpBadChecksum)],
              0u);
  }
  if (ca.mode == sched::Mode::kPartition) {
    // Every partition's start-up travelled as a kPartitionStart packet and
    // its ACK released the partition.
    EXPECT_GT(b.counters_st().partition_starts_received, 0u);
    EXPECT_EQ(a.scheduler().stats_st().partition_starts, b.counters_st().partition_starts_received);
  }
  // The retransmission queue was sized so that it never refused a slice.
  EXPECT_EQ(a.counters_st().requeue_stashed + b.counters_st().requeue_stashed, 0u);
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(b.idle_st());
  // Every sequence number sent was acknowledged.
  EXPECT_EQ(a.peer_stats_st(0).outstanding, 0u);
}

TEST(Endpoint, TwoEndpointsNoFaults256MiB) {
  two_endpoints("nofault", 1, kMtu, faults(0, 1), 256 * kMiB, 16 * kMiB, 30, false);
}

TEST(Endpoint, TwoEndpointsNoFaults1500Mtu) {
  two_endpoints("nofault1500", 2, 1500, faults(0, 2), 64 * kMiB, 4 * kMiB, 30, true);
}

TEST(Endpoint, TwoEndpointsLoss1Percent256MiB) {
  two_endpoints("loss1", 3, kMtu, faults(0.01, 11), 256 * kMiB, 16 * kMiB, 40, false);
}

TEST(Endpoint, TwoEndpointsLoss5Percent256MiB) {
  two_endpoints("loss5", 4, kMtu, faults(0.05, 12), 256 * kMiB, 16 * kMiB, 40, true);
}

TEST(Endpoint, TwoEndpointsLoss10Percent256MiB) {
  two_endpoints("loss10", 5, kMtu, faults(0.10, 13), 256 * kMiB, 16 * kMiB, 40, false);
}

// At 30 % loss both ways the default cwnd floor of 2 leaves too few later
// transmissions for fast retransmit, so recovery would be by timer alone:
// a floor of 8 and a 20 ms RTO ceiling keep the smaller volume quick.
TEST(Endpoint, TwoEndpointsLoss30PercentSmaller) {
  two_endpoints("loss30", 6, kMtu, faults(0.30, 14), 32 * kMiB, 2 * kMiB, 40, true,
                [](EndpointConfig& c) {
                  c.transport.cwnd_floor = 8;
                  c.transport.initial_rto_us = 2'000;
                  c.transport.min_rto_us = 500;
                  c.transport.max_rto_us = 20'000;
                });
}

// The baselines are modes of the same endpoint: FIFO (priority ignored) and
// partitioning (P3/ByteScheduler: 1 MiB partitions, 2 MiB credit, a start-up
// control per partition carried reliably), both under 5 % loss.
TEST(Endpoint, FifoModeLoss5Percent) {
  two_endpoints("fifo", 7, kMtu, faults(0.05, 15), 64 * kMiB, 4 * kMiB, 30, true,
                [](EndpointConfig& c) { c.mode = sched::Mode::kFifo; });
}

TEST(Endpoint, PartitionModeLoss5Percent) {
  two_endpoints("part", 8, kMtu, faults(0.05, 16), 64 * kMiB, 4 * kMiB, 30, true,
                [](EndpointConfig& c) {
                  c.mode = sched::Mode::kPartition;
                  c.partition_bytes = 1 << 20;
                  c.credit_bytes = 2 << 20;
                });
}

// Corrupted frames (a bit flipped past the Ethernet header) never reach the
// transport: the IPv4/UDP checksums drop them and the transport resends.
TEST(Endpoint, CorruptionLossAndDuplicationAt1500Mtu) {
  net::LinkParams lp = faults(0.01, 17);
  lp.corrupt = 0.02;
  two_endpoints("corrupt", 9, 1500, lp, 32 * kMiB, 2 * kMiB, 30, false);
}

// A receiver may refuse a message: it is counted, its bytes are acknowledged
// and discarded, and no other message suffers.
class RefuseEveryThird final : public MessageReceiver {
 public:
  explicit RefuseEveryThird(CheckingReceiver& inner) : inner_(inner) {}
  std::byte* on_message_begin(uint16_t peer, const wire::HeaderFields& h) override {
    if (h.block_key % 3 == 0) {
      ++refused;
      return nullptr;
    }
    return inner_.on_message_begin(peer, h);
  }
  void on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte* b) override {
    inner_.on_message_complete(peer, h, b);
  }
  uint32_t refused = 0;

 private:
  CheckingReceiver& inner_;
};

TEST(Endpoint, RefusedMessagesAreCountedAndOthersDelivered) {
  RingLink link("refuse", 42, {.end = {.mtu = kMtu, .impair = faults(0.02, 18)}});
  std::vector<std::vector<PlannedMessage>> plans = {
      pmdtest::plan_messages(48 * kMiB, 16 << 20, kPatternBytes, 99)};
  CheckingReceiver rx_a(pattern(), plans), inner(pattern(), plans);
  RefuseEveryThird rx_b(inner);
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), endpoint_config(3, 0, {{"b", RingLink::ip_b(42), 47101, 5}}, kEndpoint),
             rx_a, now);
  Endpoint b(link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(42), 47100, 3}}, kEndpoint),
             rx_b, now);
  CompletionLog log(plans[0].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log);
  ASSERT_TRUE(run(
      {&a, &b}, [&] { return log.total_ok() == plans[0].size(); }, 20));
  uint32_t expect_refused = 0;
  uint64_t expect_bytes = 0;
  for (uint32_t i = 0; i < plans[0].size(); ++i) {
    if (i % 3 == 0) {
      ++expect_refused;
    } else {
      expect_bytes += plans[0][i].len;
    }
  }
  EXPECT_EQ(rx_b.refused, expect_refused);
  EXPECT_EQ(b.peer_stats_st(0).messages_refused, expect_refused);
  EXPECT_EQ(b.peer_stats_st(0).messages_received, plans[0].size() - expect_refused);
  EXPECT_EQ(inner.bytes_ok(), expect_bytes);
  EXPECT_EQ(inner.corrupt(), 0u);
  EXPECT_TRUE(inner.none_twice());
  EXPECT_GT(b.counters_st().drops[static_cast<size_t>(EndpointDrop::kRefused)], 0u);
}

// Strict priority with loss: a lost packet of a low-priority message must be
// resent even while urgent messages keep arriving, or its hole holds the
// window shut (the window counts sequence numbers from the oldest unacked).
// A 64 MiB message at priority 7 competes with a stream of 256 KiB messages
// at priority 0 kept 64 deep, under 5 % loss.
TEST(Endpoint, UrgentStreamDoesNotStarveLowPriorityResends) {
  RingLink link("urgent", 43, {.end = {.mtu = kMtu, .impair = faults(0.05, 19)}});
  constexpr uint32_t kSmall = 256 << 10;
  constexpr uint32_t kUrgent = 400;
  std::vector<std::vector<PlannedMessage>> plans(1);
  plans[0].push_back({64u << 20, 12345, 7});
  for (uint32_t i = 0; i < kUrgent; ++i) plans[0].push_back({kSmall, i * 4097ull * 16, 0});
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  const uint64_t now = rte_rdtsc();
  EndpointConfig ca = endpoint_config(3, 0, {{"b", RingLink::ip_b(43), 47101, 5}}, kEndpoint);
  ca.transport.cwnd_floor = 128;  // keep the pipe full, so the window is what binds
  Endpoint a(link.a(), ca, rx_a, now);
  Endpoint b(link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(43), 47100, 3}}, kEndpoint),
             rx_b, now);
  CompletionLog log(plans[0].size());
  uint32_t next = 0;
  auto submit = [&](uint32_t i) {
    MessageMeta meta;
    meta.block_key = i;
    ASSERT_EQ(a.send(0, pattern().data() + plans[0][i].start, plans[0][i].len, plans[0][i].priority,
                     meta, Completion{&CompletionLog::callback, &log, i}),
              SubmitStatus::kQueued);
  };
  submit(next++);  // the big one first
  uint32_t max_outstanding = 0;
  const bool finished = run(
      {&a, &b},
      [&] {
        // Once the big one is under way, keep 64 urgent messages queued or
        // in flight while any are left, so level 0 is never empty.
        uint64_t done = 0;
        for (uint32_t i = 1; i < next; ++i) done += log.ok[i] + log.failed[i];
        const bool started = b.peer_stats_st(0).bytes_received >= (8u << 20);
        max_outstanding = std::max(max_outstanding, a.peer_stats_st(0).outstanding);
        while (started && next < plans[0].size() && next - 1 - done < 64) submit(next++);
        return log.ok[0] + log.failed[0] == 1 && next == plans[0].size() &&
               done == plans[0].size() - 1;
      },
      30);
  EXPECT_TRUE(finished);
  EXPECT_TRUE(log.each_once());
  EXPECT_EQ(log.first_error, "");
  EXPECT_EQ(rx_b.corrupt(), 0u);
  EXPECT_TRUE(rx_b.all_exactly_once(0));
  std::printf("[ urgent ] max outstanding %u, resends %llu, deferred %llu, blocked resends %llu\n",
              max_outstanding, (unsigned long long)a.counters_st().tx_retransmits,
              (unsigned long long)a.counters_st().deferred,
              (unsigned long long)a.counters_st().resends_window_blocked);
}

// Four senders, each on its own ring link, into one receiving core that
// polls four Interfaces (one Endpoint each) delivering into one receiver.
void incast(const std::string& name, uint8_t net0, const net::LinkParams& lp, uint64_t total,
            double limit_s) {
  constexpr int kSenders = 4;
  std::vector<std::unique_ptr<RingLink>> links;
  std::vector<std::vector<PlannedMessage>> plans;
  for (int s = 0; s < kSenders; ++s) {
    net::LinkParams p = lp;
    p.seed = lp.seed * 10 + s;
    links.push_back(std::make_unique<RingLink>(
        name + std::to_string(s), static_cast<uint8_t>(net0 + s),
        pmdtest::RingLinkOptions{.end = {.mtu = kMtu, .mbufs = 1023, .impair = p}}));
    plans.push_back(pmdtest::plan_messages(total / kSenders, 16 << 20, kPatternBytes, p.seed));
  }
  CheckingReceiver rx(pattern(), plans);
  CheckingReceiver nothing(pattern(), plans);  // the senders receive no messages
  const uint64_t now = rte_rdtsc();
  std::vector<std::unique_ptr<Endpoint>> senders, receivers;
  std::vector<std::unique_ptr<CompletionLog>> logs;
  std::vector<Endpoint*> all;
  for (int s = 0; s < kSenders; ++s) {
    const auto net = static_cast<uint8_t>(net0 + s);
    senders.push_back(std::make_unique<Endpoint>(
        links[s]->a(),
        endpoint_config(7, static_cast<uint16_t>(s + 1),
                        {{"server", RingLink::ip_b(net), 47101, 0}}, kEndpoint),
        nothing, now));
    receivers.push_back(std::make_unique<Endpoint>(
        links[s]->b(),
        endpoint_config(9, 0, {{"w" + std::to_string(s), RingLink::ip_a(net), 47100, 0}},
                        kEndpoint),
        rx, now));
    logs.push_back(std::make_unique<CompletionLog>(plans[s].size()));
    pmdtest::submit_plan(*senders[s], 0, static_cast<uint32_t>(s), plans[s], pattern(), *logs[s]);
    all.push_back(senders[s].get());
    all.push_back(receivers[s].get());
  }
  const uint64_t t0 = rte_rdtsc();
  const bool finished = run(
      all,
      [&] {
        for (int s = 0; s < kSenders; ++s) {
          if (logs[s]->total_ok() != plans[s].size()) return false;
        }
        return rx.all_exactly_once();
      },
      limit_s);
  const double secs = double(rte_rdtsc() - t0) / rte_get_tsc_hz();
  print_stats(name.c_str(), *senders[0], secs, total);
  EXPECT_TRUE(finished);
  for (int s = 0; s < kSenders; ++s) {
    EXPECT_TRUE(logs[s]->each_once()) << "sender " << s;
    EXPECT_EQ(logs[s]->first_error, "") << "sender " << s;
    EXPECT_TRUE(senders[s]->idle_st());
  }
  EXPECT_EQ(rx.corrupt(), 0u);
  EXPECT_EQ(rx.unexpected(), 0u);
  EXPECT_EQ(rx.bytes_ok(), total);
  EXPECT_TRUE(rx.all_exactly_once());
  EXPECT_EQ(rx.open_buffers(), 0u);
}

TEST(Endpoint, Incast4To1NoFaults256MiB) { incast("incast", 20, faults(0, 3), 256 * kMiB, 40); }

TEST(Endpoint, Incast4To1Loss5Percent256MiB) {
  incast("incastloss", 30, faults(0.05, 4), 256 * kMiB, 40);
}

// A true incast: four workers into ONE server Endpoint with four peers on one
// Interface, through the software switch, with 1 % loss, 5 % reordering and
// 2 % duplication on every node's TX; 64 MiB from each worker (256 MiB) and
// 4 MiB from the server back to each worker (multi-peer round-robin TX).
TEST(Endpoint, Incast4To1OneServerEndpointThroughSwitch) {
  constexpr int kWorkers = 4;
  // Static ARP on every node, so no broadcast is needed: the switch drops
  // and counts one, and a frame for an unknown MAC.
  pmdtest::RingSwitch sw("inc1", {.mtu = kMtu, .flood = false});
  std::vector<pmdtest::LinkEnd*> nodes;  // [0] the server
  std::vector<uint32_t> ips;
  for (int i = 0; i <= kWorkers; ++i) {
    ips.push_back(0x0a003201u + i);  // 10.0.50.1 (server), .2 .. .5
    nodes.push_back(&sw.attach(std::to_string(i), {.mtu = kMtu, .impair = faults(0.01, 300 + i)},
                               ips.back(), 47100));
  }
  for (size_t a = 0; a < nodes.size(); ++a) {
    for (size_t b = 0; b < nodes.size(); ++b) {
      if (a != b) nodes[a]->iface().add_static_arp(ips[b], nodes[b]->port().mac());
    }
  }
  std::vector<std::vector<PlannedMessage>> plans;
  for (int w = 0; w < kWorkers; ++w) {
    plans.push_back(pmdtest::plan_messages(64 * kMiB, 16 << 20, kPatternBytes, 400 + w));
  }
  for (int w = 0; w < kWorkers; ++w) {
    plans.push_back(pmdtest::plan_messages(4 * kMiB, 1 << 20, kPatternBytes, 500 + w));
  }
  CheckingReceiver rx_server(pattern(), plans), rx_workers(pattern(), plans);
  const uint64_t now = rte_rdtsc();
  std::vector<PeerSpec> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back({"w" + std::to_string(w), ips[w + 1], 47100, 0});
  }
  Endpoint server(nodes[0]->iface(), endpoint_config(9, 0, workers, kEndpoint), rx_server, now);
  std::vector<std::unique_ptr<Endpoint>> clients;
  std::vector<std::unique_ptr<CompletionLog>> logs;
  std::vector<Endpoint*> all = {&server};
  for (int w = 0; w < kWorkers; ++w) {
    clients.push_back(std::make_unique<Endpoint>(
        nodes[w + 1]->iface(),
        endpoint_config(7, static_cast<uint16_t>(w + 1), {{"server", ips[0], 47100, 0}}, kEndpoint),
        rx_workers, now));
    logs.push_back(std::make_unique<CompletionLog>(plans[w].size()));
    pmdtest::submit_plan(*clients[w], 0, static_cast<uint32_t>(w), plans[w], pattern(), *logs[w]);
    all.push_back(clients[w].get());
  }
  std::vector<std::unique_ptr<CompletionLog>> back;
  for (int w = 0; w < kWorkers; ++w) {
    back.push_back(std::make_unique<CompletionLog>(plans[kWorkers + w].size()));
    pmdtest::submit_plan(server, static_cast<uint16_t>(w), static_cast<uint32_t>(kWorkers + w),
                         plans[kWorkers + w], pattern(), *back[w]);
  }
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t deadline = rte_rdtsc() + 40 * hz;
  bool finished = false;
  while (!finished && rte_rdtsc() < deadline) {
    const uint64_t t = rte_rdtsc();
    for (Endpoint* e : all) e->poll_st(t);
    sw.forward();
    finished = true;
    for (int w = 0; w < kWorkers; ++w) {
      finished = finished && logs[w]->total_ok() == plans[w].size() &&
                 back[w]->total_ok() == plans[kWorkers + w].size() &&
                 rx_server.all_exactly_once(w) && rx_workers.all_exactly_once(kWorkers + w);
    }
  }
  std::printf("[ incast-switch ] switch dropped %llu; server resent %llu, received %llu msgs\n",
              (unsigned long long)sw.dropped(),
              (unsigned long long)server.counters_st().tx_retransmits,
              (unsigned long long)server.counters_st().messages_received);
  EXPECT_TRUE(finished);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(logs[w]->each_once()) << "worker " << w;
    EXPECT_TRUE(back[w]->each_once()) << "worker " << w;
    EXPECT_EQ(logs[w]->first_error + back[w]->first_error, "");
    EXPECT_EQ(server.peer_stats_st(static_cast<uint16_t>(w)).bytes_received, 64 * kMiB)
        << "worker " << w;
  }
  EXPECT_EQ(rx_server.corrupt() + rx_workers.corrupt(), 0u);
  EXPECT_EQ(rx_server.unexpected() + rx_workers.unexpected(), 0u);
  EXPECT_EQ(rx_server.bytes_ok(), 256 * kMiB);
  EXPECT_EQ(rx_workers.bytes_ok(), 16 * kMiB);
  EXPECT_EQ(sw.dropped(), 0u);
  EXPECT_EQ(server.counters_st().drops[static_cast<size_t>(EndpointDrop::kUnknownPeer)], 0u);
}

// A peer that stops answering: everything queued and in flight for it fails,
// once each, with an error naming it; nothing hangs.
TEST(Endpoint, DeadPeerFailsEverythingWithItsName) {
  RingLink link("dead", 40, {.end = {.mtu = kMtu, .impair = faults(0, 5)}});
  std::vector<std::vector<PlannedMessage>> plans = {
      pmdtest::plan_messages(96 * kMiB, 16 << 20, kPatternBytes, 77)};
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  EndpointConfig ca = endpoint_config(3, 0, {{"w2", RingLink::ip_b(40), 47101, 5}}, kEndpoint);
  ca.transport.peer_timeout_us = 200'000;
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), ca, rx_a, now);
  Endpoint b(link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(40), 47100, 3}}, kEndpoint),
             rx_b, now);
  CompletionLog log(plans[0].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log);
  // Run both until some messages are delivered, then only A: B is gone.
  ASSERT_TRUE(run(
      {&a, &b}, [&] { return log.total_ok() >= 3; }, 20));
  const bool finished = run(
      {&a},
      [&] {
        uint64_t n = 0;
        for (size_t i = 0; i < log.ok.size(); ++i) n += log.ok[i] + log.failed[i];
        return n == plans[0].size();
      },
      10);
  EXPECT_TRUE(finished);
  EXPECT_TRUE(log.each_once());
  EXPECT_NE(log.first_error.find("peer w2 (10.0.40.2:47101) did not acknowledge for 200 ms"),
            std::string::npos)
      << log.first_error;
  EXPECT_TRUE(a.peer_stats_st(0).dead);
  EXPECT_GT(a.peer_stats_st(0).messages_failed, 0u);
  for (int i = 0; i < 4; ++i) a.poll_st(rte_rdtsc());  // settles stale resend requests
  EXPECT_TRUE(a.idle_st());
  EXPECT_TRUE(rx_b.none_twice());
  EXPECT_EQ(rx_b.corrupt(), 0u);
  // Messages sent after the death fail too, at once.
  MessageMeta meta;
  const size_t before = log.failed[0];
  ASSERT_EQ(
      a.send(0, pattern().data(), 1000, 0, meta, Completion{&CompletionLog::callback, &log, 0}),
      SubmitStatus::kQueued);
  a.poll_st(rte_rdtsc());
  EXPECT_EQ(log.failed[0], before + 1);
}

// The receiver restarts mid-transfer (a new Endpoint with a newer epoch on
// the same Interface): every message partly sent fails once with an error
// saying so and none of it reaches the new incarnation; messages not yet
// started go to the new incarnation whole; new messages then flow intact.
TEST(Endpoint, PeerRestartFailsPendingThenNewMessagesFlow) {
  RingLink link("restart", 44, {.end = {.mtu = kMtu, .impair = faults(0.01, 20)}});
  std::vector<std::vector<PlannedMessage>> plans = {
      pmdtest::plan_messages(64 * kMiB, 16 << 20, kPatternBytes, 201),
      pmdtest::plan_messages(16 * kMiB, 4 << 20, kPatternBytes, 202)};
  CheckingReceiver rx_a(pattern(), plans), rx_b1(pattern(), plans), rx_b2(pattern(), plans);
  const uint64_t now = rte_rdtsc();
  Endpoint a(link.a(), endpoint_config(3, 0, {{"b", RingLink::ip_b(44), 47101, 0}}, kEndpoint),
             rx_a, now);
  auto b = std::make_unique<Endpoint>(
      link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(44), 47100, 0}}, kEndpoint), rx_b1,
      now);
  CompletionLog log1(plans[0].size()), log2(plans[1].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log1);
  ASSERT_TRUE(run(
      {&a, b.get()}, [&] { return b->peer_stats_st(0).bytes_received >= 12 * kMiB; }, 20));
  // B restarts: a new incarnation on the same port.
  b = std::make_unique<Endpoint>(
      link.b(), endpoint_config(6, 1, {{"a", RingLink::ip_a(44), 47100, 0}}, kEndpoint), rx_b2,
      rte_rdtsc());
  auto settled = [&](const CompletionLog& log) {
    for (size_t i = 0; i < log.ok.size(); ++i) {
      if (log.ok[i] + log.failed[i] == 0) return false;
    }
    return true;
  };
  ASSERT_TRUE(run(
      {&a, b.get()}, [&] { return settled(log1); }, 20));
  EXPECT_TRUE(log1.each_once());
  EXPECT_NE(log1.first_error.find("peer b (10.0.44.2:47101) restarted"), std::string::npos)
      << log1.first_error;
  size_t failed = 0;
  for (size_t i = 0; i < plans[0].size(); ++i) {
    // Delivered exactly once across both incarnations, or failed and
    // delivered nowhere (its tail was never sent to the new one).
    const uint32_t got = rx_b1.count(0, i) + rx_b2.count(0, i);
    EXPECT_EQ(got, log1.ok[i]) << "message " << i;
    failed += log1.failed[i];
  }
  EXPECT_GT(failed, 0u);
  EXPECT_EQ(rx_b1.corrupt() + rx_b2.corrupt(), 0u);
  EXPECT_EQ(a.peer_stats_st(0).transport.tx.restarts, 1u);
  // New messages to the new incarnation arrive whole.
  pmdtest::submit_plan(a, 0, 1, plans[1], pattern(), log2);
  ASSERT_TRUE(run(
      {&a, b.get()},
      [&] { return log2.total_ok() == plans[1].size() && rx_b2.all_exactly_once(1); }, 20));
  EXPECT_TRUE(log2.each_once());
  EXPECT_EQ(log2.first_error, "");
  EXPECT_TRUE(rx_b2.none_twice());
  EXPECT_EQ(rx_b2.corrupt(), 0u);
}

// A peer that never answers (nothing runs behind its address) is declared
// unreachable after connect_timeout_us: queued messages fail with that reason.
// A node about to stop polling acknowledges what waits for its delayed ACK
// (Endpoint::flush_acks_st): the clock is held still, so the ACK delay never
// expires and only the flush can answer.
TEST(Endpoint, FlushAcksAnswersWhatTheDelayedAckHolds) {
  RingLink link("flush", 46, {.end = {.mtu = kMtu, .impair = faults(0, 22)}});
  std::vector<std::vector<PlannedMessage>> plans = {{{1024, 0, 0}}};
  CheckingReceiver rx_a(pattern(), plans), rx_b(pattern(), plans);
  const uint64_t t = rte_rdtsc();
  Endpoint a(link.a(), endpoint_config(3, 0, {{"b", RingLink::ip_b(46), 47101, 5}}, kEndpoint),
             rx_a, t);
  Endpoint b(link.b(), endpoint_config(5, 1, {{"a", RingLink::ip_a(46), 47100, 3}}, kEndpoint),
             rx_b, t);
  CompletionLog log(plans[0].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log);
  for (int i = 0; i < 100 && rx_b.bytes_ok() != 1024; ++i) {
    a.poll_st(t);
    b.poll_st(t);
  }
  ASSERT_EQ(rx_b.bytes_ok(), 1024u);
  for (int i = 0; i < 10; ++i) {
    a.poll_st(t);
    b.poll_st(t);
  }
  // One packet, no ACK request, no time passing: b owes the ACK.
  EXPECT_EQ(a.peer_stats_st(0).outstanding, 1u);
  EXPECT_EQ(b.flush_acks_st(t), 1u);
  EXPECT_EQ(b.flush_acks_st(t), 0u);  // nothing owed any more
  a.poll_st(t);
  EXPECT_EQ(a.peer_stats_st(0).outstanding, 0u);
  EXPECT_EQ(log.total_ok(), 1u);
}

TEST(Endpoint, UnreachablePeerFailsAfterConnectTimeout) {
  RingLink link("unreach", 45, {.end = {.mtu = kMtu, .impair = faults(0, 21)}});
  std::vector<std::vector<PlannedMessage>> plans = {
      pmdtest::plan_messages(4 * kMiB, 1 << 20, kPatternBytes, 301)};
  CheckingReceiver rx(pattern(), plans);
  EndpointConfig c = endpoint_config(3, 0, {{"ps0", RingLink::ip_b(45), 47101, 0}}, kEndpoint);
  c.transport.connect_timeout_us = 100'000;
  Endpoint a(link.a(), c, rx, rte_rdtsc());
  CompletionLog log(plans[0].size());
  pmdtest::submit_plan(a, 0, 0, plans[0], pattern(), log);
  ASSERT_TRUE(run(
      {&a}, [&] { return log.each_once(); }, 10));
  EXPECT_EQ(log.total_ok(), 0u);
  EXPECT_NE(log.first_error.find("peer ps0 (10.0.45.2:47101) did not answer within 100 ms"),
            std::string::npos)
      << log.first_error;
  EXPECT_TRUE(a.peer_stats_st(0).dead);
  EXPECT_TRUE(a.idle_st());
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
