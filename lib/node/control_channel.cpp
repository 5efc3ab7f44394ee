#include "node/control_channel.h"

#include <stdexcept>
#include <utility>

namespace mercury::node {

ControlChannel::ControlChannel(std::vector<ControlPeer> peers, Handler& handler,
                               const Options& options)
    : peers_(std::move(peers)), handler_(handler), options_(options) {
  for (const ControlPeer& p : peers_) {
    if (p.endpoint == nullptr)
      throw std::invalid_argument("node::ControlChannel: a peer has no endpoint");
  }
}

bool ControlChannel::send_st(uint32_t to, const agg::ControlMessage& m, bool report) {
  MERCURY_OWNED(*owner_);
  const uint64_t cookie = next_cookie_++;
  Outgoing& out = outbox_[cookie] = Outgoing{agg::encode_control(m), to, m.kind, report};
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kControl;
  meta.dtype = wire::Dtype::kBytes;
  const ControlPeer& p = peers_[to];
  if (p.endpoint->send(p.peer, out.bytes.data(), static_cast<uint32_t>(out.bytes.size()), 0, meta,
                       transport::Completion{&ControlChannel::on_sent, this, cookie}) !=
      transport::SubmitStatus::kQueued) {
    outbox_.erase(cookie);
    ++counters_.not_queued;
    return false;
  }
  ++counters_.sent;
  return true;
}

bool ControlChannel::probe_st(uint32_t to) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kHeartbeat;
  return send_st(to, m, true);
}

void ControlChannel::send_heartbeat_st(uint32_t to) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kHeartbeat;
  if (send_st(to, m)) ++counters_.heartbeats;
}

void ControlChannel::on_sent(void* self, const transport::SendResult& r) {
  auto& channel = *static_cast<ControlChannel*>(self);
  const auto it = channel.outbox_.find(r.cookie);
  if (it == channel.outbox_.end()) return;
  const uint32_t to = it->second.to;
  const agg::ControlKind kind = it->second.kind;
  const bool report = it->second.report;
  channel.outbox_.erase(it);
  if (r.ok()) {
    if (report) channel.handler_.on_control_delivered_st(to, kind);
    return;
  }
  ++channel.counters_.failed;
  channel.handler_.on_control_failed_st(to, r);
}

std::byte* ControlChannel::begin_st(uint32_t from, const wire::HeaderFields& h) {
  MERCURY_OWNED(*owner_);
  if (h.msg_len == 0 || h.msg_len > options_.max_bytes) {
    ++counters_.too_big;
    return nullptr;
  }
  std::vector<std::byte>& buffer = inbox_[key(from, h.msg_id)];
  buffer.resize(h.msg_len);
  return buffer.data();
}

void ControlChannel::complete_st(uint32_t from, const wire::HeaderFields& h) {
  MERCURY_OWNED(*owner_);
  const auto it = inbox_.find(key(from, h.msg_id));
  if (it == inbox_.end()) return;
  const std::vector<std::byte> bytes = std::move(it->second);
  inbox_.erase(it);
  agg::ControlMessage m;
  try {
    m = agg::decode_control(bytes);
  } catch (const std::invalid_argument&) {
    ++counters_.malformed;
    return;
  }
  ++counters_.received;
  handler_.on_control_st(from, std::move(m));
}

void ControlChannel::abandon_st(uint32_t from, uint32_t msg_id) {
  MERCURY_OWNED(*owner_);
  inbox_.erase(key(from, msg_id));
}

}  // namespace mercury::node
