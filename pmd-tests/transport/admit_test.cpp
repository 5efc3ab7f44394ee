// Flow control at the receiver (PacketReceiver::admit) over a net_ring link:
// a receiver that refuses every packet a fixed number of times before it
// admits it must still get every byte exactly once, the refused copies are
// never acknowledged (the sender resends them), and what is not offered
// (control messages for the MessageReceiver, duplicates) keeps its usual
// path. Runs without faults and under loss, reordering and duplication.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "endpoint_config.h"
#include "messages.h"
#include "pmd_env.h"
#include "ring_link.h"

namespace mercury::transport {
namespace {

using pmdtest::CompletionLog;
using pmdtest::endpoint_config;
using pmdtest::faults;
using pmdtest::RingLink;
using pmdtest::run;

constexpr uint32_t kMtu = 1500;
constexpr uint32_t kRefusals = 3;  // per packet, before it is admitted
constexpr uint32_t kMessages = 24;
constexpr uint32_t kMessageBytes = 48 * 1024 + 20;  // a partial last packet

// Peers declared dead after 10 s without progress.
constexpr pmdtest::EndpointOptions kEndpoint = {.peer_timeout_ms = 10'000};

// Refuses some (block_key, offset) kRefusals times each, then admits them; checks
// every delivered payload against the pattern and counts deliveries. Keeps
// every third mbuf for a while (frees it on the next packet) so both
// ownership paths run. Takes control messages whole.
class RefusingReceiver final : public PacketReceiver, public MessageReceiver {
 public:
  explicit RefusingReceiver(const std::vector<std::byte>& pattern) : pattern_(pattern) {}
  ~RefusingReceiver() { release(); }

  bool admit(uint16_t, const wire::HeaderFields& h) override {
    if (h.type == wire::PacketType::kControl) ++control_offered_;
    uint32_t& n = offers_[{h.block_key, h.offset}];
    if (!refused_here(h.block_key, h.offset)) return true;
    if (n < kRefusals) {
      ++n;
      ++refused_;
      return false;
    }
    return true;
  }

  bool on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                 net::PacketBuf* buf) override {
    rte_mbuf* mbuf = net::mbuf_of(buf);
    release();
    const auto key = std::make_pair(h.block_key, h.offset);
    if (refused_here(h.block_key, h.offset) && offers_[key] != kRefusals) ++delivered_unrefused_;
    ++delivered_[key];
    const size_t at = size_t{h.block_key} * kMessageBytes + h.offset;
    if (h.msg_len != kMessageBytes || payload.size() != h.payload_len ||
        h.offset + h.payload_len > kMessageBytes ||
        std::memcmp(payload.data(), pattern_.data() + at, payload.size()) != 0) {
      ++corrupt_;
    } else {
      bytes_ok_ += payload.size();
    }
    if (++packets_ % 3 != 0) return false;
    kept_ = mbuf;
    return true;
  }

  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    control_.emplace_back(h.msg_len);
    return control_.back().data();
  }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {
    ++control_done_;
  }

  // One packet in three is refused (the others' SACKs let the sender find
  // the refused ones quickly; refusing all would leave it only its RTO).
  static bool refused_here(uint32_t key, uint32_t offset) { return (key + offset / 1408) % 3 == 0; }
  void release() {
    if (kept_ != nullptr) rte_pktmbuf_free(kept_);
    kept_ = nullptr;
  }
  // Every packet of every message delivered exactly once.
  bool each_once(uint32_t chunk) const {
    for (uint32_t k = 0; k < kMessages; ++k) {
      for (uint32_t o = 0; o < kMessageBytes; o += chunk) {
        const auto it = delivered_.find({k, o});
        if (it == delivered_.end() || it->second != 1) return false;
      }
    }
    return delivered_.size() == size_t{kMessages} * ((kMessageBytes + chunk - 1) / chunk);
  }
  uint64_t bytes_ok() const { return bytes_ok_; }
  uint64_t corrupt() const { return corrupt_; }
  uint64_t refused() const { return refused_; }
  uint64_t delivered_unrefused() const { return delivered_unrefused_; }
  uint64_t control_offered() const { return control_offered_; }
  uint64_t control_done() const { return control_done_; }

 private:
  const std::vector<std::byte>& pattern_;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> offers_, delivered_;
  std::vector<std::vector<std::byte>> control_;
  rte_mbuf* kept_ = nullptr;
  uint64_t packets_ = 0, bytes_ok_ = 0, corrupt_ = 0, refused_ = 0, delivered_unrefused_ = 0;
  uint64_t control_offered_ = 0, control_done_ = 0;
};

struct Quiet final : MessageReceiver {
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields&) override { return nullptr; }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {}
};

void refuse_then_admit(const char* name, uint8_t net, double loss) {
  RingLink link(name, net, {.end = {.mtu = kMtu, .impair = faults(loss, 40 + net)}});
  const std::vector<std::byte> pattern =
      pmdtest::random_pattern(size_t{kMessages} * kMessageBytes, 7 + net);
  const std::vector<std::byte> control(3000, std::byte{0x5a});
  RefusingReceiver receiver(pattern);
  Quiet quiet;
  const uint64_t now = rte_rdtsc();
  Endpoint sender(link.a(), endpoint_config(1, 1, {{"b", RingLink::ip_b(net), 47101}}, kEndpoint),
                  quiet, now);
  Endpoint server(link.b(), endpoint_config(2, 2, {{"a", RingLink::ip_a(net), 47100}}, kEndpoint),
                  Receivers{&receiver, &receiver}, now);
  CompletionLog log(kMessages + 1);
  for (uint32_t k = 0; k < kMessages; ++k) {
    MessageMeta meta;
    meta.block_key = k;
    meta.dtype = wire::Dtype::kFloat32;
    ASSERT_EQ(sender.send(0, pattern.data() + size_t{k} * kMessageBytes, kMessageBytes,
                          static_cast<uint8_t>(k % 4), meta,
                          Completion{&CompletionLog::callback, &log, k}),
              SubmitStatus::kQueued);
  }
  MessageMeta cm;
  cm.type = wire::PacketType::kControl;
  ASSERT_EQ(sender.send(0, control.data(), static_cast<uint32_t>(control.size()), 0, cm,
                        Completion{&CompletionLog::callback, &log, kMessages}),
            SubmitStatus::kQueued);
  const bool done = run(
      {&sender, &server}, [&] { return log.total_ok() == kMessages + 1; }, 60);
  receiver.release();
  ASSERT_TRUE(done) << "completed " << log.total_ok() << " of " << kMessages + 1 << "; "
                    << log.first_error;
  EXPECT_TRUE(log.each_once());
  const uint32_t chunk = sender.max_payload();
  const uint64_t packets = uint64_t{kMessages} * ((kMessageBytes + chunk - 1) / chunk);
  uint64_t refusable = 0;
  for (uint32_t k = 0; k < kMessages; ++k) {
    for (uint32_t o = 0; o < kMessageBytes; o += chunk) {
      refusable += RefusingReceiver::refused_here(k, o) ? 1 : 0;
    }
  }
  ASSERT_EQ(chunk, 1408u);  // net::payload_per_packet(1500), as refused_here assumes
  EXPECT_TRUE(receiver.each_once(chunk));
  EXPECT_EQ(receiver.corrupt(), 0u);
  EXPECT_EQ(receiver.bytes_ok(), uint64_t{kMessages} * kMessageBytes);
  // Nothing reached on_packet before it had been refused kRefusals times,
  // and every refusal was counted as a drop by the endpoint, unacknowledged.
  EXPECT_EQ(receiver.delivered_unrefused(), 0u);
  EXPECT_EQ(receiver.refused(), refusable * kRefusals);
  const EndpointCounters c = server.counters_st();
  EXPECT_EQ(c.drops[static_cast<size_t>(EndpointDrop::kBackpressure)], receiver.refused());
  EXPECT_EQ(server.peer_stats_st(0).packets_refused, receiver.refused());
  EXPECT_EQ(c.packets_delivered, packets);
  // Control messages go whole to the MessageReceiver, never offered.
  EXPECT_EQ(receiver.control_offered(), 0u);
  EXPECT_EQ(receiver.control_done(), 1u);
  // Without faults, every refused copy was a transmission of its own, so the
  // sender resent at least that many (under faults a link duplicate may be
  // refused too).
  if (loss == 0) {
    EXPECT_GE(sender.counters_st().tx_retransmits, receiver.refused());
  }
  std::printf("%s: %lu packets, %lu refused, %lu resends\n", name,
              static_cast<unsigned long>(packets), static_cast<unsigned long>(receiver.refused()),
              static_cast<unsigned long>(sender.counters_st().tx_retransmits));
}

TEST(EndpointAdmit, RefusedPacketsAreResentAndDeliveredOnce) { refuse_then_admit("adm0", 60, 0.0); }

TEST(EndpointAdmit, RefusedPacketsAreResentAndDeliveredOnceUnderFaults) {
  refuse_then_admit("adm1", 61, 0.01);
}

}  // namespace
}  // namespace mercury::transport

int main(int argc, char** argv) { return mercury::pmdtest::run_all_tests(argc, argv, {}); }
