// Shared pieces of the endpoint unit tests: two net::MemoryPorts joined as a
// link, a fake clock that advances one microsecond per pass, endpoint
// configurations, a MessageReceiver that keeps every message it was given,
// and a log of completions. Test-only code: it allocates freely.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/memory_port.h"
#include "transport/endpoint.h"
#include "transport/test_util.h"

namespace mercury::transport::test {

inline constexpr uint32_t kMtu = 1500;
inline constexpr uint32_t kPayload = net::payload_per_packet(kMtu);  // 1408

inline net::LocalAddr address(uint8_t host, uint16_t port) {
  return net::LocalAddr{net::MacAddr{{0x02, 0, 0, 0, 0, host}}, 0x0a000000u | host, port};
}
inline const net::LocalAddr kAddrA = address(1, 47100);
inline const net::LocalAddr kAddrB = address(2, 47101);

/// Peer spec of the other end (peer_epoch 0: learnt by the probe exchange).
inline PeerSpec peer_at(const char* name, const net::LocalAddr& a, uint32_t peer_epoch = 0) {
  return PeerSpec{name, a.ip, a.udp_port, peer_epoch};
}

/// One peer, window 16, the transport settings of test_config (1 tick = 1 ns).
inline EndpointConfig endpoint_config(uint32_t epoch, uint16_t sender_id, const PeerSpec& peer,
                                      uint32_t window = 16) {
  EndpointConfig c;
  c.transport = test_config(window);
  c.local_epoch = epoch;
  c.sender_id = sender_id;
  c.max_messages = 512;
  c.ingress_capacity = 512;
  c.peers = {peer};
  return c;
}

/// Two in-memory ports a (10.0.0.1:47100) and b (10.0.0.2:47101) joined as
/// a link, and the clock.
struct Link {
  net::MemoryPort a{kAddrA, net::MemoryPortOptions{.mtu = kMtu, .buffers = 2048}};
  net::MemoryPort b{kAddrB, net::MemoryPortOptions{.mtu = kMtu, .buffers = 2048}};
  Tick now = kMs;
  Link() { net::MemoryPort::connect(a, b); }

  /// Both directions impaired alike (each with its own seed).
  void impair(double loss, double reorder, double duplicate, uint64_t seed) {
    a.set_link({.loss = loss, .duplicate = duplicate, .reorder = reorder, .seed = seed});
    b.set_link({.loss = loss, .duplicate = duplicate, .reorder = reorder, .seed = seed * 31 + 7});
  }

  /// Polls `eps` once per simulated microsecond until done() or `limit`
  /// simulated ticks; false on time out.
  template <class Done>
  bool run(const std::vector<Endpoint*>& eps, Done done, Tick limit = 5'000 * kMs) {
    const Tick end = now + limit;
    while (now < end) {
      now += kUs;
      for (Endpoint* e : eps) e->poll_st(now);
      if (done()) return true;
    }
    return false;
  }
  /// Polls for `ticks` of simulated time.
  void idle(const std::vector<Endpoint*>& eps, Tick ticks) {
    run(
        eps, [] { return false; }, ticks);
  }
};

/// The bytes of message `key`: a pattern no other message shares.
inline std::vector<std::byte> pattern(uint32_t key, uint32_t len) {
  std::vector<std::byte> v(len);
  for (uint32_t i = 0; i < len; ++i) v[i] = std::byte((i * 31 + key * 7 + (i >> 8)) & 0xff);
  return v;
}

/// Keeps every message it is given, by block_key; refuses those `refuse`
/// says. Buffers are pre-filled, so a byte never written shows.
class Inbox final : public MessageReceiver {
 public:
  struct Message {
    std::vector<std::byte> bytes;
    uint32_t begun = 0;
    uint32_t completed = 0;
    wire::PacketType type = wire::PacketType::kData;
  };
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    if (refuse != nullptr && refuse(h.block_key)) {
      ++refused;
      return nullptr;
    }
    Message& m = messages[h.block_key];
    m.bytes.assign(h.msg_len == 0 ? 1 : h.msg_len, std::byte{0xEE});  // never a null buffer
    m.type = h.type;
    ++m.begun;
    return m.bytes.data();
  }
  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte*) override {
    ++messages[h.block_key].completed;
  }
  void on_message_abandoned(uint16_t, uint32_t, std::byte*) override { ++abandoned; }

  /// Message `key` arrived exactly once with exactly `want`'s bytes.
  bool has(uint32_t key, const std::vector<std::byte>& want) const {
    const auto it = messages.find(key);
    if (it == messages.end() || it->second.completed != 1 || it->second.begun != 1) return false;
    const std::vector<std::byte>& got = it->second.bytes;
    return want.empty() ? got.size() == 1 : got == want;
  }

  bool (*refuse)(uint32_t key) = nullptr;
  std::map<uint32_t, Message> messages;
  uint32_t refused = 0;
  uint32_t abandoned = 0;
};

/// Completions by cookie, with the first error text.
struct Log {
  std::map<uint64_t, uint32_t> ok, failed;
  std::string first_error;
  SendStatus first_status = SendStatus::kDelivered;
  static void callback(void* self, const SendResult& r) {
    auto& log = *static_cast<Log*>(self);
    if (r.ok()) {
      ++log.ok[r.cookie];
      return;
    }
    ++log.failed[r.cookie];
    if (log.first_error.empty()) {
      log.first_error = std::string(r.error);
      log.first_status = r.status;
    }
  }
  Completion done(uint64_t cookie) { return Completion{&Log::callback, this, cookie}; }
  uint64_t settled(uint64_t cookie) const {
    const auto a = ok.find(cookie), b = failed.find(cookie);
    return (a == ok.end() ? 0 : a->second) + (b == failed.end() ? 0 : b->second);
  }
  /// Cookies [0, n) each completed exactly once, successfully.
  bool all_ok(uint64_t n) const {
    for (uint64_t c = 0; c < n; ++c) {
      const auto it = ok.find(c);
      if (it == ok.end() || it->second != 1 || failed.count(c) != 0) return false;
    }
    return ok.size() == n;
  }
};

/// Sends `bodies[i]` as message i (block_key first_key + i, cookie i),
/// priority i % 8.
inline void send_all(Endpoint& ep, const std::vector<std::vector<std::byte>>& bodies, Log& log,
                     wire::PacketType type = wire::PacketType::kData, uint32_t first_key = 0) {
  for (uint32_t i = 0; i < bodies.size(); ++i) {
    MessageMeta meta;
    meta.type = type;
    meta.block_key = first_key + i;
    if (ep.send(0, bodies[i].data(), static_cast<uint32_t>(bodies[i].size()),
                static_cast<uint8_t>(i % 8), meta, log.done(i)) != SubmitStatus::kQueued) {
      throw std::runtime_error("send refused");
    }
  }
}

}  // namespace mercury::transport::test
