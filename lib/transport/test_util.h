// Helpers shared by the transport unit tests: a recording sink and configs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "transport/transport.h"
#include "wire/header.h"

namespace mercury::transport::test {

/// `h` encoded and decoded again (with a zero payload of h.payload_len
/// bytes): what the peer reads off the wire. The decode must accept it.
inline wire::HeaderFields over_the_wire(const wire::HeaderFields& h) {
  std::vector<std::byte> pkt(wire::kHeaderSize + h.payload_len);
  wire::encode(h, std::span<std::byte, wire::kHeaderSize>(pkt.data(), wire::kHeaderSize));
  wire::HeaderFields out;
  EXPECT_EQ(wire::decode(pkt, out), wire::Reject::kNone);
  return out;
}

/// One tick per nanosecond keeps test arithmetic readable.
inline constexpr uint64_t kHz = 1'000'000'000;
inline constexpr Tick kUs = 1'000;
inline constexpr Tick kMs = 1'000'000;

inline Config test_config(uint32_t window = 16) {
  Config c;
  c.tsc_hz = kHz;
  c.window_packets = window;
  c.cwnd_floor = 2;
  c.reorder_threshold = 3;
  c.max_reorder_threshold = 16;
  c.initial_rto_us = 5'000;
  c.min_rto_us = 1'000;
  c.max_rto_us = 200'000;
  c.peer_timeout_us = 1'000'000;
  c.ack_every = 4;
  c.ack_delay_us = 20;
  return c;
}

inline Params test_params(uint32_t window = 16) { return resolve(test_config(window)); }

struct LostEvent {
  uint32_t seq;
  SliceRef slice;
  LossKind kind;
};

struct FailedEvent {
  SliceRef slice;
  FailReason why;
};

class RecordingSink final : public SenderSink {
 public:
  void on_acked(const SliceRef& s) override { acked.push_back(s); }
  void on_lost(uint32_t seq, const SliceRef& s, LossKind k) override {
    lost.push_back({seq, s, k});
  }
  void on_failed(const SliceRef& s, FailReason why) override { failed.push_back({s, why}); }
  void clear() {
    acked.clear();
    lost.clear();
    failed.clear();
  }
  std::vector<uint32_t> lost_seqs() const {
    std::vector<uint32_t> v;
    for (const auto& e : lost) v.push_back(e.seq);
    return v;
  }

  std::vector<SliceRef> acked;
  std::vector<LostEvent> lost;
  std::vector<FailedEvent> failed;
};

/// Slice i of a test message: distinct token/offset so each is recognisable.
inline SliceRef slice_of(uint32_t i) {
  return {.msg_token = 100 + i, .offset = i * 1000, .len = 1000, .priority = uint8_t(i % 5)};
}

/// SACK bitmap with bits for seqs [first, last] given cumulative ack `cum`.
inline uint64_t sack_range(uint32_t cum, uint32_t first, uint32_t last) {
  uint64_t bits = 0;
  for (uint32_t s = first; s != last + 1; ++s) bits |= uint64_t{1} << (s - cum - 1);
  return bits;
}

}  // namespace mercury::transport::test
