// libFuzzer target for the transport state machines. The input is a script
// of operations on two Peers joined by a packet queue the script controls:
// send data either way, deliver any queued packet (reordering), duplicate or
// drop it, advance the clock and run the timers, send pure ACKs, resend lost
// packets, restart an end, and inject arbitrary bytes as a packet (decoded by
// lib/wire, so only what the wire accepts reaches the transport). Beyond "no
// crash, no UB" (ASan/UBSan), it checks what must hold whatever the peer or
// the network does: every slice handed to a sender ends at most once (acked or
// failed), sequence-space bookkeeping stays within the window, and the
// receivers' message tables stay within their bound.
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <vector>

#include "transport/transport.h"

using namespace mercury::transport;
namespace wire = mercury::wire;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

constexpr uint32_t kPart = 100;

class End final : public SenderSink {
 public:
  End(const Config& c, uint32_t epoch, uint32_t peer_epoch)
      : config(c), peer(c, epoch, 0, peer_epoch) {}

  void on_acked(const SliceRef& s) override { check(ended.insert(s.msg_token).second); }
  void on_lost(uint32_t seq, const SliceRef&, LossKind) override { lost.push_back(seq); }
  void on_failed(const SliceRef& s, FailReason) override {
    check(ended.insert(s.msg_token).second);
  }

  // A new slice of the current message, or of a new one of `len_hint` parts.
  bool send(uint8_t len_hint, Tick now, std::vector<std::byte>& out) {
    if (!peer.can_send()) return false;
    if (parts_left == 0) {
      ++msg_id;
      msg_parts = len_hint % 5;  // 0 parts: an empty message
      parts_left = msg_parts == 0 ? 1 : msg_parts;
    }
    const uint32_t part = msg_parts == 0 ? 0 : msg_parts - parts_left;
    wire::HeaderFields h;
    h.type = wire::PacketType::kData;
    h.msg_id = msg_id;
    h.msg_len = msg_parts * kPart;
    h.offset = part * kPart;
    h.payload_len = static_cast<uint16_t>(msg_parts == 0 ? 0 : kPart);
    const SliceRef s{next_token++, h.offset, h.payload_len, static_cast<uint8_t>(len_hint % 8)};
    check(peer.send(s, now, h));
    slice_msg.push_back({h.msg_id, h.msg_len});
    --parts_left;
    out = encode(h);
    return true;
  }

  bool resend(Tick now, std::vector<std::byte>& out) {
    while (!lost.empty()) {
      SliceRef s;
      wire::HeaderFields h;
      const Resend r = peer.resend(lost.front(), now, s, h);
      if (r == Resend::kNoRoom) return false;
      lost.pop_front();
      if (r == Resend::kNotNeeded) continue;
      h.type = wire::PacketType::kData;
      h.offset = s.offset;
      h.payload_len = static_cast<uint16_t>(s.len);
      h.msg_id = slice_msg[s.msg_token].first;
      h.msg_len = slice_msg[s.msg_token].second;
      out = encode(h);
      return true;
    }
    return false;
  }

  static std::vector<std::byte> encode(const wire::HeaderFields& h) {
    std::vector<std::byte> pkt(wire::kHeaderSize + h.payload_len);
    wire::encode(h, std::span<std::byte, wire::kHeaderSize>(pkt.data(), wire::kHeaderSize));
    return pkt;
  }

  void invariants() const {
    const PeerSender& s = peer.sender();
    check(s.in_flight() + s.waiting_resend() <= s.outstanding());
    check(s.outstanding() <= s.window());
    check(s.cwnd() >= 1 && s.cwnd() <= s.window());
    check(peer.receiver().messages_in_progress() <= config.rx_messages);
  }

  Config config;
  Peer peer;
  std::set<uint64_t> ended;
  std::deque<uint32_t> lost;
  std::vector<std::pair<uint32_t, uint32_t>> slice_msg;  // token -> (msg_id, msg_len)
  uint32_t msg_id = 0;
  uint32_t msg_parts = 0;
  uint32_t parts_left = 0;
  uint64_t next_token = 0;
};

struct Queued {
  int to;
  std::vector<std::byte> bytes;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  Config c;
  c.tsc_hz = 1'000'000;  // 1 tick = 1 us
  c.window_packets = 1 + in.byte() % 16;
  c.cwnd_floor = 1;
  c.reorder_threshold = 1 + in.byte() % 4;
  c.max_reorder_threshold = 8;
  c.initial_rto_us = 2'000;
  c.min_rto_us = 500;
  c.max_rto_us = 20'000;
  c.peer_timeout_us = 200'000;
  c.ack_every = 1 + in.byte() % 4;
  c.rx_messages = 1 + in.byte() % 4;
  c.seq_salt = static_cast<uint32_t>(in.byte()) << 24;  // near the wrap for some inputs
  const bool handshake = (in.byte() & 1) != 0;
  End end[2] = {End(c, 1, handshake ? 0 : 2), End(c, 2, handshake ? 0 : 1)};
  std::vector<Queued> q;
  Tick now = 1;
  for (int ops = 0; ops < 2000 && in.n != 0; ++ops) {
    const uint8_t op = in.byte();
    const int side = op >> 7;
    End& e = end[side];
    std::vector<std::byte> pkt;
    switch (op % 10) {
      case 0:
      case 1:
        if (e.send(in.byte(), now, pkt)) q.push_back({1 - side, std::move(pkt)});
        break;
      case 2:
      case 3: {  // deliver any queued packet (reordering); sometimes keep a copy
        if (q.empty()) break;
        const size_t i = in.byte() % q.size();
        Queued p = q[i];
        if ((op & 0x40) == 0) q.erase(q.begin() + static_cast<ptrdiff_t>(i));
        wire::HeaderFields f;
        if (wire::decode(p.bytes, f) == wire::Reject::kNone) {
          end[p.to].peer.on_packet(f, now, end[p.to]);
        }
        break;
      }
      case 4:  // drop
        if (!q.empty()) q.erase(q.begin() + static_cast<ptrdiff_t>(in.byte() % q.size()));
        break;
      case 5:
        now += 1 + uint64_t{in.byte()} * 100;
        for (auto& x : end) x.peer.on_timer(now, x);
        break;
      case 6:
        if (e.peer.ack_due(now) || (op & 0x40) != 0) {
          wire::HeaderFields h;
          e.peer.fill_pure_ack(now, h);
          q.push_back({1 - side, End::encode(h)});
        }
        break;
      case 7:
        if (e.resend(now, pkt)) q.push_back({1 - side, std::move(pkt)});
        break;
      case 8: {  // arbitrary bytes as a packet from the other end
        const size_t len = wire::kHeaderSize + in.byte() % 8;
        std::vector<std::byte> raw(len);
        for (auto& b : raw) b = std::byte{in.byte()};
        wire::HeaderFields f;
        if (wire::decode(raw, f) == wire::Reject::kNone) e.peer.on_packet(f, now, e);
        break;
      }
      case 9:  // a new incarnation of this end towards the other
        if ((op & 0x40) != 0 && e.peer.dead()) {
          e.peer.reincarnate(e.peer.local_epoch() + 1, now, e);
        }
        break;
    }
    for (const auto& x : end) x.invariants();
    if (q.size() > 256) q.erase(q.begin());
  }
  return 0;
}
