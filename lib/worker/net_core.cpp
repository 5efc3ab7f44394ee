#include "worker/net_core.h"

#include <rte_cycles.h>
#include <rte_pause.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "config/config.h"

namespace mercury::worker {

namespace {

constexpr const char* kShutDown = "the worker was shut down before this completed";
// Control messages are a few KB (a declaration list); anything larger is refused.
constexpr uint32_t kMaxControlBytes = 1u << 22;

std::string address(const transport::PeerSpec& p) {
  return p.name + " (" + config::Ipv4{p.ip}.to_string() + ":" + std::to_string(p.udp_port) + ")";
}

}  // namespace

NetCore::NetCore(const TensorTable& table, const NetCoreConfig& config, net::Interface& iface,
                 RequestQueue<Request>& queue, Doorbell& doorbell, PublishedStats& stats)
    : table_(table),
      config_(config),
      iface_(iface),
      queue_(queue),
      doorbell_(doorbell),
      stats_(stats) {
  config_.endpoint.peers.clear();
  for (const ServerSpec& s : config_.servers) config_.endpoint.peers.push_back(s.peer);
}

NetCore::~NetCore() = default;

std::string NetCore::server_name(uint16_t server) const {
  return server < config_.servers.size() ? "server " + address(config_.servers[server].peer)
                                         : "server #" + std::to_string(server);
}

// ---------------------------------------------------------------------------
// The loop.

void NetCore::run() {
  net::IdleBackoff backoff(config_.idle);
  for (;;) {
    const transport::Tick now = rte_rdtsc();
    uint32_t work = 0;
    for (uint32_t i = 0; i < kRequestBurst; ++i) {
      std::optional<Request> r = queue_.try_pop_sc();
      if (!r) break;
      ++work;
      if (r->kind == Request::Kind::kStop) {
        stopping_ = true;
        // Requests queued behind the stop cannot exist (Worker::shutdown waits
        // for every caller to leave before it enqueues the stop), but fail any
        // that raced in so that no handle is left pending.
        while (std::optional<Request> late = queue_.try_pop_sc()) {
          late->handle.fail(kShutDown);
          if (late->push) late->push->fail(kShutDown);
        }
        if (start_) start_->fail(kShutDown);
        start_.reset();
        fail_pending_st(kShutDown);
        for (std::optional<Handle>& h : in_flight_) {
          if (h && !h->ready()) h->fail(kShutDown);
          h.reset();
        }
        publish_st();
        r->handle.complete();
        return;
      }
      take_st(*r, now);
    }
    if (node_) {
      work += node_->poll_st(now);
      if (!push_queue_.empty()) work += send_pushes_st();
      work += complete_pulls_st();
      if (phase_ == Phase::kInitialising &&
          node_->tracker().counters_st().versions_completed >= table_.tensors()) {
        bool all = true;
        for (TensorId t = 0; t < table_.tensors() && all; ++t) all = version_in_st(t, 0);
        if (all) {
          phase_ = Phase::kRunning;
          start_->complete();
          start_.reset();
        }
      }
    }
    if (++passes_ % kSlowEvery == 0) slow_st(now);
    if (backoff.after_pass(work)) {
      const uint32_t ticket = doorbell_.arm();
      if (queue_.empty_sc()) {
        doorbell_.sleep(ticket, backoff.sleep_us());  // a trainer's request wakes it at once
      } else {
        doorbell_.disarm();
      }
    }
  }
}

void NetCore::take_st(Request& r, transport::Tick now) {
  using Kind = Request::Kind;
  if (r.kind == Kind::kStart) {
    start_st(r.handle, now);
    return;
  }
  if (phase_ != Phase::kRunning) {
    const std::string why = !broken_.empty() ? broken_ : "the worker has not started";
    r.handle.fail(why);
    if (r.push) r.push->fail(why);
    return;
  }
  switch (r.kind) {
    case Kind::kPush:
      ++pushes_taken_;
      push_st(r.tensor, r.iteration, r.grad, wire::PacketType::kData, r.handle);
      break;
    case Kind::kPull:
      ++pulls_taken_;
      pull_st(r.tensor, r.version, r.out, r.handle, std::nullopt);
      break;
    case Kind::kPushPull:
      ++pushes_taken_;
      ++pulls_taken_;
      push_st(r.tensor, r.iteration, r.grad, wire::PacketType::kData, *r.push);
      pull_st(r.tensor, r.version, r.out, r.handle, r.push);
      break;
    case Kind::kBarrier:
      barrier_st(r.generation, r.handle);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------
// Start: declare to every server, wait for Ready, rank 0 pushes its initial
// parameters, everyone waits for version 0.

void NetCore::start_st(const Handle& h, transport::Tick now) {
  if (phase_ != Phase::kIdle) {
    if (phase_ == Phase::kRunning) {
      h.complete();
    } else {
      h.fail(broken_.empty() ? "start: already starting" : broken_);
    }
    return;
  }
  start_ = h;
  try {
    WorkerNodeConfig wc;
    wc.endpoint = config_.endpoint;
    wc.pulls = config_.pulls;
    wc.control = this;
    for (uint16_t s = 0; s < config_.servers.size(); ++s) {
      for (uint32_t i = 0; i < config_.servers[s].shards; ++i) wc.shard_peer.push_back(s);
    }
    node_ = std::make_unique<WorkerNode>(table_, iface_, wc, now);
    pushes_ = std::make_unique<PushTracker>(table_);
  } catch (const std::exception& e) {
    fail_start_st(std::string("start: ") + e.what());
    return;
  }
  const uint32_t tensors = table_.tensors();
  list_capacity_ = size_t{tensors} * 8 + 64;
  push_queue_.reserve(list_capacity_);
  pull_queue_.reserve(list_capacity_);
  barriers_.reserve(64);
  in_flight_.assign(tensors, std::nullopt);
  ready_.assign(config_.servers.size(), false);

  agg::ControlMessage declare;
  declare.kind = agg::ControlKind::kDeclare;
  declare.rank = config_.rank;
  declare.tensors = table_.declarations();
  phase_ = Phase::kDeclaring;
  start_deadline_ = now + config_.start_timeout_ms * (config_.endpoint.transport.tsc_hz / 1000);
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    if (!send_control_st(s, declare)) {
      fail_start_st("start: the declarations to " + server_name(s) +
                    " could not be queued (endpoint full)");
      return;
    }
  }
}

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
  if (config_.rank == 0) {
    // Rank 0's buffers as they are now become version 0 on every rank.
    init_pushes_.reserve(table_.tensors());
    for (TensorId t = 0; t < table_.tensors(); ++t) {
      init_pushes_.emplace_back();
      push_st(t, 0, table_.tensor(t).params.data(), wire::PacketType::kInit, init_pushes_.back());
    }
  }
}

void NetCore::fail_start_st(const std::string& why) {
  stats_.set_failure(why);  // the full text: the handle keeps kMaxErrorBytes of it
  if (start_) start_->fail(why);
  start_.reset();
  break_st(why);
}

void NetCore::break_st(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  stats_.set_failure(broken_);
  if (start_) {
    start_->fail(why);
    start_.reset();
  }
  phase_ = Phase::kFailed;
  fail_pending_st(why);
}

void NetCore::fail_pending_st(const std::string& why) {
  for (PendingPush& p : push_queue_) {
    if (!p.started) {
      p.handle.fail(why);
    } else if (pushes_) {
      // The tracker holds it and waits for every partition: settle the ones
      // never queued as failed, the queued ones settle through the endpoint.
      const auto parts = table_.partitions(p.tensor);
      for (uint32_t i = p.next; i < parts.size(); ++i)
        pushes_->settled_st(parts[i].key, false, why);
    }
  }
  push_queue_.clear();
  for (PendingPull& p : pull_queue_) {
    if (!p.handle.ready()) p.handle.fail(why);
  }
  pull_queue_.clear();
  for (PendingBarrier& b : barriers_) b.handle.fail(why);
  barriers_.clear();
}

// ---------------------------------------------------------------------------
// Push, pull, barrier.

bool NetCore::version_in_st(TensorId t, uint32_t version) const {
  return static_cast<int32_t>(node_->tracker().awaited_st(t) - version) > 0;
}

void NetCore::push_st(TensorId t, uint32_t iteration, const float* grad, wire::PacketType type,
                      const Handle& h) {
  if (push_queue_.size() >= list_capacity_) {
    h.fail("push: more than " + std::to_string(list_capacity_) +
           " pushes are waiting on the net core; wait for some handles first");
    return;
  }
  push_queue_.push_back(PendingPush{t, iteration, grad, type, 0, false, h});
}

uint32_t NetCore::send_pushes_st() {
  uint32_t work = 0;
  bool endpoint_full = false;
  for (PendingPush& p : push_queue_) {
    if (endpoint_full) break;
    // A gradient computed from version i goes once version i is in here:
    // before that, BSP's servers would refuse it as from the future.
    if (p.type == wire::PacketType::kData && !version_in_st(p.tensor, p.iteration)) continue;
    if (!p.started) {
      if (pushes_->start_st(p.tensor, p.handle) == StartResult::kBusy) continue;
      p.started = true;
      in_flight_[p.tensor] = p.handle;
    }
    const uint32_t parts = table_.tensor(p.tensor).partitions;
    const uint32_t before = p.next;
    p.next = node_->push_partitions_st(p.tensor, p.grad, p.iteration, p.type, p.next,
                                       transport::Completion{&NetCore::on_push_sent, this, 0});
    work += p.next - before;
    endpoint_full = p.next < parts;
  }
  std::erase_if(push_queue_, [&](const PendingPush& p) {
    return p.started && p.next == table_.tensor(p.tensor).partitions;
  });
  return work;
}

void NetCore::on_push_sent(void* self, const transport::SendResult& r) {
  auto& core = *static_cast<NetCore*>(self);
  if (core.stopping_) return;
  core.pushes_->settled_st(static_cast<uint32_t>(r.cookie), r.ok(), r.error);
  core.pulls_dirty_ = true;
  if (!r.ok()) core.break_st(std::string(r.error));
}

void NetCore::pull_st(TensorId t, uint32_t version, float* out, const Handle& h,
                      std::optional<Handle> push) {
  if (pull_queue_.size() >= list_capacity_) {
    h.fail("pull: more than " + std::to_string(list_capacity_) +
           " pulls are waiting on the net core; wait for some handles first");
    return;
  }
  pull_queue_.push_back(PendingPull{t, version, out, h, std::move(push)});
  pulls_dirty_ = true;
}

uint32_t NetCore::complete_pulls_st() {
  if (pull_queue_.empty()) return 0;
  const uint64_t versions = node_->tracker().counters_st().versions_completed;
  const PushCounters& pc = pushes_->counters_st();
  const uint64_t settled = pc.pushes_completed + pc.pushes_failed;
  if (!pulls_dirty_ && versions == seen_versions_ && settled == seen_settled_) return 0;
  seen_versions_ = versions;
  seen_settled_ = settled;
  pulls_dirty_ = false;
  uint32_t done = 0;
  std::erase_if(pull_queue_, [&](PendingPull& p) {
    if (p.push && p.push->ready() && !p.push->ok()) {
      p.handle.fail(p.push->error());
      ++done;
      return true;
    }
    if (!version_in_st(p.tensor, p.version) || (p.push && !p.push->ready())) return false;
    const std::span<float> params = table_.tensor(p.tensor).params;
    if (p.out != params.data()) std::memmove(p.out, params.data(), params.size_bytes());
    p.handle.complete();
    ++done;
    return true;
  });
  return done;
}

void NetCore::barrier_st(uint64_t generation, const Handle& h) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kBarrier;
  m.rank = config_.rank;
  m.generation = generation;
  barriers_.push_back(PendingBarrier{generation, h});
  if (!send_control_st(0, m)) {
    barriers_.pop_back();
    h.fail("barrier: the message to " + server_name(0) + " could not be queued (endpoint full)");
  }
}

// ---------------------------------------------------------------------------
// Control messages.

bool NetCore::send_control_st(uint16_t server, const agg::ControlMessage& m) {
  const uint64_t cookie = next_control_++;
  std::vector<std::byte>& bytes = control_out_[cookie] = agg::encode_control(m);
  if (node_->send_control_st(server, bytes,
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
  if (core.stopping_ || r.ok()) return;
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
    default:
      ++control_malformed_;  // a worker is never sent declarations or barriers
      break;
  }
}

void NetCore::on_message_abandoned(uint16_t peer, uint32_t msg_id, std::byte*) {
  control_in_.erase(uint64_t{peer} << 32 | msg_id);
}

// ---------------------------------------------------------------------------
// Slow work.

void NetCore::slow_st(transport::Tick now) {
  if ((phase_ == Phase::kDeclaring || phase_ == Phase::kInitialising) && now > start_deadline_) {
    const std::string within = " within " + std::to_string(config_.start_timeout_ms) + " ms";
    if (phase_ == Phase::kDeclaring) {
      std::string who;
      for (uint16_t s = 0; s < ready_.size(); ++s) {
        if (!ready_[s]) who += (who.empty() ? "" : ", ") + server_name(s);
      }
      fail_start_st("start: no answer to the declarations from " + who + within +
                    " (is it running, and have all ranks started?)");
    } else {
      uint32_t missing = 0;
      std::string first;
      for (TensorId t = 0; t < table_.tensors(); ++t) {
        if (version_in_st(t, 0)) continue;
        if (missing++ == 0) first = table_.tensor(t).name;
      }
      fail_start_st("start: version 0 (rank 0's initial parameters) of " + std::to_string(missing) +
                    " of " + std::to_string(table_.tensors()) + " tensors did not arrive" + within +
                    " (first: '" + first + "')");
    }
  }
  if (node_ && broken_.empty()) {
    for (uint16_t s = 0; s < node_->endpoint().num_peers(); ++s) {
      if (node_->endpoint().peer_stats_st(s).dead) {
        break_st(server_name(s) + " stopped answering");
        break;
      }
    }
  }
  publish_st();
}

void NetCore::publish_st() {
  stats_.pushes.store(pushes_taken_, std::memory_order_relaxed);
  stats_.pulls.store(pulls_taken_, std::memory_order_relaxed);
  if (!node_) return;
  const WorkerNodeCounters c = node_->counters_st();
  const PullCounters& p = node_->tracker().counters_st();
  uint64_t dropped = 0;
  for (size_t v = static_cast<size_t>(ChunkVerdict::kDuplicate); v < kChunkVerdictCount; ++v) {
    dropped += p.verdicts[v];
  }
  stats_.partitions_pushed.store(c.partitions_pushed, std::memory_order_relaxed);
  stats_.chunks_received.store(c.chunks_received, std::memory_order_relaxed);
  stats_.bytes_placed.store(p.bytes_placed, std::memory_order_relaxed);
  stats_.versions_completed.store(p.versions_completed, std::memory_order_relaxed);
  stats_.retransmits.store(c.net.tx_retransmits, std::memory_order_relaxed);
  stats_.chunks_dropped.store(dropped, std::memory_order_relaxed);
  stats_.control_dropped.store(control_malformed_, std::memory_order_relaxed);
}

}  // namespace mercury::worker
