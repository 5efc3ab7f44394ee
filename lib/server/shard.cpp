#include "server/shard.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mercury::server {

Shard::Shard(const agg::Placement& placement, const agg::ShardConfig& config,
             std::unique_ptr<agg::SyncPolicy> policy, std::vector<FanOut> fanout,
             const net::BufferOps& buffers, uint64_t fanout_backlog, Fanout rule,
             uint64_t snapshots, uint32_t unit_chunks, uint32_t staleness_bound)
    : placement_(placement),
      fanout_(std::move(fanout)),
      chunk_bytes_(config.chunk_bytes),
      started_(placement, config.shard, config.chunk_bytes),
      rule_(rule),
      staleness_bound_(staleness_bound),
      releases_(buffers) {
  if (!fanout_fits(rule_, *policy)) {
    throw std::invalid_argument("Shard: fan-out rule and sync policy " +
                                std::string(policy->name()) + " do not match");
  }
  if (unit_chunks != 0 && rule_ != Fanout::kEvery) {
    throw std::invalid_argument("Shard: store-and-forward needs BSP's fan-out, not " +
                                std::string(policy->name()));
  }
  table_ = std::make_unique<agg::ChunkTable>(placement, config, std::move(policy), *this);
  live_ = fanout_.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << fanout_.size()) - 1;
  if (unit_chunks != 0) {
    unit_chunks_ = unit_chunks;
    held_.assign(started_.chunks(), 0);
    unit_held_.assign(started_.chunks(), 0);
  }
  staging_chunks_ = table_->staging_chunks();
  const uint64_t most = table_->chunks() * fanout_.size() * (rule_ == Fanout::kEvery ? 1 : 2);
  backlog_.resize(fanout_backlog != 0 ? fanout_backlog : most);
  if (rule_ != Fanout::kEvery) {
    waiting_.assign(table_->chunks() * fanout_.size(), 0);
    if (rule_ == Fanout::kSlowest)
      ssp_.reset(table_->chunks(), static_cast<uint32_t>(fanout_.size()));
    // Two per chunk by default: with one, under psplus a busy link left every
    // snapshot on the wire for over half the updates, and the answers to the
    // workers' own pushes, which their next pushes wait for, waited with
    // them (docs/server.md, "Snapshots").
    constexpr uint64_t kSnapshotsPerChunk = 2;
    snapshot_count_ =
        snapshots != 0 ? snapshots : std::max<uint64_t>(table_->chunks() * kSnapshotsPerChunk, 1);
    // Not zeroed: a snapshot is written before it is sent, and pages are
    // touched only as snapshots are first used.
    snapshot_mem_ = std::make_unique_for_overwrite<std::byte[]>(snapshot_count_ * chunk_bytes_);
    snapshot_refs_ = std::make_unique<std::atomic<uint32_t>[]>(snapshot_count_);
    for (uint64_t i = 0; i < snapshot_count_; ++i) snapshot_refs_[i].store(0);
  }
  if (rule_ != Fanout::kEvery) {
    // psplus's eager pull; in the other asynchronous modes only a joining
    // rank's first pull (join_rank_st) uses it.
    const uint64_t chunks = table_->chunks();
    owed_.assign(chunks * fanout_.size(), 0);
    eager_ring_.resize(chunks * fanout_.size());
    eager_head_.assign(fanout_.size(), 0);
    eager_count_.assign(fanout_.size(), 0);
    eager_out_ = std::make_unique<std::atomic<uint32_t>[]>(fanout_.size());
    for (size_t r = 0; r < fanout_.size(); ++r) eager_out_[r].store(0);
    eager_window_ = static_cast<uint32_t>(
        std::max<uint64_t>(kEagerWindowBytes / std::max<uint32_t>(chunk_bytes_, 1), 1));
  }
}

bool Shard::contribute_st(uint16_t rank, uint32_t key, uint32_t offset, uint32_t iteration,
                          uint32_t clock, std::span<const std::byte> payload, net::PacketBuf* buf,
                          bool copy) {
  MERCURY_OWNED(owner_);
  const uint64_t released = table_->staging_released();
  const agg::Outcome o =
      table_->contribute(agg::Contribution{.key = key,
                                           .offset = offset,
                                           .iteration = iteration,
                                           .rank = rank,
                                           .clock = clock,
                                           .data = payload.data(),
                                           .bytes = static_cast<uint32_t>(payload.size()),
                                           .token = buf,
                                           .copy = copy});
  if (copy) {
    marks_done_.store(marks_done_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (o != agg::Outcome::kCopied) ++marks_returned_;
  }
  if (copy || table_->staging_released() != released) {
    // The credits back: unused marks, and the staging chunks the update freed.
    staging_returned_.store(marks_returned_ + table_->staging_released(),
                            std::memory_order_relaxed);
  }
  if (agg::taken(o)) {
    // kApplied cleared the chunk's view in on_update, inside contribute().
    if (o == agg::Outcome::kHeld || o == agg::Outcome::kCopied) started_.held_st(key, offset, rank);
    ++counters_.contributions;
    return o != agg::Outcome::kCopied;
  }
  ++counters_.refused;
  if ((promoted_ || !kept_.empty()) && o == agg::Outcome::kStale &&
      table_->version(key, offset) == iteration + 1) {
    // Its worker resends what the lost primary had not answered, and the
    // primary had applied this set; or (on_worker_loss wait) a rank's new
    // process pushes again what its old one gave: the answer, not a second
    // update.
    answer_again_st(rank, key, offset);
  }
  return false;
}

bool Shard::initialize_st(uint32_t key, uint32_t offset, std::span<const std::byte> payload) {
  MERCURY_OWNED(owner_);
  const agg::Outcome o =
      table_->initialize(key, offset, payload.data(), static_cast<uint32_t>(payload.size()));
  if (agg::taken(o)) {
    ++counters_.initialized;
    return true;
  }
  ++counters_.init_refused;
  return false;
}

bool Shard::send_st(uint16_t rank, const std::byte* data, uint32_t bytes, uint32_t key,
                    uint32_t offset, uint32_t version, uint8_t priority, uint32_t tag,
                    const transport::Completion& done) {
  transport::MessageMeta meta;
  const agg::Block& block = placement_.at(key);
  meta.type = wire::PacketType::kAggData;
  meta.dtype = block.dtype;  // the update was rounded into the tensor's dtype
  meta.block_key = key;
  meta.iteration = tag;
  meta.param_version = version;
  const auto logical = static_cast<uint32_t>(block.bytes());
  const FanOut& f = fanout_[rank];
  return f.endpoint->send_slice(f.peer, data, bytes, offset, logical, priority, meta, done) ==
         transport::SubmitStatus::kQueued;
}

void Shard::defer_st(const Deferred& d) {
  if (rule_ != Fanout::kEvery && d.yours == 0 && waiting_[waiting_index(d)] != 0) {
    ++counters_.fanout_merged;  // the waiting one sends the newest version
    return;
  }
  if (backlog_count_ == backlog_.size()) {
    ++counters_.fanout_lost;
    return;
  }
  if (rule_ != Fanout::kEvery) ++waiting_[waiting_index(d)];
  backlog_[(backlog_head_ + backlog_count_++) % backlog_.size()] = d;
}

void Shard::pop_backlog_st() {
  if (rule_ != Fanout::kEvery) --waiting_[waiting_index(backlog_[backlog_head_])];
  backlog_head_ = (backlog_head_ + 1) % backlog_.size();
  --backlog_count_;
}

void Shard::on_update(const agg::Update& u) {
  // Before the fan-out: the workers' next contributions, which need this
  // update, must find the chunk's set empty (server/started_sets.h).
  started_.cleared_st(u.key, u.offset);
  ++counters_.updates;
  // A checkpoint's copy comes before the update can go out: no worker can
  // send the chunk's next gradient yet (snapshot.h). Initial or restored
  // values (no contributor) are no new state.
  if (snapshot_ != nullptr && u.contributors != 0) {
    snapshot_->on_update_st(u.key, u.offset, u.version);
  }
  if (rule_ != Fanout::kEvery) {
    fanout_async_st(u);
    return;
  }
  if (!kept_.empty()) {
    // on_worker_loss wait: this version aside, beside the one before.
    if (const int64_t at = started_.index(u.key, u.offset); at >= 0) {
      const uint64_t slot = static_cast<uint64_t>(at) * 2 + (u.version & 1);
      std::memcpy(kept_.data() + slot * chunk_bytes_, u.data, u.bytes);
      kept_version_[slot] = u.version;
    }
  }
  // Initial or restored values are no aggregate: not held.
  if (unit_chunks_ != 0 && u.contributors != 0) {
    hold_st(u);
    return;
  }
  if (standby_.endpoint != nullptr) {
    // A hot standby: to the workers once the standby has it (replica.h).
    if (const int64_t at = table_->chunk_index(u.key, u.offset); at >= 0) {
      gates_.arm(static_cast<uint64_t>(at), arrays_);
      if (standby_failed_) return;  // it waits for standby_lost_st()
      const uint32_t next = send_replica_st(static_cast<uint64_t>(at), 0);
      if (next < arrays_) {
        ++counters_.replica_refused;
        replica_retry_[(replica_retry_head_ + replica_retry_count_++) % replica_retry_.size()] =
            static_cast<uint64_t>(at) << 2 | next;
      }
      return;
    }
  }
  fanout_chunk_st(u.key, u.offset, u.bytes, u.data, u.version, u.priority);
}

void Shard::fanout_chunk_st(uint32_t key, uint32_t offset, uint32_t bytes, const std::byte* data,
                            uint32_t version, uint8_t priority) {
  for (size_t r = 0; r < fanout_.size(); ++r) {
    const auto rank = static_cast<uint16_t>(r);
    if ((live_ >> r & 1) == 0) continue;  // removed from a job that shrank
    if (send_st(rank, data, bytes, key, offset, version, priority)) continue;
    ++counters_.fanout_refused;
    defer_st(Deferred{key, offset, version, rank, priority, 0});
  }
}

void Shard::hold_st(const agg::Update& u) {
  const int64_t at = started_.index(u.key, u.offset);
  if (at < 0) {  // not a chunk of this shard: the table never emits one
    fanout_chunk_st(u.key, u.offset, u.bytes, u.data, u.version, u.priority);
    return;
  }
  const uint64_t block_bytes = placement_.at(u.key).bytes();
  const uint64_t block_chunks = (block_bytes + chunk_bytes_ - 1) / chunk_bytes_;
  const uint64_t chunk = u.offset / chunk_bytes_;  // within the block
  const uint64_t first = chunk - chunk % unit_chunks_;
  const uint64_t size = std::min<uint64_t>(unit_chunks_, block_chunks - first);
  const auto unit = static_cast<uint64_t>(at) - (chunk - first);
  // A chunk updated twice before its unit went (a trainer that pushes
  // without pulling) counts once; the unit then sends its newest version.
  if (held_[at] == 0) {
    held_[at] = 1;
    ++unit_held_[unit];
  }
  if (unit_held_[unit] < size) {
    ++counters_.updates_held;
    return;
  }
  unit_held_[unit] = 0;
  // The block's values in its dtype: offsets and lengths here are wire bytes.
  const std::byte* base = table_->wire_values(u.key).data();
  for (uint64_t c = 0; c < size; ++c) {
    held_[unit + c] = 0;
    const auto offset = static_cast<uint32_t>((first + c) * chunk_bytes_);
    const auto bytes =
        static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, block_bytes - offset));
    fanout_chunk_st(u.key, offset, bytes, base + offset, table_->version(u.key, offset),
                    u.priority);
  }
}

uint64_t Shard::take_snapshot_st() {
  // Snapshots end roughly in the order they were taken, so the one after
  // the last taken is normally free; look a little further before giving up.
  const uint64_t tries = std::min<uint64_t>(snapshot_count_, 64);
  for (uint64_t i = 0; i < tries; ++i) {
    const uint64_t s = snapshot_cursor_;
    snapshot_cursor_ = snapshot_cursor_ + 1 == snapshot_count_ ? 0 : snapshot_cursor_ + 1;
    // Acquire: the last completion's release orders the endpoint's reads of
    // the old bytes before the copy that overwrites them.
    if (snapshot_refs_[s].load(std::memory_order_acquire) == 0) return s;
  }
  return snapshot_count_;
}

void Shard::on_snapshot_sent(void* self, const transport::SendResult& r) {
  static_cast<Shard*>(self)->snapshot_refs_[r.cookie].fetch_sub(1, std::memory_order_release);
}

void Shard::fanout_async_st(const agg::Update& u) {
  // Version 0 (initial values, no contributor) and PS+ go to everyone; the
  // contributor its answer, which under SSP waits while the slowest clock
  // holds its worker back and goes with the update that releases it
  // (SspAnswers).
  if (u.version != 0) {
    counters_.staleness_sum += u.staleness;
    if (u.staleness != 0) ++counters_.stale_updates;
  }
  SspAnswers::Route route =
      fanout_route(rule_, ssp_, u, static_cast<uint64_t>(started_.index(u.key, u.offset)),
                   static_cast<uint32_t>(fanout_.size()), staleness_bound_);
  // A rank that left the job is sent nothing (its contributions in flight
  // still apply).
  route.to &= live_;
  route.first &= live_;
  if (rule_ == Fanout::kEveryVersion && u.version != 0) {
    // The eager pull: the contributor gets its answer now; the others are
    // owed the chunk's newest version, sent as their links have room.
    for (uint64_t left = route.to & ~route.yours; left != 0; left &= left - 1) {
      owe_eager_st(static_cast<uint16_t>(std::countr_zero(left)), u.key, u.offset);
    }
    route.to &= route.yours;
  }
  if ((route.to | route.first) == 0) return;  // an SSP answer owed, or only eager copies
  const uint64_t s = take_snapshot_st();
  const bool have = s != snapshot_count_;
  if (have) {
    std::memcpy(snapshot(s), u.data, u.bytes);
    snapshot_refs_[s].store(
        static_cast<uint32_t>(std::popcount(route.to) + std::popcount(route.first)),
        std::memory_order_relaxed);
  } else {
    ++counters_.snapshots_full;
  }
  // `first`'s packets (earlier answers, SSP), then `to`'s.
  for (uint64_t pass = 0; pass < 2; ++pass) {
    for (uint64_t left = pass == 0 ? route.first : route.to; left != 0; left &= left - 1) {
      const auto rank = static_cast<uint16_t>(std::countr_zero(left));
      const bool yours = pass == 0 || ((route.yours >> rank) & 1) != 0;
      if (have) {
        const uint32_t tag = fanout_tag(u.slowest, yours);
        if (send_st(rank, snapshot(s), u.bytes, u.key, u.offset, u.version, u.priority, tag,
                    transport::Completion{&Shard::on_snapshot_sent, this, s})) {
          continue;
        }
        snapshot_refs_[s].fetch_sub(1, std::memory_order_relaxed);
        ++counters_.fanout_refused;
      }
      defer_st(
          Deferred{u.key, u.offset, u.version, rank, u.priority, yours ? uint8_t{1} : uint8_t{0}});
    }
  }
}

void Shard::owe_eager_st(uint16_t rank, uint32_t key, uint32_t offset) {
  const uint64_t i = pair_index(key, offset, rank);
  if (owed_[i] != 0) {
    ++counters_.fanout_merged;  // the owed copy will carry this version too
    return;
  }
  owed_[i] = 1;
  const uint64_t chunks = table_->chunks();
  eager_ring_[rank * chunks + (eager_head_[rank] + eager_count_[rank]++) % chunks] =
      Owed{key, offset};
  ++eager_pending_;
}

uint32_t Shard::send_eager_st() {
  uint32_t sent = 0;
  const uint64_t chunks = table_->chunks();
  for (uint16_t rank = 0; rank < fanout_.size() && eager_pending_ != 0; ++rank) {
    while (eager_count_[rank] != 0 &&
           eager_out_[rank].load(std::memory_order_relaxed) < eager_window_) {
      const Owed& o = eager_ring_[rank * chunks + eager_head_[rank]];
      const Newest r = send_newest_st(rank, o.key, o.offset, kEagerLevel, false, true);
      if (r == Newest::kNoSnapshot) return sent;  // every snapshot on the wire: later
      if (r == Newest::kRefused) {
        ++counters_.fanout_refused;
        break;  // this worker's endpoint is full: the next one
      }
      owed_[pair_index(o.key, o.offset, rank)] = 0;
      eager_head_[rank] = (eager_head_[rank] + 1) % chunks;
      --eager_count_[rank];
      --eager_pending_;
      ++counters_.eager_sent;
      ++sent;
    }
  }
  return sent;
}

Shard::Newest Shard::send_newest_st(uint16_t rank, uint32_t key, uint32_t offset, uint8_t priority,
                                    bool yours, bool eager) {
  const uint64_t s = take_snapshot_st();
  if (s == snapshot_count_) return Newest::kNoSnapshot;
  // The chunk's newest version as the workers get it (in its dtype).
  const std::span<const std::byte> values = table_->wire_values(key);
  const auto bytes =
      static_cast<uint32_t>(std::min<uint64_t>(values.size() - offset, chunk_bytes_));
  std::memcpy(snapshot(s), values.data() + offset, bytes);
  snapshot_refs_[s].store(1, std::memory_order_relaxed);
  if (eager) eager_out_[rank].fetch_add(1, std::memory_order_relaxed);
  const transport::Completion done =
      eager ? transport::Completion{&Shard::on_eager_sent, this, s << 16 | rank}
            : transport::Completion{&Shard::on_snapshot_sent, this, s};
  if (!send_st(rank, snapshot(s), bytes, key, offset, table_->version(key, offset), priority,
               fanout_tag(table_->slowest(key, offset), yours), done)) {
    snapshot_refs_[s].store(0, std::memory_order_relaxed);
    if (eager) eager_out_[rank].fetch_sub(1, std::memory_order_relaxed);
    return Newest::kRefused;
  }
  return Newest::kSent;
}

void Shard::on_eager_sent(void* self, const transport::SendResult& r) {
  auto& shard = *static_cast<Shard*>(self);
  shard.snapshot_refs_[r.cookie >> 16].fetch_sub(1, std::memory_order_release);
  shard.eager_out_[r.cookie & 0xffff].fetch_sub(1, std::memory_order_relaxed);
}

uint32_t Shard::retry_fanout_st() {
  MERCURY_OWNED(owner_);
  uint32_t sent = 0;
  // Replicas first: the updates behind them wait for the standby.
  while (replica_retry_count_ != 0 && !standby_failed_) {
    uint64_t& e = replica_retry_[replica_retry_head_];
    const uint32_t next = send_replica_st(e >> 2, static_cast<uint32_t>(e & 3));
    if (next < arrays_) {
      e = (e >> 2) << 2 | next;
      break;
    }
    ++sent;
    replica_retry_head_ = (replica_retry_head_ + 1) % replica_retry_.size();
    --replica_retry_count_;
  }
  while (backlog_count_ != 0) {
    const Deferred& d = backlog_[backlog_head_];
    if ((live_ >> d.rank & 1) == 0) {  // its rank left the job
      ++counters_.removed_dropped;
      pop_backlog_st();
      continue;
    }
    if (rule_ != Fanout::kEvery) {
      // The chunk's newest version, which contains the deferred one.
      if (send_newest_st(d.rank, d.key, d.offset, d.priority, d.yours != 0, false) !=
          Newest::kSent) {
        break;
      }
      ++counters_.fanout_retried;
      ++sent;
      pop_backlog_st();
      continue;
    }
    const std::span<const std::byte> values = table_->wire_values(d.key);
    const std::byte* from = values.data() + d.offset;
    const uint64_t left = values.size() - d.offset;
    const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(left, chunk_bytes_));
    // A joining rank's older version is a kept copy (rejoin_rank_st).
    if (table_->version(d.key, d.offset) != d.version) {
      from = kept_st(started_.index(d.key, d.offset), d.version);
    }
    if (from == nullptr) {
      ++counters_.fanout_lost;  // cannot happen under BSP (see Deferred)
    } else if (!send_st(d.rank, from, bytes, d.key, d.offset, d.version, d.priority)) {
      break;
    } else {
      ++counters_.fanout_retried;
      ++sent;
    }
    pop_backlog_st();
  }
  // The eager copies after the answers and the deferred copies, which
  // workers wait for.
  return sent + (eager_pending_ != 0 ? send_eager_st() : 0);
}

void Shard::remove_rank_st(uint16_t rank) {
  MERCURY_OWNED(owner_);
  if (rank >= fanout_.size() || (live_ >> rank & 1) == 0) return;
  live_ &= ~(uint64_t{1} << rank);
  // BSP (a job that shrinks): the sets that hold every other rank's
  // contribution complete now and go to the ranks still in the job.
  table_->remove_rank(rank);
  if (rule_ == Fanout::kEvery) return;
  // Its deferred slices go when the backlog reaches them (retry_fanout_st).
  {
    // The eager copies it is owed (psplus's, or a first pull it had not
    // finished).
    const uint64_t chunks = table_->chunks();
    for (; eager_count_[rank] != 0; --eager_count_[rank]) {
      const Owed& o = eager_ring_[rank * chunks + eager_head_[rank]];
      owed_[pair_index(o.key, o.offset, rank)] = 0;
      eager_head_[rank] = (eager_head_[rank] + 1) % chunks;
      --eager_pending_;
      ++counters_.removed_dropped;
    }
  }
  if (rule_ != Fanout::kSlowest) return;
  // ssp: its owed answers are dropped; then every chunk's slowest clock
  // may have moved without an update, and the answers it now lets go are
  // sent (each with the chunk's newest version, which contains the
  // answered update), or deferred.
  counters_.removed_dropped += ssp_.forget(rank);
  for (uint64_t i = 0; i < table_->chunks() && ssp_.owed() != 0; ++i) {
    const agg::ChunkTable::ChunkView c = table_->chunk_view(i);
    const int64_t at = started_.index(c.key, c.offset);  // SspAnswers' numbering
    if (at < 0) continue;
    const uint64_t to = ssp_.release(static_cast<uint64_t>(at), table_->clocks(i),
                                     table_->slowest(c.key, c.offset), staleness_bound_);
    if (to == 0) continue;
    const uint8_t priority = placement_.at(c.key).priority;
    for (uint64_t left = to; left != 0; left &= left - 1) {
      const auto w = static_cast<uint16_t>(std::countr_zero(left));
      if (send_newest_st(w, c.key, c.offset, priority, true, false) == Newest::kSent) continue;
      ++counters_.fanout_refused;
      defer_st(Deferred{c.key, c.offset, c.version, w, priority, 1});
    }
  }
}

void Shard::join_rank_st(uint16_t rank, FanOut to) {
  MERCURY_OWNED(owner_);
  if (rule_ == Fanout::kEvery || rank >= fanout_.size() || (live_ >> rank & 1) != 0) return;
  live_ |= uint64_t{1} << rank;
  if (to.endpoint != nullptr) fanout_[rank] = to;
  table_->join_rank(rank);
  if (rule_ == Fanout::kSlowest) ssp_.admit(rank);
  // Its first pull: every chunk's newest version, owed as psplus's eager
  // copies are (its ring was emptied when it was removed), so the answers
  // the other ranks wait for go first.
  for (uint64_t i = 0; i < table_->chunks(); ++i) {
    const agg::ChunkTable::ChunkView c = table_->chunk_view(i);
    if (!c.initialized) continue;
    owe_eager_st(rank, c.key, c.offset);
    ++counters_.join_owed;
  }
}

void Shard::keep_versions() {
  if (rule_ != Fanout::kEvery) {
    throw std::invalid_argument("Shard: keeping versions needs BSP's fan-out");
  }
  kept_.assign(table_->chunks() * 2 * chunk_bytes_, std::byte{0});
  kept_version_.assign(table_->chunks() * 2, UINT32_MAX);
}

void Shard::suspend_rank_st(uint16_t rank) {
  MERCURY_OWNED(owner_);
  if (rule_ != Fanout::kEvery || rank >= fanout_.size()) return;
  // Its deferred slices go when the backlog reaches them (retry_fanout_st).
  live_ &= ~(uint64_t{1} << rank);
}

void Shard::rejoin_rank_st(uint16_t rank, uint32_t version) {
  MERCURY_OWNED(owner_);
  if (rule_ != Fanout::kEvery || rank >= fanout_.size()) return;
  live_ |= uint64_t{1} << rank;
  // Every chunk at `version`: the newest, or the kept copy of a chunk one
  // past it (whose next version goes to the rank as the answer to its push
  // of `version` again, contribute_st). Not the next version now: the
  // worker would place it in the trainer's buffer before the trainer read
  // version `version` for its gradient.
  for (uint64_t i = 0; i < table_->chunks(); ++i) {
    const agg::ChunkTable::ChunkView c = table_->chunk_view(i);
    const std::span<const std::byte> values = table_->wire_values(c.key);
    const auto bytes =
        static_cast<uint32_t>(std::min<uint64_t>(values.size() - c.offset, chunk_bytes_));
    const std::byte* from = c.version == version
                                ? values.data() + c.offset
                                : kept_st(started_.index(c.key, c.offset), version);
    if (from == nullptr) {
      ++counters_.fanout_lost;  // neither kept nor the newest: cannot happen under BSP
      continue;
    }
    ++counters_.join_owed;
    const uint8_t priority = placement_.at(c.key).priority;
    if (send_st(rank, from, bytes, c.key, c.offset, version, priority)) continue;
    ++counters_.fanout_refused;
    defer_st(Deferred{c.key, c.offset, version, rank, priority, 0});
  }
}

void Shard::rewind_st(uint32_t version) {
  MERCURY_OWNED(owner_);
  if (rule_ != Fanout::kEvery) return;
  counters_.rewound += backlog_count_;
  backlog_head_ = 0;
  backlog_count_ = 0;
  table_->rewind();
  // Every staging chunk is free again: its credit comes back.
  staging_returned_.store(marks_returned_ + table_->staging_released(), std::memory_order_relaxed);
  for (uint64_t i = 0; i < table_->chunks(); ++i) {
    const agg::ChunkTable::ChunkView c = table_->chunk_view(i);
    started_.cleared_st(c.key, c.offset);
  }
  if (snapshot_ != nullptr) snapshot_->rewind_st(version);
}

void Shard::release(void* const* tokens, uint32_t count) { releases_.free_st(tokens, count); }

}  // namespace mercury::server
