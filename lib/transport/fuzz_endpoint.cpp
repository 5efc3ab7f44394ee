// libFuzzer target for the whole receive path: frames into a net::MemoryPort,
// parse_frame, the endpoint's job, peer and authentication checks, the
// transport's state, placement. Two Endpoints (a and b) on a MemoryPort link,
// with or without a job key (the input's first byte), run a script the input
// writes: messages either way, time passing (polls, timers), the link's loss,
// duplication and reordering, and an attacker on b's wire injecting arbitrary
// bytes, frames of its own making (any header, any payload, any auth block),
// and genuine frames recorded off the link, replayed whole or with a byte
// changed. Beyond "no crash, no UB" (ASan/UBSan), it checks: every send
// completes at most once; no buffer is lost; and with a key, every message b
// completes is one a sent, byte for byte (nothing forged or altered gets
// through the MAC).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "net/memory_port.h"
#include "transport/endpoint.h"
#include "transport/recording_port.h"

using namespace mercury;
using namespace mercury::transport;

namespace {

// A failed check names its line before aborting (libFuzzer then saves the input).
#define check(ok)                                                                         \
  do {                                                                                    \
    if (!(ok)) {                                                                          \
      std::fprintf(stderr, "fuzz_endpoint: check failed: %s (line %d)\n", #ok, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() << 8 | byte()); }
  uint32_t u32() { return uint32_t{u16()} << 16 | u16(); }
};

constexpr Tick kUs = 1'000;  // 1 tick = 1 ns
const net::LocalAddr kA{net::MacAddr{{2, 0, 0, 0, 0, 1}}, 0x0a000001, 47100};
const net::LocalAddr kB{net::MacAddr{{2, 0, 0, 0, 0, 2}}, 0x0a000002, 47101};

// Keeps what it is given, by block_key.
class Inbox final : public MessageReceiver {
 public:
  std::byte* on_message_begin(uint16_t, const wire::HeaderFields& h) override {
    if (h.msg_len > (1u << 20)) return nullptr;
    auto& m = messages[h.block_key];
    m.assign(h.msg_len == 0 ? 1 : h.msg_len, std::byte{0xEE});
    return m.data();
  }
  void on_message_complete(uint16_t, const wire::HeaderFields& h, std::byte*) override {
    ++completed[h.block_key];
  }
  void on_message_abandoned(uint16_t, uint32_t, std::byte*) override {}
  std::map<uint32_t, std::vector<std::byte>> messages;
  std::map<uint32_t, uint32_t> completed;
};

struct Completions {
  std::map<uint64_t, uint32_t> settled;
  static void callback(void* self, const SendResult& r) {
    check(++static_cast<Completions*>(self)->settled[r.cookie] == 1);
  }
};

EndpointConfig config(uint32_t epoch, uint16_t id, uint16_t peer_id, const net::LocalAddr& peer,
                      const SharedAuthKey& key) {
  EndpointConfig c;
  c.transport.tsc_hz = 1'000'000'000;
  c.transport.window_packets = 16;
  c.transport.initial_rto_us = 2'000;
  c.transport.min_rto_us = 500;
  c.transport.max_rto_us = 20'000;
  c.transport.peer_timeout_us = 500'000;
  c.local_epoch = epoch;
  c.sender_id = id;
  c.max_messages = 64;
  c.ingress_capacity = 64;
  c.peers = {PeerSpec{"peer", peer.ip, peer.udp_port, 0, peer_id}};
  c.auth_key = key;
  if (key) {
    static const uint32_t salt = derive_seq_salt(*key);  // one key for every input
    c.transport.seq_salt = salt;
  }
  return c;
}

std::vector<std::byte> body(uint32_t key, uint32_t len) {
  std::vector<std::byte> v(len);
  for (uint32_t i = 0; i < len; ++i) v[i] = std::byte((i * 13 + key * 5) & 0xff);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const bool keyed = (in.byte() & 1) != 0;
  static const SharedAuthKey job_key = [] {
    auto k = std::make_shared<AuthKey>();
    for (size_t i = 0; i < k->size(); ++i) (*k)[i] = static_cast<uint8_t>(i * 7 + 1);
    return k;
  }();
  const SharedAuthKey key = keyed ? job_key : nullptr;
  net::MemoryPort pa(kA, {.mtu = 1500, .buffers = 128});
  net::MemoryPort pb(kB, {.mtu = 1500, .buffers = 128});
  net::MemoryPort::connect(pa, pb);
  transport::test::RecordingPort rb(pb, 64);
  Inbox in_a, in_b;
  Tick now = 1'000'000;
  auto a = std::make_unique<Endpoint>(pa, config(3, 0, 1, kB, key), in_a, now);
  Endpoint b(rb, config(5, 1, 0, kA, key), in_b, now);
  const net::FrameTemplate a_to_b =
      net::make_frame_template(kA, net::Route{kB.mac, kB.ip, kB.udp_port});
  std::map<uint32_t, std::vector<std::byte>> sent_to_b;  // block_key -> bytes
  std::vector<std::vector<std::byte>> keep;              // sent buffers stay alive
  Completions done;
  uint32_t next_key = 1;
  uint32_t a_epoch = 3;
  const auto poll = [&](uint32_t us) {
    for (uint32_t i = 0; i < us; ++i) {
      now += kUs;
      a->poll_st(now);
      b.poll_st(now);
    }
  };

  for (int ops = 0; ops < 120 && in.n != 0; ++ops) {
    const uint8_t op = in.byte();
    switch (op % 9) {
      case 0:
      case 1: {  // a message either way
        const uint32_t k = next_key++;
        keep.push_back(body(k, (uint32_t{in.byte()} << 8 | in.byte()) % 20'000));
        const std::vector<std::byte>& v = keep.back();
        MessageMeta meta;
        meta.block_key = k;
        Endpoint& from = op % 9 == 0 ? *a : b;
        if (from.send(0, v.data(), static_cast<uint32_t>(v.size()), in.byte() % 8, meta,
                      Completion{&Completions::callback, &done, k}) == SubmitStatus::kQueued &&
            &from == a.get()) {
          sent_to_b[k] = v;
        }
        break;
      }
      case 2:
        poll(1 + in.byte() % 16);
        break;
      case 3: {  // arbitrary bytes into b's port
        std::vector<std::byte> f(in.byte() % 200 + in.byte());
        for (auto& x : f) x = std::byte{in.byte()};
        (void)pb.inject_st(f);
        break;
      }
      case 4: {  // a frame of the attacker's making, from a's address
        wire::HeaderFields h;
        h.type = static_cast<wire::PacketType>(1 + in.byte() % 6);
        h.flags = static_cast<uint16_t>(in.u16() & wire::flags::kKnown);
        h.job_id = 0;
        h.sender_id = in.byte() & 1;
        h.dtype = static_cast<wire::Dtype>(in.byte() % wire::kDtypeCount);
        h.block_key = in.byte();
        h.msg_id = in.u32();
        h.offset = in.u32() & 0xffff;
        h.seq = in.u32();
        h.ack = in.u32();
        h.epoch = in.u32();
        h.sack = uint64_t{in.u32()} << 32 | in.u32();
        h.credit = in.u16();
        std::vector<std::byte> payload(h.type == wire::PacketType::kAck ? 0 : in.byte() * 4u);
        for (auto& x : payload) x = std::byte{in.byte()};
        h.msg_len = static_cast<uint32_t>(h.offset + payload.size() + in.byte());
        wire::AuthBlock block{};
        block.counter.set(uint64_t{in.u32()} << 32 | in.u32());
        for (auto& t : block.tag) t = in.byte();
        std::vector<std::byte> f(net::kFrameOverhead + wire::kAuthSize + payload.size() + 64);
        const bool with_block = (h.flags & wire::flags::kAuth) != 0;
        f.resize(net::build_data_frame(f, a_to_b, h, payload, net::ChecksumMode::kSoftware,
                                       with_block ? &block : nullptr));
        (void)pb.inject_st(f);
        break;
      }
      case 5: {  // a genuine frame replayed, whole or with one byte changed
        if (rb.frames.empty()) break;
        std::vector<std::byte> f = rb.frames[in.byte() % rb.frames.size()];
        if ((op & 0x80) != 0 && !f.empty()) f[in.u16() % f.size()] ^= std::byte{in.byte()};
        (void)pb.inject_st(f);
        break;
      }
      case 6: {  // the link's impairments, both ways
        const double loss = (in.byte() % 8) / 100.0, dup = (in.byte() % 8) / 100.0;
        const double reorder = (in.byte() % 8) / 100.0;
        const uint64_t seed = in.byte();
        pa.set_link({.loss = loss, .duplicate = dup, .reorder = reorder, .seed = seed + 1});
        pb.set_link({.loss = loss, .duplicate = dup, .reorder = reorder, .seed = seed + 7});
        break;
      }
      case 7:  // time passes: timers, the peer timeout
        now += (uint64_t{in.byte()} + 1) * 1'000 * kUs;
        poll(2);
        break;
      case 8:  // a restarts (a new incarnation)
        if ((op & 0x80) == 0) break;
        a = std::make_unique<Endpoint>(pa, config(++a_epoch, 0, 1, kB, key), in_a, now);
        break;
    }
  }
  poll(20);
  if (keyed) {
    // Nothing b completed was forged or altered: each is a's, byte for byte.
    for (const auto& [k, n] : in_b.completed) {
      const auto it = sent_to_b.find(k);
      check(it != sent_to_b.end());
      const std::vector<std::byte>& got = in_b.messages[k];
      check(it->second.empty() ? got.size() == 1 : got == it->second);
    }
  }
  return 0;
}
