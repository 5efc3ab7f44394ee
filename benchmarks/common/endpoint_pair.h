// Two transport endpoints on one net_ring link (pmdtest::RingLink), both
// polled by one thread, for the endpoint benchmarks over net_ring
// (transport_pmd_bench, slices_bench): every figure is the CPU cost of both
// ends together. a (10.0.<net>.1, epoch 3) sends; b (10.0.<net>.2, epoch 5)
// receives into a MessageSink, and per packet into a PacketReceiver if one
// is given. Benchmark code: set-up allocates and throws.
#pragma once

#include <rte_cycles.h>

#include <cstdint>
#include <string>
#include <vector>

#include "endpoint_config.h"
#include "ring_link.h"
#include "transport/endpoint.h"

namespace mercury::bench {

/// Places payloads of up to 4 MiB in one of 16 fixed buffers (by
/// block_key): no allocation, no check (the PMD tests do the checking).
class MessageSink final : public transport::MessageReceiver {
 public:
  static constexpr uint32_t kBytes = 4u << 20;
  MessageSink() : buffers_(16, std::vector<std::byte>(kBytes)) {}
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    return h.msg_len <= kBytes ? buffers_[h.block_key % 16].data() : nullptr;
  }
  void on_message_complete(uint16_t, const wire::HeaderFields&, std::byte*) override {
    ++completed;
  }
  uint64_t completed = 0;

 private:
  std::vector<std::vector<std::byte>> buffers_;
};

/// A Completion's function: counts a delivered message into the uint64_t at `n`.
inline void count_delivered(void* n, const transport::SendResult& r) {
  if (r.ok()) ++*static_cast<uint64_t*>(n);
}

struct EndpointPair {
  /// `endpoint`: both ends' options; `cwnd_floor` (0: the library's) too.
  EndpointPair(const std::string& name, uint8_t net, const pmdtest::RingLinkOptions& link_options,
               transport::PacketReceiver* b_packets = nullptr,
               const pmdtest::EndpointOptions& endpoint = {}, uint32_t cwnd_floor = 0)
      : link(name, net, link_options),
        a(link.a(), config(3, {"b", pmdtest::RingLink::ip_b(net), 47101, 5}, endpoint, cwnd_floor),
          sink_a, rte_rdtsc()),
        b(link.b(), config(5, {"a", pmdtest::RingLink::ip_a(net), 47100, 3}, endpoint, cwnd_floor),
          transport::Receivers{&sink_b, b_packets}, rte_rdtsc()) {}

  /// Polls both ends until `done()`; false after `limit_s` seconds.
  template <typename Done>
  bool poll_until(Done done, double limit_s = 60) {
    const uint64_t deadline = rte_rdtsc() + static_cast<uint64_t>(limit_s * rte_get_tsc_hz());
    while (!done()) {
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
      if (now > deadline) return false;
    }
    return true;
  }
  /// A few passes, so that the last ACKs and any duplicates are consumed
  /// before the next variant uses the link.
  void settle() {
    for (int i = 0; i < 2000; ++i) {
      const uint64_t now = rte_rdtsc();
      a.poll_st(now);
      b.poll_st(now);
    }
  }

  pmdtest::RingLink link;
  MessageSink sink_a, sink_b;
  transport::Endpoint a, b;

 private:
  static transport::EndpointConfig config(uint32_t epoch, transport::PeerSpec peer,
                                          const pmdtest::EndpointOptions& o, uint32_t floor) {
    transport::EndpointConfig c = pmdtest::endpoint_config(epoch, 0, {std::move(peer)}, o);
    if (floor != 0) c.transport.cwnd_floor = floor;
    return c;
  }
};

}  // namespace mercury::bench
