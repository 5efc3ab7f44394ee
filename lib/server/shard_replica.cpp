// Shard (shard.h): a hot standby's replication (replica.h; docs/durability.md,
// "A hot standby"). The primary's shard sends each updated chunk's state to
// the standby and fans it out once the standby acknowledged it; the
// standby's shard assembles each version and adopts it whole; promoted, it
// answers again the pushes whose update the primary had applied.
//
// Datapath: no allocation, lock, log or throw; every drop counted
// (replica_dropped, replica_unsent). replicate_to() and stand_by() are
// control path.
#include <algorithm>
#include <stdexcept>

#include "server/shard.h"

namespace mercury::server {

namespace {

uint32_t arrays_of(const agg::ChunkTable& table) {
  if (table.chunks() == 0) return 1;
  const agg::ChunkTable::ChunkView v = table.chunk_view(0);
  return 1 + (v.state0.empty() ? 0 : 1) + (v.state1.empty() ? 0 : 1);
}

const std::byte* bytes_of(std::span<const float> a) {
  return reinterpret_cast<const std::byte*>(a.data());
}

}  // namespace

void Shard::replicate_to(FanOut standby) {
  if (rule_ != Fanout::kEvery || unit_chunks_ != 0) {
    throw std::invalid_argument(
        "Shard: a standby needs BSP's fan-out chunk by chunk (training.sync bsp, "
        "training.aggregation chunk)");
  }
  standby_ = standby;
  arrays_ = arrays_of(*table_);
  gates_.reset(table_->chunks());
  replica_retry_.assign(std::max<uint64_t>(table_->chunks(), 1), 0);
}

void Shard::stand_by() {
  if (rule_ != Fanout::kEvery || unit_chunks_ != 0) {
    throw std::invalid_argument("Shard: a standby needs BSP's fan-out chunk by chunk");
  }
  standing_by_ = true;
  arrays_ = arrays_of(*table_);
  assembly_.reset(table_->chunks(), arrays_, chunk_bytes_ / sizeof(float));
}

uint32_t Shard::send_replica_st(uint64_t index, uint32_t array) {
  const agg::ChunkTable::ChunkView v = table_->chunk_view(index);
  const agg::Block& block = placement_.at(v.key);
  transport::MessageMeta meta;
  meta.type = wire::PacketType::kAggData;
  meta.dtype = wire::Dtype::kFloat32;  // the master values (a standby's blocks are float32)
  meta.block_key = v.key;
  meta.param_version = v.version;
  const auto logical = static_cast<uint32_t>(block.bytes());
  for (; array < arrays_; ++array) {
    const std::span<const float> a = array == 0 ? v.params : array == 1 ? v.state0 : v.state1;
    meta.iteration = replica_tag(std::min(v.steps, kMaxReplicaSteps), array);
    // At the block's own level: a lower one would let the answers of less
    // urgent tensors overtake this one's, whose fan-out waits for it.
    if (standby_.endpoint->send_slice(
            standby_.peer, bytes_of(a), static_cast<uint32_t>(a.size_bytes()), v.offset, logical,
            block.priority, meta, transport::Completion{&Shard::on_replica_sent, this, index}) !=
        transport::SubmitStatus::kQueued) {
      break;
    }
    counters_.replica_bytes += a.size_bytes();
  }
  return array;
}

void Shard::on_replica_sent(void* self, const transport::SendResult& r) {
  auto& shard = *static_cast<Shard*>(self);
  if (!r.ok()) {
    // The standby is lost (its transport peer died). The job goes on
    // without it rather than wait for it, but only once every worker knows
    // (the node calls standby_lost_st()): a worker that followed the
    // standby after this server died must not have seen a version it lacks.
    shard.standby_failed_ = true;
    return;
  }
  if (shard.gates_.settle(r.cookie)) {
    ++shard.counters_.replicated_versions;
    shard.release_chunk_st(r.cookie);
  }
}

void Shard::release_chunk_st(uint64_t index) {
  const agg::ChunkTable::ChunkView v = table_->chunk_view(index);
  fanout_chunk_st(v.key, v.offset, static_cast<uint32_t>(v.params.size_bytes()), bytes_of(v.params),
                  v.version, placement_.at(v.key).priority);
}

void Shard::standby_lost_st() {
  MERCURY_OWNED(owner_);
  if (standby_.endpoint == nullptr) return;
  standby_.endpoint = nullptr;
  standby_failed_ = false;
  replica_retry_count_ = 0;
  counters_.replica_unsent += gates_.open_all([this](uint64_t i) { release_chunk_st(i); });
}

bool Shard::take_replica_st(uint32_t key, uint32_t offset, uint32_t version, uint32_t tag,
                            std::span<const std::byte> payload) {
  MERCURY_OWNED(owner_);
  const int64_t at = table_->chunk_index(key, offset);
  if (!standing_by_ || promoted_ || at < 0) {
    ++counters_.replica_dropped;
    return false;
  }
  const auto i = static_cast<uint64_t>(at);
  const agg::ChunkTable::ChunkView v = table_->chunk_view(i);
  const auto n = static_cast<uint32_t>(v.params.size());
  switch (assembly_.add(i, version, replica_steps(tag), replica_array(tag), payload, n,
                        v.initialized, v.version)) {
    case ReplicaAssembly::Verdict::kPending:
      return true;
    case ReplicaAssembly::Verdict::kComplete: {
      const std::span<const float> none;
      const agg::Outcome o =
          table_->replicate(i, version, assembly_.steps(i), assembly_.array(i, 0, n),
                            arrays_ > 1 ? assembly_.array(i, 1, n) : none,
                            arrays_ > 2 ? assembly_.array(i, 2, n) : none);
      if (o != agg::Outcome::kInitialized) break;
      ++counters_.replicated_versions;
      return true;
    }
    case ReplicaAssembly::Verdict::kStale:
    case ReplicaAssembly::Verdict::kBad:
      break;
  }
  ++counters_.replica_dropped;
  return false;
}

void Shard::promote_st() {
  MERCURY_OWNED(owner_);
  promoted_ = true;
}

void Shard::answer_again_st(uint16_t rank, uint32_t key, uint32_t offset) {
  const int64_t at = table_->chunk_index(key, offset);
  if (at < 0 || rank >= fanout_.size()) return;
  const agg::ChunkTable::ChunkView v = table_->chunk_view(static_cast<uint64_t>(at));
  const uint8_t priority = placement_.at(key).priority;
  ++counters_.answered_again;
  // The chunk as the workers get it (a float32 block's: its parameters).
  const std::span<const std::byte> values = table_->wire_values(key);
  const auto bytes =
      static_cast<uint32_t>(std::min<uint64_t>(values.size() - offset, chunk_bytes_));
  if (send_st(rank, values.data() + offset, bytes, key, offset, v.version, priority)) return;
  ++counters_.fanout_refused;
  defer_st(Deferred{key, offset, v.version, rank, priority, 0});
}

}  // namespace mercury::server
