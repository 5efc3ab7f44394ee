// NetCore (net_core.h): the pass and the loop, the trainers' requests, the
// start-up protocol, the slow work and the published counters.
#include "worker/net_core.h"

#include <algorithm>
#include <bit>

#include "config/config.h"
#include "net/stream_copy.h"

namespace mercury::worker {

namespace {

constexpr const char* kShutDown = "the worker was shut down before this completed";

std::string address(const transport::PeerSpec& p) {
  return p.name + " (" + config::Ipv4{p.ip}.to_string() + ":" + std::to_string(p.udp_port) + ")";
}

}  // namespace

NetCore::NetCore(const TensorTable& table, const NetCoreConfig& config, net::PacketPort& port,
                 RequestQueue<Request>& queue, PublishedStats& stats)
    : table_(table), config_(config), port_(port), queue_(queue), stats_(stats) {
  config_.endpoint.peers.clear();
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    config_.endpoint.peers.push_back(config_.servers[s].peer);
    shard_server_.insert(shard_server_.end(), config_.servers[s].shards, s);
    server_peer_.push_back(s);
  }
  // The standbys after the servers (net_core_standby.cpp).
  standby_peer_.assign(config_.servers.size(), kNoStandby);
  for (uint16_t s = 0; s < config_.servers.size(); ++s) {
    if (!config_.servers[s].standby) continue;
    standby_peer_[s] = static_cast<uint16_t>(config_.endpoint.peers.size());
    config_.endpoint.peers.push_back(*config_.servers[s].standby);
    ++standbys_;
  }
}

NetCore::~NetCore() {
  if (loop_ != nullptr) loop_->remove(*this);
}

void NetCore::attach(node::Loop& loop, bool ends_loop) {
  loop.add(*this);
  loop_ = &loop;
  ends_loop_ = ends_loop;
}

std::string NetCore::server_name(uint16_t server) const {
  if (server < config_.servers.size()) return "server " + address(config_.servers[server].peer);
  const uint16_t s = server_of_standby(server);
  if (s != kNoStandby) {
    return "standby " + address(*config_.servers[s].standby) + " of " +
           config_.servers[s].peer.name;
  }
  return "server #" + std::to_string(server);
}

// ---------------------------------------------------------------------------
// The pass and the loop.

uint32_t NetCore::poll_st(transport::Tick now) {
  MERCURY_OWNED(owner_);
  now_ = now;
  if (stopped_) return 0;
  if (stop_) {
    // Leaving: only the endpoint runs, until the servers acknowledged kLeave
    // (every control message is then settled) or the deadline.
    const uint32_t work = endpoint_->poll_st(now);
    if (control_->settled_st() || now >= leave_deadline_) {
      // Acknowledged: the server detaches its end of a memif link once the
      // ACKs are out, so the link stays open a moment longer, in case that
      // core is off its CPU now (docs/server.md, "The end of a job").
      if (control_->settled_st()) port_.linger(kLeaveLinger);
      const Handle stopped = *stop_;
      stop_.reset();
      finish_stop_st(stopped, now);
    }
    return work;
  }
  uint32_t work = take_requests_st(now);
  if (stopped_ || stop_) return work;
  if (endpoint_) {
    work += endpoint_->poll_st(now);
    if (restarted_servers_ != 0) handle_restarts_st();
    if (!resends_.empty()) work += send_resends_st();
    // While a lost server's standby has not taken over, pushes wait.
    if (!push_queue_.empty() && !recovering() && failing_over_ == 0) work += send_pushes_st();
    work += complete_pulls_st();
    if (phase_ == Phase::kInitialising &&
        pulls_->counters_st().versions_completed >= table_.tensors()) {
      bool all = true;
      for (TensorId t = 0; t < table_.tensors() && all; ++t) all = version_in_st(t, start_version_);
      if (all) {
        phase_ = Phase::kRunning;
        // The version every tensor holds now: the trainer side counts its
        // pushes from it (release: the handle's completion). A process that
        // joined a running asynchronous job holds each tensor's newest
        // version (the least over its chunks) and counts its pushes from the
        // clock the servers took it in at: the slowest rank's, which its
        // first pull's packets carry (the largest over the chunks, so that
        // no push of it is a replay of any). So SSP's bound compares its
        // clocks with the others' as they are, and the trainer goes on
        // from that step (docs/membership.md, "Joining"). One that joined a
        // BSP job (on_worker_loss wait) holds the version of the iteration
        // in progress, kJoined's, and counts from it.
        first_clock_ = joining_ && async() ? pulls_->most_slowest_st() : start_version_;
        stats_.start_version.store(first_clock_, std::memory_order_relaxed);
        for (TensorId t = 0; t < table_.tensors(); ++t) {
          const uint32_t holds = joining_ && async() ? pulls_->least_version_st(t) : start_version_;
          stats_.delivered[t].store(holds, std::memory_order_relaxed);
          base_[t] = holds;
        }
        if (joining_) {
          stats_.joined_version.store(first_clock_, std::memory_order_relaxed);
          stats_.barrier_base.store(barrier_base_, std::memory_order_relaxed);
          stats_.joined.store(true, std::memory_order_relaxed);
        }
        next_push_ = start_version_;
        if (start_) {
          start_->complete();
          start_.reset();
        }
        if (rolling_back_) finish_rollback_st();
      }
    }
  }
  return work;
}

uint32_t NetCore::take_requests_st(transport::Tick now) {
  uint32_t taken = 0;
  for (; taken < kRequestBurst; ++taken) {
    std::optional<Request> r = queue_.try_pop_sc();
    if (!r) break;
    if (r->kind == Request::Kind::kStop) {
      stop_st(r->handle, now);
      return taken + 1;
    }
    take_st(*r, now);
  }
  return taken;
}

void NetCore::stop_st(const Handle& stopped, transport::Tick now) {
  // A worker with nothing in flight tells every server it leaves and polls
  // until they acknowledged it: a server sends a rank that left nothing more,
  // and everything it sent before is acknowledged here (docs/server.md, "The
  // end of a job"). With pushes or pulls pending it stops at once (no
  // endpoint may read a buffer whose handle failed), as when broken.
  bool idle = push_queue_.empty() && pull_queue_.empty();
  for (const std::optional<Handle>& h : in_flight_) idle = idle && (!h || h->ready());
  const bool leave =
      leave_on_stop_ && endpoint_ && idle && broken_.empty() &&
      (phase_ == Phase::kDeclaring || phase_ == Phase::kInitialising || phase_ == Phase::kRunning);
  // Requests queued behind the stop cannot exist (Worker::shutdown waits for
  // every caller to leave before it enqueues the stop), but fail any that
  // raced in so that no handle is left pending.
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
  if (leave) {
    agg::ControlMessage m;
    m.kind = agg::ControlKind::kLeave;
    m.rank = config_.rank;
    phase_ = Phase::kLeaving;
    bool queued = true;
    for (uint16_t p = 0; p < endpoint_->num_peers(); ++p) {
      // Not to a server its standby took over from, nor to a lost standby.
      const uint16_t s = p < config_.servers.size() ? p : server_of_standby(p);
      if (p < config_.servers.size() && ((failed_over_ | failing_over_) >> s & 1) != 0) continue;
      if (p >= config_.servers.size() && (s == kNoStandby || (standby_lost_ >> s & 1) != 0))
        continue;
      queued = control_->send_st(p, m) && queued;
    }
    if (queued) {
      stop_ = stopped;
      leave_deadline_ = now + transport::keepalive_interval(config_.endpoint.transport);
      return;
    }
  }
  finish_stop_st(stopped, now);
}

void NetCore::finish_stop_st(const Handle& stopped, transport::Tick now) {
  stopped_ = true;
  if (ends_loop_) loop_->stop_st();
  // What arrived and waits for a delayed ACK is acknowledged now: the server
  // would otherwise resend it to a worker that no longer polls.
  if (endpoint_) endpoint_->flush_acks_st(now);
  publish_st();
  stopped.complete();
}

void NetCore::take_st(Request& r, transport::Tick now) {
  using Kind = Request::Kind;
  if (r.kind == Kind::kStart) {
    resume_ = std::move(r.resume);
    start_st(r.handle, now);
    return;
  }
  if (r.kind == Kind::kRollBack) {
    roll_back_st(r);
    return;
  }
  if (phase_ != Phase::kRunning || r.rollbacks != rollbacks_) {
    const std::string why =
        !broken_.empty() ? broken_
        : recovering()   ? lost_text_ +
                             "; waiting for it to come back: roll_back() says the version to "
                             "replay from"
        : phase_ == Phase::kRunning
            ? "the job rolled back to version " + std::to_string(start_version_) +
                  " after this call was made: roll_back() first"
            : "the worker has not started";
    r.handle.fail(why);
    if (r.push) r.push->fail(why);
    return;
  }
  switch (r.kind) {
    case Kind::kPush:
      ++pushes_taken_;
      if (static_cast<int32_t>(r.iteration + 1 - next_push_) > 0) next_push_ = r.iteration + 1;
      if (config_.timeline)
        config_.timeline->mark_st(r.tensor, r.iteration, Timeline::Mark::kRequested);
      push_st(r.tensor, r.iteration, r.marked, r.grad, wire::PacketType::kData, r.handle);
      break;
    case Kind::kPull:
      ++pulls_taken_;
      pull_st(pull_of(r, std::nullopt));
      break;
    case Kind::kPushPull:
      ++pushes_taken_;
      ++pulls_taken_;
      if (static_cast<int32_t>(r.iteration + 1 - next_push_) > 0) next_push_ = r.iteration + 1;
      if (config_.timeline)
        config_.timeline->mark_st(r.tensor, r.iteration, Timeline::Mark::kRequested);
      push_st(r.tensor, r.iteration, r.marked, r.grad, wire::PacketType::kData, *r.push);
      pull_st(pull_of(r, r.push));
      break;
    case Kind::kBarrier:
      barrier_st(r.generation, r.handle);
      break;
    case Kind::kSettings:
      settings_st(r.values, r.handle);
      break;
    case Kind::kState:
      state_st(r.state_out, r.handle);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------
// Start: declare to every server, wait for Ready (net_core_control.cpp), rank
// 0 pushes its initial parameters, everyone waits for version 0 (poll_st).

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
    if (shard_server_.size() != table_.shards()) {
      throw UsageError("the servers run " + std::to_string(shard_server_.size()) +
                       " shards, the tensors were placed on " + std::to_string(table_.shards()));
    }
    pulls_ = std::make_unique<PullTracker>(table_, config_.pulls);
    base_.assign(table_.tensors(), 0);
    if (config_.timeline) {
      timeline_push_.assign(table_.tensors(), 0);
      timeline_first_.assign(table_.tensors(), 0);
    }
    pushes_ = std::make_unique<PushTracker>(table_);
    endpoint_ = std::make_unique<transport::Endpoint>(port_, config_.endpoint,
                                                      transport::Receivers{this, this}, now);
    if (resume_ && has_standby()) {
      throw UsageError(
          "resuming from a state file with a hot standby is not built (the standby would not "
          "have the state's settings)");
    }
    std::vector<node::ControlPeer> peers;
    for (uint16_t p = 0; p < endpoint_->num_peers(); ++p) peers.push_back({endpoint_.get(), p});
    control_.emplace(std::move(peers), static_cast<node::ControlChannel::Handler&>(*this),
                     node::ControlChannel::Options{.max_bytes = kMaxControlBytes,
                                                   .heartbeat_every = transport::keepalive_interval(
                                                       config_.endpoint.transport)});
    control_->share_owner(owner_);
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
  last_push_.assign(tensors, LastPush{});
  // The servers and their standbys: a standby builds its shards from the
  // same declarations and answers them as its server does.
  ready_.assign(endpoint_->num_peers(), false);
  unsettled_.assign(endpoint_->num_peers(), 0);

  agg::ControlMessage declare;
  declare.kind = agg::ControlKind::kDeclare;
  declare.rank = config_.rank;
  declare.tensors = table_.declarations();
  // Rank 0 resuming: the servers start from its pages, at their version.
  declare.seeded = resume_ != nullptr;
  declare.version = resume_ ? resume_->version : 0;
  phase_ = Phase::kDeclaring;
  start_deadline_ = now + config_.start_timeout_ms * (config_.endpoint.transport.tsc_hz / 1000);
  if (config_.spare) {
    // A spare announces itself to server 0 alone and waits, as long as the
    // job runs, for a rank (on_ready_st) or its release.
    declare.rank = agg::kSpareRank;
    spare_waits_ = true;
    if (!control_->send_st(0, declare)) {
      fail_start_st("start: the announcement to " + server_name(0) +
                    " could not be queued (endpoint full)");
    }
    return;
  }
  send_declarations_st(declare, 0);
}

bool NetCore::send_declarations_st(const agg::ControlMessage& declare, uint16_t first) {
  for (uint16_t p = first; p < endpoint_->num_peers(); ++p) {
    if (!control_->send_st(p, declare)) {
      fail_start_st("start: the declarations to " + server_name(p) +
                    " could not be queued (endpoint full)");
      return false;
    }
  }
  return true;
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
  rolling_back_ = false;
  fail_pending_st(why);
  for (const Handle& h : roll_back_waiters_) h.fail(why);
  roll_back_waiters_.clear();
}

void NetCore::fail_pending_st(const std::string& why) {
  for (PendingPush& p : push_queue_) {
    if (!p.started) {
      p.handle.fail(why);
    } else if (pushes_) {
      // The tracker holds it and waits for every block: settle the ones
      // never queued as failed, the queued ones settle through the endpoint.
      const auto blocks = table_.blocks(p.tensor);
      for (uint32_t i = p.next; i < blocks.size(); ++i)
        pushes_->settled_st(blocks[i].key, false, why);
    }
  }
  push_queue_.clear();
  // The trainer may reuse a pull's buffer once told it failed: none of the
  // tracker's non-temporal stores may land after that.
  if (!pull_queue_.empty()) net::stream_fence();
  for (PendingPull& p : pull_queue_) {
    if (!p.handle.ready()) p.handle.fail(why);
  }
  pull_queue_.clear();
  for (PendingBarrier& b : barriers_) b.handle.fail(why);
  barriers_.clear();
  fail_state_requests_st(why);
}

// ---------------------------------------------------------------------------
// Slow work.

void NetCore::slow_st(transport::Tick now) {
  MERCURY_OWNED(owner_);
  if (stopped_) return;
  if ((phase_ == Phase::kDeclaring || phase_ == Phase::kInitialising) && now > start_deadline_ &&
      !spare_waits_) {
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
        if (version_in_st(t, start_version_)) continue;
        if (missing++ == 0) first = table_.tensor(t).name;
      }
      const std::string what =
          rolling_back_ ? lost_text_ + "; version " + std::to_string(start_version_) +
                              " (the one it resumed at) of "
          : start_version_ == 0 ? std::string("start: version 0 (rank 0's initial parameters) of ")
                                : "start: version " + std::to_string(start_version_) + " of ";
      fail_start_st(what + std::to_string(missing) + " of " + std::to_string(table_.tensors()) +
                    " tensors did not arrive" + within + " (first: '" + first + "')");
    }
  }
  // Every peer but a server its standby took over from (or is taking
  // over from) and a standby lost.
  const auto every = [this](uint32_t p) {
    if (p < config_.servers.size()) return ((failed_over_ | failing_over_) >> p & 1) == 0;
    const uint16_t s = server_of_standby(static_cast<uint16_t>(p));
    return s != kNoStandby && (standby_lost_ >> s & 1) == 0;
  };
  if (endpoint_ && broken_.empty() && phase_ != Phase::kRecovering) {
    if (const std::optional<uint32_t> lost = control_->lost_st(every)) {
      lose_peer_st(static_cast<uint16_t>(*lost),
                   server_name(static_cast<uint16_t>(*lost)) + " stopped answering");
    }
  }
  if ((held_ & ~probed_) != 0 && broken_.empty()) probe_held_st();
  if (failing_over_ != 0 && broken_.empty() && now > failover_deadline_) {
    const auto s = static_cast<uint16_t>(std::countr_zero(failing_over_));
    break_st(server_name(s) + " was lost and its standby did not take over within " +
             std::to_string(config_.server_wait_ms) + " ms");
  }
  if (held_ready_ && phase_ == Phase::kRecovering && !pushes_unsettled_st(lost_server_)) {
    const agg::ControlMessage m = *held_ready_;
    on_recovered_ready_st(lost_server_, m);
  }
  if (phase_ == Phase::kRecovering && now > recover_deadline_) {
    break_st(lost_text_ + "; it did not come back within " +
             std::to_string(config_.server_wait_ms / 1000.0).substr(0, 6) +
             " s (network.server_wait_s)");
  }
  // While the job runs, a heartbeat to every server each keepalive
  // interval: the transport's liveness names a dead server even when
  // nothing else is outstanding.
  if (broken_.empty() && (phase_ == Phase::kInitialising || phase_ == Phase::kRunning)) {
    control_->heartbeat_st(now, every);
  } else if (broken_.empty() && spare_waits_) {
    // A spare that waits hears from server 0 alone: a server 0 that died
    // is named, and its start fails, instead of waiting for ever.
    control_->heartbeat_st(now, [](uint32_t p) { return p == 0; });
  }
  if (now >= port_stats_at_) {
    port_stats_at_ = now + config_.endpoint.transport.tsc_hz * kPortStatsMs / 1000;
    port_.refresh_port_stats_st();
  }
  publish_st();
}

void NetCore::publish_st() {
  stats_.pushes.store(pushes_taken_, std::memory_order_relaxed);
  stats_.pulls.store(pulls_taken_, std::memory_order_relaxed);
  const std::array<uint64_t, net::kDropReasonCount>& drops = port_.drops();
  for (size_t i = 0; i < net::kDropReasonCount; ++i) {
    stats_.port_drops[i].store(drops[i], std::memory_order_relaxed);
  }
  size_t pmd = 0;
  port_.pmd_drops().for_each([this, &pmd](std::string_view, std::string_view, uint64_t n) {
    stats_.pmd_drops[pmd++].store(n, std::memory_order_relaxed);
  });
  if (!endpoint_) return;
  const transport::EndpointCounters& net = endpoint_->counters_st();
  for (size_t i = 0; i < transport::kEndpointDropCount; ++i) {
    stats_.transport_drops[i].store(net.drops[i], std::memory_order_relaxed);
  }
  const PullCounters& p = pulls_->counters_st();
  uint64_t dropped = 0;
  for (size_t v = static_cast<size_t>(ChunkVerdict::kDuplicate); v < kChunkVerdictCount; ++v) {
    dropped += p.verdicts[v];
  }
  stats_.bytes_pushed.store(bytes_pushed_, std::memory_order_relaxed);
  stats_.chunks_received.store(chunks_received_, std::memory_order_relaxed);
  stats_.bytes_placed.store(p.bytes_placed, std::memory_order_relaxed);
  stats_.versions_completed.store(p.versions_completed, std::memory_order_relaxed);
  stats_.retransmits.store(endpoint_->counters_st().tx_retransmits, std::memory_order_relaxed);
  stats_.chunks_dropped.store(dropped + rollback_dropped_, std::memory_order_relaxed);
  const node::ControlChannelCounters& ch = control_->counters();
  stats_.control_dropped.store(control_malformed_ + ch.too_big + ch.malformed,
                               std::memory_order_relaxed);
  stats_.staleness_sum.store(staleness_sum_, std::memory_order_relaxed);
  stats_.stale_pushes.store(stale_pushes_, std::memory_order_relaxed);
  stats_.staleness_max.store(staleness_max_, std::memory_order_relaxed);
  stats_.ssp_waits.store(ssp_waits_, std::memory_order_relaxed);
  stats_.ssp_gap_max.store(ssp_gap_max_, std::memory_order_relaxed);
  stats_.workers_removed.store(workers_removed_, std::memory_order_relaxed);
  stats_.workers_left.store(static_cast<uint64_t>(std::popcount(ranks_left_)),
                            std::memory_order_relaxed);
  stats_.workers_joined.store(workers_joined_, std::memory_order_relaxed);
  stats_.standby_takeovers.store(takeovers_, std::memory_order_relaxed);
  stats_.tensors_resent.store(tensors_resent_, std::memory_order_relaxed);
}

}  // namespace mercury::worker
