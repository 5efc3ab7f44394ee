// NetCore (net_core.h): control messages. Declarations and barriers go out
// as whole kControl messages; the servers' answers (ready, refused, barrier
// done) come back whole through the MessageReceiver and drive the start and
// the barriers. Control path: encoding, decoding and buffering allocate.
#include "worker/net_core.h"

#include <rte_cycles.h>

#include <algorithm>
#include <cstdio>

namespace mercury::worker {

namespace {

// Control messages are a few KB (a declaration list); anything larger is refused.
constexpr uint32_t kMaxControlBytes = 1u << 22;

}  // namespace

void NetCore::on_ready_st(uint16_t server, const agg::ControlMessage& m) {
  if (phase_ != Phase::kDeclaring || server >= ready_.size()) return;
  if (m.shards != table_.shards()) {
    fail_start_st("start: " + server_name(server) + " says the job has " +
                  std::to_string(m.shards) + " shards, this worker counts " +
                  std::to_string(table_.shards()) + " (do both read the same job file?)");
    return;
  }
  if (m.fingerprint != table_.fingerprint()) {
    char text[160];
    std::snprintf(text, sizeof text, "placement fingerprint %016llx, this worker %016llx",
                  static_cast<unsigned long long>(m.fingerprint),
                  static_cast<unsigned long long>(table_.fingerprint()));
    fail_start_st("start: " + server_name(server) + " computed " + text +
                  ": the nodes disagree on the tensors or the shards");
    return;
  }
  ready_[server] = true;
  if (std::find(ready_.begin(), ready_.end(), false) != ready_.end()) return;
  phase_ = Phase::kInitialising;
  // The job has started (every server placed it): link.rate_steps count from here.
  iface_.start_link_schedule_st(rte_rdtsc());
  if (config_.rank == 0) {
    // Rank 0's buffers as they are now become version 0 on every rank.
    init_pushes_.reserve(table_.tensors());
    for (TensorId t = 0; t < table_.tensors(); ++t) {
      init_pushes_.emplace_back();
      push_st(t, 0, 0, table_.tensor(t).params.data(), wire::PacketType::kInit,
              init_pushes_.back());
    }
  }
}

bool NetCore::send_control_st(uint16_t server, const agg::ControlMessage& m) {
  const uint64_t cookie = next_control_++;
  std::vector<std::byte>& bytes = control_out_[cookie] = agg::encode_control(m);
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kControl;
  meta.dtype = wire::Dtype::kBytes;
  if (endpoint_->send(server, bytes.data(), static_cast<uint32_t>(bytes.size()), 0, meta,
                      transport::Completion{&NetCore::on_control_sent, this, cookie}) !=
      transport::SubmitStatus::kQueued) {
    control_out_.erase(cookie);
    return false;
  }
  return true;
}

void NetCore::on_control_sent(void* self, const transport::SendResult& r) {
  auto& core = *static_cast<NetCore*>(self);
  core.control_out_.erase(r.cookie);
  if (core.stopped_ || core.stop_ || r.ok()) return;
  if (core.phase_ == Phase::kDeclaring) {
    core.fail_start_st("start: the declarations did not reach " + core.server_name(r.peer) + ": " +
                       std::string(r.error));
  } else {
    core.break_st(std::string(r.error));
  }
}

std::byte* NetCore::on_message_begin(uint16_t peer, const wire::HeaderFields& h) {
  if (h.msg_len == 0 || h.msg_len > kMaxControlBytes) {
    ++control_malformed_;
    return nullptr;
  }
  std::vector<std::byte>& buf = control_in_[uint64_t{peer} << 32 | h.msg_id];
  buf.resize(h.msg_len);
  return buf.data();
}

void NetCore::on_message_complete(uint16_t peer, const wire::HeaderFields& h, std::byte*) {
  auto it = control_in_.find(uint64_t{peer} << 32 | h.msg_id);
  if (it == control_in_.end()) return;
  agg::ControlMessage m;
  try {
    m = agg::decode_control(it->second);
  } catch (const std::exception&) {
    ++control_malformed_;
    control_in_.erase(it);
    return;
  }
  control_in_.erase(it);
  switch (m.kind) {
    case agg::ControlKind::kReady:
      on_ready_st(peer, m);
      break;
    case agg::ControlKind::kRefused:
      if (phase_ == Phase::kDeclaring) {
        fail_start_st("start: " + server_name(peer) + " refused the declarations: " + m.text);
      } else if (phase_ == Phase::kInitialising || phase_ == Phase::kRunning) {
        // A server giving up on the job (e.g. another rank died): every
        // pending and later request fails with its reason instead of waiting
        // for aggregates that will never come.
        break_st(server_name(peer) + " stopped the job: " + m.text);
      }
      break;
    case agg::ControlKind::kBarrierDone:
      std::erase_if(barriers_, [&](const PendingBarrier& b) {
        if (b.generation != m.generation) return false;
        b.handle.complete();
        return true;
      });
      break;
    case agg::ControlKind::kHeartbeat:
      break;  // its acknowledgement was the point (agg/control.h)
    default:
      ++control_malformed_;  // a worker is never sent declarations or barriers
      break;
  }
}

void NetCore::on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte*) {
  control_in_.erase(uint64_t{peer} << 32 | msg_id);
}

}  // namespace mercury::worker
