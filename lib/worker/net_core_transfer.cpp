// NetCore (net_core.h): the datapath. Pushes wait for their version and go
// out block by block; aggregated chunks land in the trainer's
// buffers through the PullTracker; pulls complete once their version is in;
// barriers are control messages to server 0.
#include "worker/net_core.h"

#include <algorithm>
#include <cstring>

#include "net/stream_copy.h"

namespace mercury::worker {

bool NetCore::version_in_st(TensorId t, uint32_t version) const {
  return static_cast<int32_t>(pulls_->awaited_st(t) - version) > 0;
}

bool NetCore::push_ready_st(const PendingPush& p) const {
  if (p.type != wire::PacketType::kData) return true;
  // BSP: a gradient computed from version i goes once version i is in here:
  // before that, the servers would refuse it as from the future.
  // Rank 0's pushes of a version its settings apply from wait for them.
  if (!async()) return version_in_st(p.tensor, p.iteration) && !held_by_settings_st(p.iteration);
  // Asynchronous: every chunk's initial values are in and the tensor's
  // previous push was applied (its answers are in), so the servers see one
  // push per rank and chunk at a time, in clock order.
  return version_in_st(p.tensor, 0) &&
         pulls_->answers_st(p.tensor) >=
             uint64_t{p.iteration - first_clock_} * pulls_->chunks_st(p.tensor);
}

// ---------------------------------------------------------------------------
// Push.

void NetCore::push_st(TensorId t, uint32_t iteration, uint32_t marked, const std::byte* grad,
                      wire::PacketType type, const Handle& h) {
  if (push_queue_.size() >= list_capacity_) {
    h.fail("push: more than " + std::to_string(list_capacity_) +
           " pushes are waiting on the net core; wait for some handles first");
    return;
  }
  push_queue_.push_back(PendingPush{t, iteration, marked, 0, grad, type, 0, false, h});
}

uint32_t NetCore::send_pushes_st() {
  uint32_t work = 0;
  bool endpoint_full = false;
  for (PendingPush& p : push_queue_) {
    if (endpoint_full) break;
    if (!push_ready_st(p)) continue;
    if (!p.started) {
      if (pushes_->start_st(p.tensor, p.handle) == StartResult::kBusy) continue;
      p.started = true;
      if (async() && p.type == wire::PacketType::kData) {
        // The version its gradient came from: the one the trainer marked as
        // read before computing it, else the one its last pull delivered
        // (psplus places newer versions in the buffer after that pull).
        p.base = p.marked != 0 ? p.marked - 1 : base_[p.tensor];
        // Its staleness as this worker sees it: the versions every chunk of
        // the tensor has moved on since.
        const uint64_t stale = pulls_->staleness_st(p.tensor, p.base);
        staleness_sum_ += stale;
        stale_pushes_ += stale != 0 ? 1 : 0;
        staleness_max_ = std::max(staleness_max_, stale);
      }
      in_flight_[p.tensor] = p.handle;
      // What a standby that takes over is sent again (net_core_standby.cpp).
      if (!async() && p.type == wire::PacketType::kData) {
        last_push_[p.tensor] = LastPush{p.grad, p.iteration, true};
      }
      if (config_.timeline && p.type == wire::PacketType::kData) {
        config_.timeline->mark_st(p.tensor, p.iteration, Timeline::Mark::kSending);
        timeline_push_[p.tensor] = p.iteration + 1;
      }
    }
    const uint32_t blocks = table_.tensor(p.tensor).blocks;
    const uint32_t before = p.next;
    p.next = send_blocks_st(p);
    work += p.next - before;
    endpoint_full = p.next < blocks;
  }
  std::erase_if(push_queue_, [&](const PendingPush& p) {
    return p.started && p.next == table_.tensor(p.tensor).blocks;
  });
  return work;
}

uint32_t NetCore::send_blocks_st(const PendingPush& p) {
  const uint8_t level = table_.tensor(p.tensor).level;
  const std::span<const BlockGeometry> blocks = table_.blocks(p.tensor);
  // On the wire, a push's `iteration` is the version of the parameters it
  // was computed from (0 for rank 0's initial parameters, kInit).
  transport::MessageMeta meta;
  meta.type = p.type;
  meta.dtype = table_.tensor(p.tensor).dtype;  // as it is: nothing converts on the worker
  meta.iteration = p.iteration;
  if (async() && p.type == wire::PacketType::kData) {
    // Asynchronous: the version the gradient came from, and the clock.
    meta.iteration = p.base;
    meta.param_version = p.iteration;
  }
  uint32_t i = p.next;
  for (; i < blocks.size(); ++i) {
    const BlockGeometry& g = blocks[i];
    meta.block_key = g.key;
    const std::byte* data = p.grad + g.first_byte();
    const auto bytes = static_cast<uint32_t>(g.bytes());
    const uint16_t peer = server_peer_[shard_server_[g.shard]];
    if (endpoint_->send(peer, data, bytes, level, meta,
                        transport::Completion{&NetCore::on_push_sent, this, g.key}) !=
        transport::SubmitStatus::kQueued) {
      break;  // the endpoint is full: the rest goes on a later pass
    }
    ++unsettled_[peer];
    bytes_pushed_ += bytes;
  }
  return i;
}

void NetCore::on_push_sent(void* self, const transport::SendResult& r) {
  auto& core = *static_cast<NetCore*>(self);
  if (core.stopped_) return;
  const auto key = static_cast<uint32_t>(r.cookie);
  if (r.peer < core.unsettled_.size() && core.unsettled_[r.peer] != 0) --core.unsettled_[r.peer];
  // To a server whose standby will take over: its standby gets the push
  // again (net_core_standby.cpp), so for the push's handle it went.
  const uint16_t server = core.server_of_key(key);
  const bool covered = !r.ok() && core.standby_covers_st(server, r.peer);
  core.pushes_->settled_st(key, r.ok() || covered, r.error);
  if (core.config_.timeline) {
    const TensorId t = core.pushes_->tensor_of_st(key);
    if (t != PushTracker::kNoTensor && core.timeline_push_[t] != 0 && !core.pushes_->busy_st(t)) {
      core.config_.timeline->mark_st(t, core.timeline_push_[t] - 1, Timeline::Mark::kPushed);
      core.timeline_push_[t] = 0;
    }
  }
  core.pulls_dirty_ = true;
  if (!r.ok()) core.lose_peer_st(r.peer, std::string(r.error));
}

// ---------------------------------------------------------------------------
// Received chunks and pulls.

bool NetCore::on_packet(uint16_t, const wire::HeaderFields& h, std::span<const std::byte> payload,
                        net::PacketBuf*) {
  // An aggregated chunk's `param_version` is the version its update made.
  ++chunks_received_;
  if (async()) {
    const ChunkVerdict v =
        pulls_->deliver_async_st(h.block_key, h.offset, h.param_version, h.iteration, payload);
    pulls_dirty_ = true;
    if (v == ChunkVerdict::kPlaced && stats_.in_place) {
      // deliver_async_st() fenced the chunks before their least moved.
      const TensorId t = pulls_->tensor_of_st(h.block_key);
      if (pulls_->awaited_st(t) != 0)
        stats_.in_place[t].store(pulls_->least_version_st(t), std::memory_order_release);
    }
    return false;
  }
  if (rolling_back_ && h.param_version != start_version_) {
    // A running server's update from before it rolled back: its version
    // is one the job takes back (net_core_recover.cpp).
    ++rollback_dropped_;
    return false;
  }
  const ChunkVerdict v = pulls_->deliver_st(h.block_key, h.offset, h.param_version, payload);
  // Version 0 is rank 0's initial parameters: no iteration's result.
  if (config_.timeline && v == ChunkVerdict::kPlaced && h.param_version != 0) {
    mark_chunk_st(h.block_key, h.param_version);
  }
  return false;  // copied into the trainer's buffer: the endpoint frees the mbuf
}

void NetCore::mark_chunk_st(uint32_t key, uint32_t version) {
  const TensorId t = pulls_->tensor_of_st(key);
  if (timeline_first_[t] != version) {
    timeline_first_[t] = version;
    config_.timeline->mark_st(t, version - 1, Timeline::Mark::kFirstChunk);
  }
  if (version_in_st(t, version))
    config_.timeline->mark_st(t, version - 1, Timeline::Mark::kComplete);
}

NetCore::PendingPull NetCore::pull_of(const Request& r, std::optional<Handle> push) const {
  PendingPull p;
  p.tensor = r.tensor;
  p.out = r.out;
  p.handle = r.handle;
  p.push = std::move(push);
  // r.version: the worker's pushes of the tensor so far (this one included).
  // BSP: that version, or a later one asked for (min_version).
  p.version =
      r.has_min && static_cast<int32_t>(r.min_version - r.version) > 0 ? r.min_version : r.version;
  p.clock = r.version;
  if (!async()) return p;
  if (r.has_min) p.min_stamp = r.min_version + 1;
  if (config_.sync != config::Sync::kPsPlus) {
    // ASP and SSP: the worker reads its own writes (every push applied).
    p.answers = uint64_t{r.version - first_clock_} * pulls_->chunks_st(r.tensor);
  }
  if (config_.sync == config::Sync::kSsp && r.version > config_.staleness_bound) {
    // About to compute its iteration `r.version`: the slowest worker must
    // have pushed at least r.version - bound gradients of every chunk.
    p.slowest = r.version - config_.staleness_bound;
  }
  return p;
}

void NetCore::pull_st(PendingPull p) {
  if (pull_queue_.size() >= list_capacity_) {
    p.handle.fail("pull: more than " + std::to_string(list_capacity_) +
                  " pulls are waiting on the net core; wait for some handles first");
    return;
  }
  if (async() && p.slowest != 0 && pulls_->least_slowest_st(p.tensor) < p.slowest) ++ssp_waits_;
  pull_queue_.push_back(std::move(p));
  pulls_dirty_ = true;
}

bool NetCore::pull_ready_st(const PendingPull& p) const {
  if (p.push && !p.push->ready()) return false;
  if (!async()) return version_in_st(p.tensor, p.version);
  return version_in_st(p.tensor, 0) && pulls_->answers_st(p.tensor) >= p.answers &&
         pulls_->least_slowest_st(p.tensor) >= p.slowest &&
         pulls_->least_version_st(p.tensor) + 1 >= p.min_stamp;
}

uint32_t NetCore::complete_pulls_st() {
  if (pull_queue_.empty()) return 0;
  const uint64_t versions = pulls_->counters_st().versions_completed;
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
    if (!pull_ready_st(p)) return false;
    uint32_t delivered = p.version;
    if (async()) {
      // The bytes were placed, maybe with non-temporal stores, as they came.
      net::stream_fence();
      delivered = pulls_->least_version_st(p.tensor);
      base_[p.tensor] = delivered;
      if (config_.sync == config::Sync::kSsp) {
        // How far ahead of the slowest this worker goes on: its clock
        // against the least slowest clock of the tensor's chunks.
        const uint32_t least = pulls_->least_slowest_st(p.tensor);
        if (p.clock > least) ssp_gap_max_ = std::max<uint64_t>(ssp_gap_max_, p.clock - least);
      }
    }
    if (stats_.delivered) stats_.delivered[p.tensor].store(delivered, std::memory_order_release);
    const std::span<std::byte> params = table_.tensor(p.tensor).buffer;
    if (p.out != params.data()) std::memmove(p.out, params.data(), params.size_bytes());
    p.handle.complete();
    ++done;
    return true;
  });
  return done;
}

// ---------------------------------------------------------------------------
// Barrier.

void NetCore::barrier_st(uint64_t generation, const Handle& h) {
  agg::ControlMessage m;
  m.kind = agg::ControlKind::kBarrier;
  m.rank = config_.rank;
  m.generation = generation;
  barriers_.push_back(PendingBarrier{generation, h});
  last_barrier_ = generation;
  barrier_sent_ = true;
  if (!send_control_st(0, m)) {
    barriers_.pop_back();
    h.fail("barrier: the message to " + server_name(0) + " could not be queued (endpoint full)");
  }
}

}  // namespace mercury::worker
