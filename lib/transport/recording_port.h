// A net::PacketPort that records what another port hands up: test-only
// code shared by the endpoint's unit tests and fuzz_endpoint, which replay
// genuine frames as an attacker on the wire would. Each frame is rebuilt
// from its parsed packet (Ethernet, IPv4 and UDP headers are contiguous with
// the Mercury header in every frame these ports carry). Everything else is
// the inner port's. It allocates (the recording); never on a real datapath.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <vector>

#include "net/memory_port.h"

namespace mercury::transport::test {

class RecordingPort final : public net::PacketPort {
 public:
  /// Records at most `limit` frames, the first ones.
  explicit RecordingPort(net::MemoryPort& inner, size_t limit = SIZE_MAX)
      : inner_(inner), limit_(limit) {}
  uint16_t poll_rx_st(net::RxPacket* out, uint16_t n, uint64_t now) override {
    const uint16_t got = inner_.poll_rx_st(out, n, now);
    for (uint16_t i = 0; i < got && frames.size() < limit_; ++i) {
      const net::ParsedFrame& f = out[i].parsed;
      frames.emplace_back(f.wire_header - net::FrameTemplate::kSize,
                          f.payload.data() + f.payload.size());
    }
    return got;
  }
  void release_st(net::PacketBuf* const* bufs, uint16_t n) override { inner_.release_st(bufs, n); }
  bool resolve_st(uint32_t ip, uint16_t port, net::Route& out, uint64_t now) override {
    return inner_.resolve_st(ip, port, out, now);
  }
  [[nodiscard]] uint16_t tx_room() const override { return inner_.tx_room(); }
  uint16_t stage_burst_st(const net::TxFrame* f, uint16_t n) override {
    return inner_.stage_burst_st(f, n);
  }
  uint16_t flush_st(uint64_t now) override { return inner_.flush_st(now); }
  [[nodiscard]] uint32_t mtu() const override { return inner_.mtu(); }
  [[nodiscard]] uint32_t rx_room() const override { return inner_.rx_room(); }
  [[nodiscard]] std::string name() const override { return "recording " + inner_.name(); }
  [[nodiscard]] const net::BufferOps& buffer_ops() const override { return inner_.buffer_ops(); }
  [[nodiscard]] uint32_t tx_pending() const override { return inner_.tx_pending(); }
  [[nodiscard]] Traffic traffic() const override { return inner_.traffic(); }
  [[nodiscard]] const std::array<uint64_t, net::kDropReasonCount>& drops() const override {
    return inner_.drops();
  }

  /// The first recorded frame that is data (not a pure ACK).
  [[nodiscard]] const std::vector<std::byte>& first_data() const {
    for (const auto& f : frames) {
      const auto& h = *reinterpret_cast<const wire::Header*>(f.data() + net::FrameTemplate::kSize);
      if (h.type == static_cast<uint8_t>(wire::PacketType::kData)) return f;
    }
    throw std::runtime_error("no data frame recorded");
  }

  std::vector<std::vector<std::byte>> frames;

 private:
  net::MemoryPort& inner_;
  size_t limit_;
};

}  // namespace mercury::transport::test
