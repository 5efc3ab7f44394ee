#include "worker/pull_tracker.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "net/stream_copy.h"
#include "wire/header.h"

namespace mercury::worker {

std::string_view chunk_verdict_name(ChunkVerdict v) {
  switch (v) {
    case ChunkVerdict::kPlaced:
      return "placed";
    case ChunkVerdict::kOutrun:
      return "outrun";
    case ChunkVerdict::kDuplicate:
      return "duplicate";
    case ChunkVerdict::kStale:
      return "stale";
    case ChunkVerdict::kTooNew:
      return "too_new";
    case ChunkVerdict::kUnknownKey:
      return "unknown_key";
    case ChunkVerdict::kBadOffset:
      return "bad_offset";
    case ChunkVerdict::kBadLength:
      return "bad_length";
  }
  return "?";
}

PullTracker::PullTracker(const TensorTable& table, const PullTrackerConfig& config)
    : window_(config.window) {
  if (!table.frozen()) throw UsageError("PullTracker: the tensor table is not frozen");
  if (window_ < 1 || window_ > 64) {
    throw UsageError("PullTracker: window " + std::to_string(window_) + " must be in [1, 64]");
  }
  chunk_bytes_ = table.chunk_bytes();
  const uint32_t n = table.tensors();
  keys_.resize(table.placement().blocks().size());
  tensors_.resize(n);
  uint64_t words = 0;
  for (TensorId id = 0; id < n; ++id) {
    const TensorInfo& info = table.tensor(id);
    std::byte* base = info.buffer.data();
    for (const BlockGeometry& p : table.blocks(id)) {
      keys_[p.key] = {.base = base + p.first_byte(),
                      .tensor = id,
                      .first_chunk = p.first_chunk,
                      .bytes = static_cast<uint32_t>(p.bytes())};
    }
    TensorState& t = tensors_[id];
    t.awaited = config.first_version;
    t.chunks = info.chunks;
    t.words = (info.chunks + 63) / 64;
    t.first_word = words;
    t.first_slot = id * window_;
    words += uint64_t{t.words} * window_;
  }
  config_async_ = config.async;
  if (config_async_) {
    // No version window: the bitmaps stay empty.
    words = 0;
    async_.resize(n);
    uint64_t chunks = 0;
    for (TensorId id = 0; id < n; ++id) {
      AsyncTensor& a = async_[id];
      a.first = chunks;
      a.version.at_least = tensors_[id].chunks;
      a.slowest.at_least = tensors_[id].chunks;
      chunks += tensors_[id].chunks;
    }
    newest_.assign(chunks, 0);
    slowest_.assign(chunks, 0);
  }
  bits_.assign(words, 0);
  arrived_.assign(uint64_t{n} * window_, 0);
}

bool PullTracker::raise(Least& l, const uint32_t* values, uint32_t chunks, uint32_t before,
                        uint32_t after) {
  if (after <= before || before != l.least) return false;
  if (--l.at_least != 0) return false;
  l.least = UINT32_MAX;
  for (uint32_t c = 0; c < chunks; ++c) l.least = std::min(l.least, values[c]);
  l.at_least = 0;
  for (uint32_t c = 0; c < chunks; ++c) l.at_least += values[c] == l.least ? 1 : 0;
  return true;
}

ChunkVerdict PullTracker::deliver_async_st(uint32_t key, uint32_t offset, uint32_t version,
                                           uint32_t tag, std::span<const std::byte> payload) {
  MERCURY_OWNED(owner_);
  const KeyEntry* e = nullptr;
  ChunkVerdict v = locate(key, offset, payload.size(), e);
  if (v == ChunkVerdict::kPlaced) {
    const TensorState& t = tensors_[e->tensor];
    AsyncTensor& a = async_[e->tensor];
    const uint32_t chunk = e->first_chunk + offset / chunk_bytes_;
    uint32_t* newest = &newest_[a.first];
    uint32_t* slowest = &slowest_[a.first];
    // The transport delivers each packet once: every answer counts.
    if ((tag & wire::kAggYours) != 0) ++a.answers;
    const uint32_t clock = tag & wire::kAggSlowestMask;
    if (clock > slowest[chunk]) {
      const uint32_t before = slowest[chunk];
      slowest[chunk] = clock;
      raise(a.slowest, slowest, t.chunks, before, clock);
    }
    const uint32_t stamp = version + 1;
    if (stamp > newest[chunk]) {
      net::place_copy(e->base + offset, payload.data(), payload.size(),
                      uint64_t{t.chunks} * chunk_bytes_);
      counters_.bytes_placed += payload.size();
      const uint32_t before = newest[chunk];
      newest[chunk] = stamp;
      if (raise(a.version, newest, t.chunks, before, stamp)) {
        // Every chunk is at least this new now: fence the copies before
        // the trainer can learn it.
        net::stream_fence();
        ++counters_.versions_completed;
      }
    } else {
      v = ChunkVerdict::kOutrun;
    }
  }
  ++counters_.verdicts[static_cast<size_t>(v)];
  return v;
}

uint64_t PullTracker::memory_bytes() const {
  return bits_.size() * sizeof(uint64_t) + arrived_.size() * sizeof(uint32_t) +
         keys_.size() * sizeof(KeyEntry) + tensors_.size() * sizeof(TensorState) +
         (newest_.size() + slowest_.size()) * sizeof(uint32_t) +
         async_.size() * sizeof(AsyncTensor);
}

ChunkVerdict PullTracker::locate(uint32_t key, uint32_t offset, size_t bytes,
                                 const KeyEntry*& entry) const {
  if (key >= keys_.size()) return ChunkVerdict::kUnknownKey;
  const KeyEntry& e = keys_[key];
  if (offset >= e.bytes || offset % chunk_bytes_ != 0) return ChunkVerdict::kBadOffset;
  if (bytes != std::min(chunk_bytes_, e.bytes - offset)) return ChunkVerdict::kBadLength;
  entry = &e;
  return ChunkVerdict::kPlaced;
}

std::span<std::byte> PullTracker::destination_st(uint32_t key, uint32_t offset, uint32_t bytes) {
  MERCURY_OWNED(owner_);
  const KeyEntry* e = nullptr;
  const ChunkVerdict v = locate(key, offset, bytes, e);
  if (v != ChunkVerdict::kPlaced) {
    ++counters_.destination_refused[static_cast<size_t>(v)];
    return {};
  }
  return {e->base + offset, bytes};
}

bool PullTracker::test(const TensorState& t, uint32_t slot, uint32_t chunk) const {
  return (bits_[t.first_word + uint64_t{slot} * t.words + chunk / 64] >> (chunk % 64)) & 1;
}

ChunkVerdict PullTracker::deliver_st(uint32_t key, uint32_t offset, uint32_t version,
                                     std::span<const std::byte> payload) {
  MERCURY_OWNED(owner_);
  const KeyEntry* e = nullptr;
  ChunkVerdict v = locate(key, offset, payload.size(), e);
  if (v == ChunkVerdict::kPlaced) {
    TensorState& t = tensors_[e->tensor];
    // Serial arithmetic: versions may wrap around 2^32.
    const auto distance = static_cast<int32_t>(version - t.awaited);
    const uint32_t chunk = e->first_chunk + offset / chunk_bytes_;
    if (distance < 0) {
      v = ChunkVerdict::kStale;
    } else if (static_cast<uint32_t>(distance) >= window_) {
      v = ChunkVerdict::kTooNew;
    } else {
      const uint32_t slot = slot_of(t, static_cast<uint32_t>(distance));
      uint64_t& word = bits_[t.first_word + uint64_t{slot} * t.words + chunk / 64];
      const uint64_t bit = uint64_t{1} << (chunk % 64);
      if (word & bit) {
        v = ChunkVerdict::kDuplicate;
      } else {
        word |= bit;
        ++arrived_[t.first_slot + slot];
        // Never let an older version overwrite a newer one already in place
        // (impossible from a correct BSP server, cheap to rule out).
        bool newer = false;
        for (uint32_t d = static_cast<uint32_t>(distance) + 1; d < window_ && !newer; ++d) {
          newer = test(t, slot_of(t, d), chunk);
        }
        if (newer) {
          v = ChunkVerdict::kOutrun;
        } else {
          // A tensor larger than the caches is written around them, as the
          // endpoint places large messages; advance() fences.
          net::place_copy(e->base + offset, payload.data(), payload.size(),
                          uint64_t{t.chunks} * chunk_bytes_);
          counters_.bytes_placed += payload.size();
        }
        if (distance == 0) advance(t);
      }
    }
  }
  ++counters_.verdicts[static_cast<size_t>(v)];
  return v;
}

void PullTracker::advance(TensorState& t) {
  while (arrived_[t.first_slot + t.head] == t.chunks) {
    // The version's bytes are all placed: order any non-temporal stores of
    // deliver_st() before the trainer can learn it (the net core completes
    // pulls once awaited_st() has moved past their version).
    net::stream_fence();
    // The slot is reused for version awaited + window as the window moves.
    std::fill_n(bits_.begin() + static_cast<ptrdiff_t>(t.first_word + uint64_t{t.head} * t.words),
                t.words, 0);
    arrived_[t.first_slot + t.head] = 0;
    t.head = (t.head + 1) % window_;
    ++t.awaited;
    ++counters_.versions_completed;
  }
}

uint32_t PullTracker::arrived_st(TensorId tensor, uint32_t version) const {
  MERCURY_OWNED(owner_);
  const TensorState& t = tensors_[tensor];
  const auto distance = static_cast<int32_t>(version - t.awaited);
  if (distance < 0 || static_cast<uint32_t>(distance) >= window_) return 0;
  return arrived_[t.first_slot + slot_of(t, static_cast<uint32_t>(distance))];
}

PushTracker::PushTracker(const TensorTable& table) {
  if (!table.frozen()) throw UsageError("PushTracker: the tensor table is not frozen");
  const uint32_t n = table.tensors();
  key_tensor_.resize(table.placement().blocks().size());
  blocks_.resize(n);
  for (TensorId id = 0; id < n; ++id) {
    blocks_[id] = table.tensor(id).blocks;
    for (const BlockGeometry& p : table.blocks(id)) key_tensor_[p.key] = id;
  }
  flights_.resize(n);
  errors_.resize(n);
}

StartResult PushTracker::start_st(TensorId tensor, const Handle& push) {
  MERCURY_OWNED(owner_);
  Flight& f = flights_[tensor];
  if (f.handle) return StartResult::kBusy;
  f.handle = push;
  f.remaining = blocks_[tensor];
  f.error_len = 0;
  ++in_flight_;
  ++counters_.pushes_started;
  return StartResult::kStarted;
}

void PushTracker::settled_st(uint32_t key, bool delivered, std::string_view error) {
  MERCURY_OWNED(owner_);
  if (key >= key_tensor_.size() || !flights_[key_tensor_[key]].handle) {
    ++counters_.unexpected;
    return;
  }
  const TensorId tensor = key_tensor_[key];
  Flight& f = flights_[tensor];
  if (delivered) {
    ++counters_.blocks_acked;
  } else {
    ++counters_.blocks_failed;
    if (f.error_len == 0) {
      if (error.empty()) error = "push failed (no reason given)";
      f.error_len = static_cast<uint32_t>(std::min(error.size(), kMaxErrorBytes));
      std::memcpy(errors_[tensor].data(), error.data(), f.error_len);
    }
  }
  if (--f.remaining > 0) return;
  const Handle h = *f.handle;
  f.handle.reset();
  --in_flight_;
  if (f.error_len == 0) {
    ++counters_.pushes_completed;
    h.complete();
  } else {
    ++counters_.pushes_failed;
    h.fail({errors_[tensor].data(), f.error_len});
  }
}

}  // namespace mercury::worker
