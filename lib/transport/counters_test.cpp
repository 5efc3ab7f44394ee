// The transport's and the endpoint's counter structs are declared from one
// list each (base/counter_list.h): every field is summed by operator+=
// and visited by for_each, so none can be forgotten by a reader.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstddef>
#include <map>
#include <set>
#include <string>

#include "transport/endpoint.h"
#include "transport/transport.h"

namespace mercury::transport {
namespace {

// Every 64-bit word of a T holds a distinct value.
template <class T>
T distinct_words(uint64_t seed) {
  static_assert(sizeof(T) % 8 == 0);
  std::array<uint64_t, sizeof(T) / 8> w{};
  for (size_t i = 0; i < w.size(); ++i) w[i] = seed + 0x10001 * (i + 1);
  return std::bit_cast<T>(w);
}

template <class T>
std::array<uint64_t, sizeof(T) / 8> words(const T& t) {
  return std::bit_cast<std::array<uint64_t, sizeof(T) / 8>>(t);
}

// for_each's output as prefix + name -> value.
template <class T>
std::map<std::string, uint64_t> visited(const T& t) {
  std::map<std::string, uint64_t> m;
  t.for_each([&](std::string_view prefix, std::string_view name, uint64_t v) {
    const std::string key = std::string(prefix) + std::string(name);
    EXPECT_EQ(m.count(key), 0u) << key << " visited twice";
    m[key] = v;
  });
  return m;
}

// For a struct of 64-bit counters only: a += a doubles every word, and
// for_each visits one counter per word. Returns a, for more checks.
template <class T>
T expect_every_word_summed_and_visited(uint64_t seed) {
  const auto a = distinct_words<T>(seed);
  T sum = a;
  sum += a;
  const auto before = words(a), after = words(sum);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], 2 * before[i]) << "word " << i;
  EXPECT_EQ(visited(a).size(), sizeof(T) / 8);
  return a;
}

TEST(Counters, EveryReceiverCounterIsSummedAndVisited) {
  expect_every_word_summed_and_visited<ReceiverCounters>(1);
}

#define COUNT_ONE(...) +1
constexpr size_t kSenderCounters = 0 MERCURY_SENDER_COUNTERS(COUNT_ONE);
constexpr size_t kSenderEstimates = 0 MERCURY_SENDER_ESTIMATES(COUNT_ONE);
#undef COUNT_ONE

TEST(Counters, EverySenderCounterIsSummedAndEveryEstimateKept) {
  // The counters are the leading words; the estimates follow them and
  // nothing else is in the struct.
  static_assert(offsetof(SenderCounters, srtt) == 8 * kSenderCounters);
  static_assert(sizeof(SenderCounters) ==
                8 * kSenderCounters + 4 * sizeof(Tick) + 3 * sizeof(uint32_t) + 4 /* padding */);
  const auto a = distinct_words<SenderCounters>(5);
  SenderCounters sum = a;
  sum += a;
  const auto before = words(a), after = words(sum);
  for (size_t i = 0; i < kSenderCounters; ++i) {
    EXPECT_EQ(after[i], 2 * before[i]) << "word " << i;
  }
  EXPECT_EQ(sum.srtt, a.srtt);
  EXPECT_EQ(sum.rto, a.rto);
  EXPECT_EQ(sum.cwnd, a.cwnd);
  EXPECT_EQ(sum.reorder_threshold, a.reorder_threshold);
  const auto v = visited(a);
  EXPECT_EQ(v.size(), kSenderCounters + kSenderEstimates);
  EXPECT_EQ(v.at("retransmits_fast"), a.retransmits_fast);
  EXPECT_EQ(v.at("cwnd"), a.cwnd);
}

TEST(Counters, PeerCountersSumAndVisitBothHalves) {
  PeerCounters a;
  a.tx = distinct_words<SenderCounters>(9);
  a.rx = distinct_words<ReceiverCounters>(900);
  a.probes_sent = 77;
  a.persist_probes = 5;
  a.challenges = 11;
  a.challenge_answers = 12;
  a.challenged = 13;
  PeerCounters sum = a;
  sum += a;
  EXPECT_EQ(sum.tx.rtt_samples, 2 * a.tx.rtt_samples);
  EXPECT_EQ(sum.tx.cwnd, a.tx.cwnd);
  EXPECT_EQ(words(sum.rx), words(ReceiverCounters(a.rx) += a.rx));
  EXPECT_EQ(sum.probes_sent, 154u);
  EXPECT_EQ(sum.persist_probes, 10u);
  EXPECT_EQ(sum.challenges, 22u);
  EXPECT_EQ(sum.challenge_answers, 24u);
  EXPECT_EQ(sum.challenged, 26u);
  const auto v = visited(a);
  EXPECT_EQ(v.size(), kSenderCounters + kSenderEstimates + sizeof(ReceiverCounters) / 8 + 5);
  EXPECT_EQ(v.at("challenged"), 13u);
  EXPECT_EQ(v.at("tx_packets_sent"), a.tx.packets_sent);
  EXPECT_EQ(v.at("rx_acks_sent"), a.rx.acks_sent);
  EXPECT_EQ(v.at("probes_sent"), 77u);
  EXPECT_EQ(v.at("persist_probes"), 5u);
}

TEST(Counters, EveryEndpointCounterIsSummedAndVisited) {
  const auto a = expect_every_word_summed_and_visited<EndpointCounters>(3);
  const auto v = visited(a);
  EXPECT_EQ(v.at("resends_left_edge"), a.resends_left_edge);
  EXPECT_EQ(v.at("drop_backpressure"), a.drop(EndpointDrop::kBackpressure));
  EXPECT_EQ(v.at("verdict_duplicate"), a.verdicts[static_cast<size_t>(RxVerdict::kDuplicate)]);
}

TEST(Counters, EndpointPeerStatsSumCountersAndKeepGauges) {
  EndpointPeerStats a;
  a.transport.tx = distinct_words<SenderCounters>(40);
  a.transport.rx = distinct_words<ReceiverCounters>(4000);
  a.transport.probes_sent = 3;
  a.messages_sent = 1;
  a.messages_failed = 2;
  a.messages_received = 3;
  a.messages_refused = 4;
  a.packets_delivered = 5;
  a.packets_refused = 6;
  a.bytes_received = 7;
  a.outstanding = 8;
  a.waiting_resend = 9;
  a.resolved = true;
  a.dead = true;
  EndpointPeerStats sum = a;
  sum += a;
  const auto va = visited(a), vs = visited(sum);
  ASSERT_EQ(va.size(), vs.size());
  // Gauges and estimates keep their value; every other field doubles.
  const std::set<std::string> kept = {"outstanding", "waiting_resend", "resolved", "dead",
#define KEPT(type, name, doc) "tx_" #name,
                                      MERCURY_SENDER_ESTIMATES(KEPT)
#undef KEPT
  };
  for (const auto& [name, value] : va) {
    EXPECT_EQ(vs.at(name), kept.count(name) != 0 ? value : 2 * value) << name;
  }
  EXPECT_EQ(va.size(),
            kSenderCounters + kSenderEstimates + sizeof(ReceiverCounters) / 8 + 5 + 7 + 4);
  EXPECT_EQ(va.at("bytes_received"), 7u);
  EXPECT_EQ(va.at("dead"), 1u);
}

}  // namespace
}  // namespace mercury::transport
