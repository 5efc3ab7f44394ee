// One link's worth of transport work, driven one data packet at a time, for
// the benchmarks (timed: transport_bench; counted: transport_instr).
//
// Two Peers with known epochs, one core, a fake clock. Each step sends one data
// packet from `a` (a resend first if one is waiting, else a new slice of a
// 16-packet message), delivers it to `b` unless the dropper says otherwise,
// sends a pure ACK back when b's policy says so (or when a is blocked), and runs
// a's timer every 64 packets. kWithCodec also encodes and decodes every header.
#pragma once

#include <array>
#include <span>
#include <vector>

#include "transport/transport.h"

namespace mercury::transport::bench {

// 1500-byte MTU minus IPv4, UDP, Mercury header, before net::payload_per_packet
// rounded it to whole lines (1408); the protocol's cost does not depend on it.
inline constexpr uint32_t kPayload = 1416;
inline constexpr uint32_t kPacketsPerMsg = 16;

inline Config link_config() {
  Config c;
  c.tsc_hz = 1'000'000'000;
  c.window_packets = 64;
  c.ack_every = 4;
  c.ack_delay_us = 10;
  c.min_rto_us = 1'000;
  c.initial_rto_us = 5'000;
  c.peer_timeout_us = 1'000'000'000;
  return c;
}

class CountingSink final : public SenderSink {
 public:
  void on_acked(const SliceRef&) override { ++acked; }
  void on_lost(uint32_t seq, const SliceRef&, LossKind) override { lost.push_back(seq); }
  void on_failed(const SliceRef&, FailReason) override { ++failed; }
  uint64_t acked = 0;
  uint64_t failed = 0;
  std::vector<uint32_t> lost;
};

/// Drops `per_mille` of the packets it is asked about, evenly spread.
struct Dropper {
  explicit Dropper(uint32_t per_mille) : per_mille(per_mille) {}
  bool drop() {
    acc += per_mille;
    if (acc < 1000) return false;
    acc -= 1000;
    return true;
  }
  uint32_t per_mille;
  uint32_t acc = 500;
};

inline void data_header(wire::HeaderFields& h, uint32_t msg, uint32_t part) {
  h.type = wire::PacketType::kData;
  h.msg_id = msg;
  h.msg_len = kPayload * kPacketsPerMsg;
  h.offset = kPayload * part;
  h.payload_len = kPayload;
}

template <bool kWithCodec>
class LinkLoop {
 public:
  explicit LinkLoop(uint32_t loss_per_mille)
      : a_(link_config(), 1, 0, 2), b_(link_config(), 2, 0, 1), dropper_(loss_per_mille) {
    lost_.reserve(1024);
    sink_a_.lost.reserve(1024);
  }

  /// One step; returns true if a data packet was sent.
  bool step() {
    now_ += 120;  // ~1500 B at 100 Gbit/s
    SliceRef s;
    bool ok = false;
    h_ = {};
    if (rtx_next_ < sink_a_.lost.size() && a_.can_resend()) {
      // The transport stamps seq/epoch/flags/ack; the glue fills the rest from
      // the slice it gets back.
      ok = a_.resend(sink_a_.lost[rtx_next_++], now_, s, h_) == Resend::kSend;
      if (ok) data_header(h_, static_cast<uint32_t>(s.msg_token), s.offset / kPayload);
    }
    if (!ok && a_.can_send()) {
      const uint32_t msg = static_cast<uint32_t>(sent_new_ / kPacketsPerMsg);
      const uint32_t part = static_cast<uint32_t>(sent_new_ % kPacketsPerMsg);
      data_header(h_, msg, part);
      s = {msg, part * kPayload, kPayload, 0};
      ok = a_.send(s, now_, h_);
      ++sent_new_;
    }
    if (ok) {
      ++packets_;
      if (!dropper_.drop()) b_.on_packet(carry(h_, pkt_), now_, sink_b_);
    }
    if (b_.ack_due(now_) || !ok) {
      ack_ = {};
      b_.fill_pure_ack(now_, ack_);
      a_.on_packet(carry(ack_, ack_pkt_), now_, sink_a_);
    }
    if (packets_ % 64 == 0) a_.on_timer(now_, sink_a_);
    if (rtx_next_ == sink_a_.lost.size()) {
      sink_a_.lost.clear();
      rtx_next_ = 0;
    }
    return ok;
  }

  uint64_t packets() const { return packets_; }
  const Peer& sender() const { return a_; }
  const CountingSink& sender_sink() const { return sink_a_; }

 private:
  // What crosses the wire: the header itself, or its encoding decoded again.
  template <size_t N>
  const wire::HeaderFields& carry(const wire::HeaderFields& h, std::array<std::byte, N>& buf) {
    if constexpr (!kWithCodec) {
      return h;
    } else {
      wire::encode(h, std::span<std::byte, wire::kHeaderSize>(buf.data(), wire::kHeaderSize));
      wire::decode(std::span<const std::byte>(buf.data(), wire::kHeaderSize + h.payload_len), in_);
      return in_;
    }
  }

  Peer a_;
  Peer b_;
  CountingSink sink_a_, sink_b_;
  Dropper dropper_;
  std::vector<uint32_t> lost_;
  std::array<std::byte, wire::kHeaderSize + kPayload> pkt_{};
  std::array<std::byte, wire::kHeaderSize> ack_pkt_{};
  wire::HeaderFields h_, ack_, in_;
  Tick now_ = 0;
  uint64_t packets_ = 0;
  uint64_t sent_new_ = 0;
  size_t rtx_next_ = 0;
};

}  // namespace mercury::transport::bench
