#include "agg/chunk_table.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "base/serial.h"
#include "sched/huge_array.h"

namespace mercury::agg {

using base::serial_diff;

namespace {

// Whether a kOptimizerRank0 push (rank 0's, on the wire in `dtype`) is the
// skip marker: its first element's bits (any alignment: it sits in a packet).
bool skips_step(const std::byte* push, wire::Dtype dtype) {
  if (dtype == wire::Dtype::kFloat32) {
    uint32_t bits;
    std::memcpy(&bits, push, sizeof bits);
    return bits == kSkipStepFloat32;
  }
  uint16_t bits;
  std::memcpy(&bits, push, sizeof bits);
  return bits == (dtype == wire::Dtype::kBFloat16 ? kSkipStepBFloat16 : kSkipStepFloat16);
}

struct Layout {
  uint64_t elements = 0;
  uint64_t chunks = 0;
  uint32_t blocks = 0;
  bool half = false;   // a bfloat16 or float16 block is owned
  bool skips = false;  // a kOptimizerRank0 block is owned: steps are counted apart
};

// Elements per chunk of a block of `dtype`: a chunk is chunk_bytes on the wire.
uint32_t chunk_elements(uint32_t chunk_bytes, wire::Dtype dtype) {
  return chunk_bytes / wire::element_bytes(dtype);
}

Layout layout_of(const Placement& placement, const ShardConfig& config) {
  Layout l;
  for (const Block& p : placement.blocks()) {
    if (p.shard != config.shard) continue;
    const uint32_t per_chunk = chunk_elements(config.chunk_bytes, p.dtype);
    l.elements += p.elements;
    l.chunks += (p.elements + per_chunk - 1) / per_chunk;
    ++l.blocks;
    l.half = l.half || p.dtype != wire::Dtype::kFloat32;
    l.skips = l.skips || p.update == UpdateRule::kOptimizerRank0;
  }
  return l;
}

// Parameter and state arrays are cache-line aligned and padded to whole
// lines; from kHugePage up they are whole 2 MB pages (see zeroed() below).
using sched::kHugePage;
uint64_t page_rounded(uint64_t bytes) {
  return bytes >= kHugePage ? (bytes + kHugePage - 1) / kHugePage * kHugePage : bytes;
}
uint64_t float_array_bytes(uint64_t elements) {
  return page_rounded(std::max<uint64_t>(64, (elements * 4 + 63) / 64 * 64));
}

// An array of `bytes` (page_rounded), 64-byte aligned; from 2 MB up it is
// asked for transparent huge pages: the reduction walks parameters at
// memory speed, and with 4 KB pages every 3rd chunk would start with a TLB
// miss. A hint only; refused is fine. Zeroed only when asked: untouched
// pages cost nothing until first written.
void* allocate_array(uint64_t bytes, bool zero) {
  void* p = sched::allocate_huge_hinted(bytes, 64);
  if (zero) std::memset(p, 0, bytes);
  return p;
}

uint64_t staging_stride(uint32_t chunk_bytes) { return (uint64_t{chunk_bytes} + 63) / 64 * 64; }

// A half-precision chunk's float32 sum (chunk_bytes / 2 floats), then every
// element's rounded update (2 B each, indexed as the parameters: a chunk's
// update stays readable until its next one, since the server sends it by
// reference and may send it again), each on whole cache lines.
uint64_t half_sum_bytes(uint32_t chunk_bytes) { return staging_stride(2 * chunk_bytes); }
uint64_t half_scratch_bytes(uint32_t chunk_bytes, uint64_t elements) {
  return half_sum_bytes(chunk_bytes) + (2 * elements + 63) / 64 * 64;
}

// The staging array, then its free-list indices.
uint64_t staging_array_bytes(uint64_t chunks, uint32_t chunk_bytes) {
  return chunks == 0 ? 0 : page_rounded(chunks * staging_stride(chunk_bytes));
}
uint64_t staging_bytes(uint64_t chunks, uint32_t chunk_bytes) {
  return staging_array_bytes(chunks, chunk_bytes) + chunks * sizeof(uint32_t);
}

// BSP changes settings from a version; the others from each chunk's next update.
SettingsMode settings_mode(const SyncPolicy* policy) {
  return dynamic_cast<const BspPolicy*>(policy) != nullptr ? SettingsMode::kFromVersion
                                                           : SettingsMode::kNextUpdate;
}

}  // namespace

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kHeld:
      return "held";
    case Outcome::kCopied:
      return "copied";
    case Outcome::kApplied:
      return "applied";
    case Outcome::kInitialized:
      return "initialized";
    case Outcome::kBadRank:
      return "bad_rank";
    case Outcome::kUnknownKey:
      return "unknown_key";
    case Outcome::kNotOwned:
      return "not_owned";
    case Outcome::kBadOffset:
      return "bad_offset";
    case Outcome::kBadLength:
      return "bad_length";
    case Outcome::kDuplicate:
      return "duplicate";
    case Outcome::kStale:
      return "stale";
    case Outcome::kFuture:
      return "future";
    case Outcome::kHoldLimit:
      return "hold_limit";
  }
  return "?";
}

uint64_t ChunkTableCounters::rejected() const {
  uint64_t n = 0;
  for (size_t i = static_cast<size_t>(Outcome::kBadRank); i < kOutcomeCount; ++i) n += outcomes[i];
  return n;
}

void ChunkTable::FreeDeleter::operator()(float* p) const { std::free(p); }

uint64_t ChunkTable::base_memory(const Placement& placement, const ShardConfig& config,
                                 const SyncPolicy& policy) {
  if (config.chunk_bytes < 4 || config.chunk_bytes > 65532 || config.chunk_bytes % 4 != 0) {
    throw std::invalid_argument("chunk table: chunk_bytes " + std::to_string(config.chunk_bytes) +
                                " is not a multiple of 4 in [4, 65532]");
  }
  const Layout l = layout_of(placement, config);
  const uint64_t arrays = 1 + state_floats_per_element(config.optimizer.kind);
  return arrays * float_array_bytes(l.elements) + l.chunks * sizeof(Chunk) +
         l.chunks * config.workers * sizeof(Held) +
         (policy.tracks_rank_iterations() ? l.chunks * config.workers * sizeof(uint32_t) : 0) +
         placement.blocks().size() * sizeof(KeyEntry) + l.blocks * sizeof(LocalBlock) +
         (l.half ? half_scratch_bytes(config.chunk_bytes, l.elements) : 0) +
         (l.skips ? l.chunks * sizeof(uint32_t) : 0);
}

uint64_t ChunkTable::staging_for(const Placement& placement, const ShardConfig& config,
                                 const SyncPolicy& policy) {
  if (config.staging_chunks == 0 || config.workers == 0) return 0;
  const uint32_t quorum = policy.quorum(config.workers);
  const uint64_t most = std::min<uint64_t>(
      layout_of(placement, config).chunks * (quorum > 0 ? quorum - 1 : 0), UINT32_MAX);
  if (config.staging_chunks != kStagingMost) return std::min(config.staging_chunks, most);
  const uint64_t base = base_memory(placement, config, policy);
  if (base >= config.memory_limit_bytes) return 0;
  const uint64_t room = config.memory_limit_bytes - base;
  if (staging_bytes(most, config.chunk_bytes) <= room) return most;
  // Trimmed: whole stride plus index per chunk, less a huge page of rounding.
  const uint64_t per = staging_stride(config.chunk_bytes) + sizeof(uint32_t);
  return room > kHugePage ? (room - kHugePage) / per : 0;
}

uint64_t ChunkTable::memory_needed(const Placement& placement, const ShardConfig& config,
                                   const SyncPolicy& policy) {
  return base_memory(placement, config, policy) +
         staging_bytes(staging_for(placement, config, policy), config.chunk_bytes);
}

ChunkTable::ChunkTable(const Placement& placement, const ShardConfig& config,
                       std::unique_ptr<SyncPolicy> policy, ChunkSink& sink)
    : sink_(sink),
      policy_(std::move(policy)),
      workers_(config.workers),
      chunk_bytes_(config.chunk_bytes),
      div_magic_(config.chunk_bytes == 0 ? 0 : UINT64_MAX / config.chunk_bytes + 1),
      optimizer_(config.optimizer, settings_mode(policy_.get())),
      simd_(resolve_simd(config.simd)) {
  if (!policy_) throw std::invalid_argument("chunk table: no sync policy");
  if (config.workers == 0 || config.workers > kMaxWorkers) {
    throw std::invalid_argument("chunk table: workers must be 1.." + std::to_string(kMaxWorkers) +
                                ", got " + std::to_string(config.workers));
  }
  if (config.shard >= placement.shards()) {
    throw std::invalid_argument("chunk table: shard " + std::to_string(config.shard) +
                                " is not in a placement of " + std::to_string(placement.shards()) +
                                " shards");
  }
  if (!simd_available(config.simd)) {
    throw std::invalid_argument("chunk table: SIMD kernel '" + std::string(simd_name(config.simd)) +
                                "' is not compiled in");
  }
  const uint64_t need = memory_needed(placement, config, *policy_);
  if (need > config.memory_limit_bytes) {
    throw std::length_error("chunk table: shard " + std::to_string(config.shard) + " needs " +
                            std::to_string(need) + " bytes, over memory_limit_bytes " +
                            std::to_string(config.memory_limit_bytes));
  }
  quorum_ = policy_->quorum(workers_);
  if (quorum_ == 0 || quorum_ > workers_) {
    throw std::invalid_argument("chunk table: policy quorum out of 1..workers");
  }
  track_ranks_ = policy_->tracks_rank_iterations();
  bsp_ = dynamic_cast<const BspPolicy*>(policy_.get()) != nullptr;
  state_arrays_ = state_floats_per_element(optimizer_.kind());

  const Layout l = layout_of(placement, config);
  keys_.assign(placement.blocks().size(), KeyEntry{});
  local_.reserve(l.blocks);
  chunks_.reserve(l.chunks);
  uint64_t element = 0;
  for (const Block& p : placement.blocks()) {
    if (p.shard != config.shard) continue;
    keys_[p.key] =
        KeyEntry{.first_chunk = static_cast<uint32_t>(chunks_.size()),
                 .bytes = static_cast<uint32_t>(p.bytes()),
                 .local = static_cast<int32_t>(local_.size()),
                 .shift = static_cast<uint32_t>(std::countr_zero(wire::element_bytes(p.dtype)))};
    local_.push_back(LocalBlock{.key = p.key,
                                .first_chunk = static_cast<uint32_t>(chunks_.size()),
                                .first_element = element,
                                .elements = p.elements,
                                .priority = p.priority,
                                .update = p.update,
                                .dtype = p.dtype});
    const uint32_t per_chunk = chunk_elements(chunk_bytes_, p.dtype);
    for (uint64_t e = 0; e < p.elements; e += per_chunk) {
      Chunk c;
      c.first_element = element + e;
      c.block = static_cast<uint32_t>(local_.size() - 1);
      c.elements = static_cast<uint16_t>(std::min<uint64_t>(per_chunk, p.elements - e));
      c.dtype = p.dtype;
      chunks_.push_back(c);
    }
    element += p.elements;
  }
  if (l.half) {
    for (const wire::Dtype d : {wire::Dtype::kBFloat16, wire::Dtype::kFloat16}) {
      half_[static_cast<size_t>(d)] = &half_kernels(d, simd_ == Simd::kPortable);
    }
    half_scratch_.reset(
        static_cast<float*>(allocate_array(half_scratch_bytes(chunk_bytes_, element), false)));
    half_sum_ = half_scratch_.get();
    half_out_ = reinterpret_cast<std::byte*>(half_scratch_.get()) + half_sum_bytes(chunk_bytes_);
  }
  elements_ = element;
  slots_.assign(chunks_.size() * workers_, Held{nullptr, nullptr});
  if (track_ranks_) next_clock_.assign(chunks_.size() * workers_, 0);
  if (l.skips) skipped_.assign(chunks_.size(), 0);

  auto zeroed = [](uint64_t elements) {
    return std::unique_ptr<float[], FreeDeleter>(
        static_cast<float*>(allocate_array(float_array_bytes(elements), true)));
  };
  params_ = zeroed(elements_);
  if (state_arrays_ >= 1) state0_ = zeroed(elements_);
  if (state_arrays_ >= 2) state1_ = zeroed(elements_);

  const uint64_t most = chunks_.size() * (quorum_ - 1);
  max_held_ = config.max_held == 0 ? most : std::min(config.max_held, most);

  staging_capacity_ = staging_for(placement, config, *policy_);
  if (staging_capacity_ != 0) {
    // Not zeroed: a staging chunk is always written before it is read, so
    // its pages are touched only when a copy first needs them.
    staging_.reset(static_cast<float*>(
        allocate_array(staging_array_bytes(staging_capacity_, chunk_bytes_), false)));
    // Popped from the back: chunk 0 first, so reuse stays in the chunks already touched.
    staging_free_.resize(staging_capacity_);
    for (uint64_t i = 0; i < staging_capacity_; ++i) {
      staging_free_[i] = static_cast<uint32_t>(staging_capacity_ - 1 - i);
    }
  }
}

ChunkTable::~ChunkTable() {
  for (uint64_t i = 0; i < chunks_.size(); ++i) {
    for (uint64_t have = chunks_[i].have; have != 0; have &= have - 1) {
      void* const* token = &slots_[i * workers_ + std::countr_zero(have)].token;
      if (*token != staged_token()) sink_.release(token, 1);
    }
  }
}

uint64_t ChunkTable::memory_bytes() const {
  return (1 + state_arrays_) * float_array_bytes(elements_) + chunks_.size() * sizeof(Chunk) +
         slots_.size() * sizeof(Held) + next_clock_.size() * sizeof(uint32_t) +
         keys_.size() * sizeof(KeyEntry) + local_.size() * sizeof(LocalBlock) +
         staging_bytes(staging_capacity_, chunk_bytes_) +
         (half_scratch_ ? half_scratch_bytes(chunk_bytes_, elements_) : 0) +
         skipped_.size() * sizeof(uint32_t);
}

Outcome ChunkTable::locate(uint32_t key, uint32_t offset, uint32_t bytes, uint64_t& chunk) const {
  if (key >= keys_.size()) return Outcome::kUnknownKey;
  const KeyEntry& k = keys_[key];
  if (k.bytes == 0) return Outcome::kNotOwned;
  // offset % chunk_bytes and offset / chunk_bytes without a division
  // instruction (Lemire, Kaser, Kurz 2019: exact for every 32-bit offset with
  // magic = ceil(2^64 / chunk_bytes)); a divide was the costliest step here.
  if (uint64_t{offset} * div_magic_ > div_magic_ - 1 || offset >= k.bytes) {
    return Outcome::kBadOffset;
  }
  chunk = k.first_chunk +
          static_cast<uint64_t>((static_cast<unsigned __int128>(div_magic_) * offset) >> 64);
  if (bytes != uint32_t{chunks_[chunk].elements} << k.shift) return Outcome::kBadLength;
  return Outcome::kHeld;
}

Outcome ChunkTable::locate_contribution(const Contribution& c, uint64_t& index) const {
  if (c.rank >= workers_) return Outcome::kBadRank;
  return locate(c.key, c.offset, c.bytes, index);
}

Outcome ChunkTable::contribute(const Contribution& c) {
  uint64_t index = 0;
  Outcome o = locate_contribution(c, index);
  if (o == Outcome::kHeld) {
    // A message's packets mostly arrive in offset order: warm the next
    // chunk's record and this rank's slot in it (tables larger than L2 miss
    // on them otherwise, one dependent miss per chunk).
    if (index + 1 < chunks_.size()) {
      __builtin_prefetch(&chunks_[index + 1], 1);
      __builtin_prefetch(&slots_[(index + 1) * workers_ + c.rank], 1);
    }
    o = record(c, index);
  }
  ++counters_.outcomes[static_cast<size_t>(o)];
  return o;
}

Outcome ChunkTable::record(const Contribution& c, uint64_t index) {
  Chunk& ch = chunks_[index];
  const uint64_t bit = uint64_t{1} << c.rank;
  uint32_t* next = track_ranks_ ? &next_clock_[index * workers_ + c.rank] : nullptr;
  // A replay of a push this rank already gave (its clock is behind) is a
  // duplicate, but for a joined rank's first push of the chunk, which sets
  // its clock (join_rank); then the policy judges the iteration; a second
  // copy for the current set is a duplicate too (in BSP the bit can only be
  // set for the current version).
  if (next != nullptr && serial_diff(c.clock, *next) < 0 &&
      (joined_.empty() || (joined_[index] & bit) == 0)) {
    return Outcome::kDuplicate;
  }
  const Admission a = bsp_ ? BspPolicy::admit_bsp(ch.version, c.iteration)
                           : policy_->admit(ch.version, c.iteration);
  if (a != Admission::kAccept) return a == Admission::kStale ? Outcome::kStale : Outcome::kFuture;
  if ((ch.have & bit) != 0) return Outcome::kDuplicate;
  // Under BSP a removed rank (remove_rank) counts as in: the set needs the
  // ranks still in the job, and keeps what a removed rank gave before.
  const bool completes =
      static_cast<uint32_t>(std::popcount(ch.have | bit | removed_bsp_)) >= quorum_;
  const bool stage = !completes && c.copy && !staging_free_.empty();
  if (!completes && !stage && held_ >= max_held_) return Outcome::kHoldLimit;
  if (next != nullptr) {
    *next = c.clock + 1;
    if (!joined_.empty()) joined_[index] &= ~bit;
  }
  if (ch.have == 0 && quorum_ > 1) {
    // First contribution of a set: start pulling the chunk's parameters into
    // L2 now, so the reduction at the set's last arrival does not wait for
    // them (+7% on agg_bench). The workers push the same tensor at about the
    // same time, so the lines are normally still there; if not, they are
    // simply read again.
    const auto* p = reinterpret_cast<const char*>(params_.get() + ch.first_element);
    for (uint32_t b = 0; b < uint32_t{ch.elements} * kElementBytes; b += 64) {
      __builtin_prefetch(p + b, 0, 2);
    }
  }
  if (ch.have == 0 || serial_diff(c.iteration, ch.oldest) < 0) ch.oldest = c.iteration;
  ch.have |= bit;
  Held& slot = slots_[index * workers_ + c.rank];
  if (!completes && c.copy) {
    if (stage) {
      auto* dst = reinterpret_cast<std::byte*>(staging_.get()) +
                  uint64_t{staging_free_.back()} * staging_stride(chunk_bytes_);
      staging_free_.pop_back();
      std::memcpy(dst, c.data, c.bytes);
      slot = Held{dst, staged_token()};
      return Outcome::kCopied;
    }
    ++counters_.staging_full;
  }
  slot = Held{c.data, c.token};
  ++held_;
  if (!completes) return Outcome::kHeld;
  complete(index);
  return Outcome::kApplied;
}

void ChunkTable::complete(uint64_t index) {
  Chunk& ch = chunks_[index];
  const Held* slots = &slots_[index * workers_];
  std::array<const std::byte*, kMaxWorkers> src;
  std::array<void*, kMaxWorkers> tokens;
  uint32_t n = 0;
  uint32_t buffers = 0;
  const uint64_t contributors = ch.have;
  const auto staging_base = reinterpret_cast<uintptr_t>(staging_.get());
  // Ascending bit order is rank order: the reduction does not depend on arrival.
  for (uint64_t have = ch.have; have != 0; have &= have - 1) {
    const Held& h = slots[std::countr_zero(have)];
    src[n++] = h.data;
    if (h.token != staged_token()) {
      tokens[buffers++] = h.token;
    } else {
      // Its chunk is free again; nothing takes it before the reduction below.
      staging_free_.push_back(static_cast<uint32_t>(
          (reinterpret_cast<uintptr_t>(h.data) - staging_base) / staging_stride(chunk_bytes_)));
      ++staging_released_;
    }
  }
  const uint32_t staleness = static_cast<uint32_t>(serial_diff(ch.version, ch.oldest));
  const uint64_t e = ch.first_element;
  switch (local_[ch.block].update) {
    case UpdateRule::kOptimizer: {
      // The update of version v uses the settings in effect at v; Adam's t
      // is the chunk's update number.
      const StepParams& step = optimizer_.step_for(ch.version, n, uint64_t{ch.version} + 1,
                                                   policy_->lr_scale(staleness));
      float* s0 = state0_ ? state0_.get() + e : nullptr;
      float* s1 = state1_ ? state1_.get() + e : nullptr;
      if (ch.dtype == wire::Dtype::kFloat32) [[likely]] {
        reduce_apply(optimizer_.kind(), simd_, src.data(), n, ch.elements, params_.get() + e, s0,
                     s1, step);
      } else {
        reduce_half(ch, src.data(), n, optimizer_.kind(), s0, s1, step);
      }
      break;
    }
    case UpdateRule::kAverage: {
      StepParams average;
      average.inv_n = 1.0f / static_cast<float>(n);
      if (ch.dtype == wire::Dtype::kFloat32) {
        reduce_apply(OptimizerKind::kSumOnly, simd_, src.data(), n, ch.elements, params_.get() + e,
                     nullptr, nullptr, average);
      } else {
        reduce_half(ch, src.data(), n, OptimizerKind::kSumOnly, nullptr, nullptr, average);
      }
      break;
    }
    case UpdateRule::kOptimizerRank0:
      if ((contributors & 1) != 0) {  // rank 0's is the first, in rank order
        // Every rank pushes the same final gradient (each averaged, unscaled and
        // clipped alike): a set where another rank's differs is counted, as a rank
        // whose step diverged (only rank 0's is applied).
        const uint64_t bytes = uint64_t{ch.elements} * wire::element_bytes(ch.dtype);
        for (uint32_t r = 1; r < n; ++r) {
          if (std::memcmp(src[r], src[0], bytes) != 0) {
            ++counters_.rank0_differ;
            break;
          }
        }
        if (skips_step(src[0], ch.dtype)) {
          ++skipped_[index];  // the values stay; the version moves on
          ++counters_.steps_skipped;
          break;
        }
        // Its gradient as pushed (x 1/1, exact); Adam's t counts the steps taken.
        const StepParams& step =
            optimizer_.step_for(ch.version, 1, uint64_t{ch.version} - skipped_[index] + 1,
                                policy_->lr_scale(staleness));
        float* s0 = state0_ ? state0_.get() + e : nullptr;
        float* s1 = state1_ ? state1_.get() + e : nullptr;
        if (ch.dtype == wire::Dtype::kFloat32) {
          reduce_apply(optimizer_.kind(), simd_, src.data(), 1, ch.elements, params_.get() + e, s0,
                       s1, step);
        } else {
          reduce_half(ch, src.data(), 1, optimizer_.kind(), s0, s1, step);
        }
      }
      break;
    case UpdateRule::kRank0:
      if ((contributors & 1) != 0) {  // rank 0's is the first, in rank order
        if (ch.dtype == wire::Dtype::kFloat32) {
          std::memcpy(params_.get() + e, src[0], uint64_t{ch.elements} * kElementBytes);
        } else {  // widened exactly
          half_[static_cast<size_t>(ch.dtype)]->widen_sum(src.data(), 1, ch.elements,
                                                          params_.get() + e);
        }
      }
      break;
  }
  if (buffers != 0) sink_.release(tokens.data(), buffers);
  held_ -= buffers;
  ch.have = 0;
  ++ch.version;
  ++counters_.updates;
  counters_.gradient_bytes += uint64_t{n} * ch.elements * wire::element_bytes(ch.dtype);
  emit(index, contributors, staleness);
}

void ChunkTable::reduce_half(const Chunk& ch, const std::byte* const* src, uint32_t n,
                             OptimizerKind kind, float* state0, float* state1,
                             const StepParams& step) {
  // Rank order into float32 first; then the float32 kernel over that one
  // sum, scaled by the set's 1/n (step): g = ((w0 + w1) + ...) x (1/n), the
  // float32 path's very operations. Every line of the set is asked for
  // first, as the float32 kernel does for its own.
  const uint64_t bytes = uint64_t{ch.elements} * 2;
  for (uint32_t r = 0; r < n; ++r) {
    for (uint64_t b = 0; b < bytes; b += 64) __builtin_prefetch(src[r] + b, 0, 3);
  }
  half_[static_cast<size_t>(ch.dtype)]->widen_sum(src, n, ch.elements, half_sum_);
  const auto* sum = reinterpret_cast<const std::byte*>(half_sum_);
  reduce_apply(kind, simd_, &sum, 1, ch.elements, params_.get() + ch.first_element, state0, state1,
               step);
}

const std::byte* ChunkTable::narrow_half(const Chunk& ch) {
  // The one rounding of this version into the workers' dtype, into the
  // chunk's own place: the fan-out sends it by reference.
  std::byte* out = half_out_ + 2 * ch.first_element;
  half_[static_cast<size_t>(ch.dtype)]->narrow(params_.get() + ch.first_element, ch.elements, out);
  return out;
}

uint32_t ChunkTable::slowest_clock(uint64_t index) const {
  if (!track_ranks_) return 0;
  const uint32_t* next = &next_clock_[index * workers_];
  if (removed_ == 0) {
    uint32_t slowest = next[0];
    for (uint32_t r = 1; r < workers_; ++r) {
      if (serial_diff(next[r], slowest) < 0) slowest = next[r];
    }
    return slowest;
  }
  // Some rank left the job: the least over those still in it (with none
  // left, the fastest's, so that nothing waits).
  bool any = false;
  uint32_t slowest = 0, fastest = next[0];
  for (uint32_t r = 0; r < workers_; ++r) {
    if (serial_diff(next[r], fastest) > 0) fastest = next[r];
    if ((removed_ >> r & 1) != 0) continue;
    if (!any || serial_diff(next[r], slowest) < 0) slowest = next[r];
    any = true;
  }
  return any ? slowest : fastest;
}

std::span<const uint32_t> ChunkTable::clocks(uint64_t index) const {
  if (!track_ranks_ || index >= chunks_.size()) return {};
  return {&next_clock_[index * workers_], workers_};
}

void ChunkTable::remove_rank(uint32_t rank) {
  if (rank >= workers_) return;
  const uint64_t bit = uint64_t{1} << rank;
  if (track_ranks_) {
    removed_ |= bit;
    return;
  }
  if ((removed_ & bit) != 0) return;
  removed_ |= bit;
  removed_bsp_ |= bit;
  // BSP: the sets that now hold every rank still in the job complete, over
  // the contributions they hold (the removed rank's among them if it gave
  // one). A set of no contribution waits for its first.
  if (static_cast<uint32_t>(std::popcount(removed_bsp_)) >= workers_) return;
  for (uint64_t index = 0; index < chunks_.size(); ++index) {
    const uint64_t have = chunks_[index].have;
    if (have != 0 && static_cast<uint32_t>(std::popcount(have | removed_bsp_)) >= quorum_) {
      complete(index);
    }
  }
}

void ChunkTable::join_rank(uint32_t rank) {
  if (!track_ranks_ || rank >= workers_ || (removed_ >> rank & 1) == 0) return;
  if (joined_.empty()) joined_.assign(chunks_.size(), 0);
  const uint64_t bit = uint64_t{1} << rank;
  for (uint64_t index = 0; index < chunks_.size(); ++index) {
    // Without the rank: it is removed.
    next_clock_[index * workers_ + rank] = slowest_clock(index);
    joined_[index] |= bit;
  }
  removed_ &= ~bit;
}

void ChunkTable::emit(uint64_t index, uint64_t contributors, uint32_t staleness) {
  const Chunk& ch = chunks_[index];
  const LocalBlock& p = local_[ch.block];
  const std::byte* data = ch.dtype == wire::Dtype::kFloat32
                              ? reinterpret_cast<const std::byte*>(params_.get() + ch.first_element)
                              : narrow_half(ch);
  sink_.on_update(Update{
      .key = p.key,
      .offset = static_cast<uint32_t>((index - p.first_chunk) * chunk_bytes_),
      .version = ch.version,
      .priority = p.priority,
      .staleness = staleness,
      .contributors = contributors,
      .slowest = slowest_clock(index),
      .clock = track_ranks_ && contributors != 0
                   ? next_clock_[index * workers_ + std::countr_zero(contributors)]
                   : 0,
      .clocks = track_ranks_ ? &next_clock_[index * workers_] : nullptr,
      .data = data,
      .bytes = uint32_t{ch.elements} * wire::element_bytes(ch.dtype),
      .dtype = ch.dtype,
  });
}

Outcome ChunkTable::adopt(uint64_t index, const std::byte* data, bool master) {
  Chunk& ch = chunks_[index];
  if (ch.version != 0) return Outcome::kStale;
  if (ch.initialized) return Outcome::kDuplicate;
  float* params = params_.get() + ch.first_element;
  if (master || ch.dtype == wire::Dtype::kFloat32) {
    std::memcpy(params, data, uint64_t{ch.elements} * kElementBytes);
  } else {
    half_[static_cast<size_t>(ch.dtype)]->widen_sum(&data, 1, ch.elements, params);
  }
  ch.initialized = 1;
  emit(index, 0, 0);
  return Outcome::kInitialized;
}

Outcome ChunkTable::initialize(uint32_t key, uint32_t offset, const std::byte* data,
                               uint32_t bytes) {
  uint64_t index = 0;
  Outcome o = locate(key, offset, bytes, index);
  if (o == Outcome::kHeld) o = adopt(index, data, false);
  ++counters_.outcomes[static_cast<size_t>(o)];
  return o;
}

void ChunkTable::initialize_block(uint32_t key, std::span<const float> values) {
  if (key >= keys_.size() || keys_[key].local < 0) {
    throw std::invalid_argument("chunk table: block " + std::to_string(key) +
                                " is not owned by this shard");
  }
  const LocalBlock& p = local_[static_cast<uint32_t>(keys_[key].local)];
  if (values.size() != p.elements) {
    throw std::invalid_argument("chunk table: block " + std::to_string(key) + " has " +
                                std::to_string(p.elements) + " elements, given " +
                                std::to_string(values.size()));
  }
  const uint32_t per_chunk = chunk_elements(chunk_bytes_, p.dtype);
  for (uint32_t c = 0; uint64_t{c} * per_chunk < p.elements; ++c) {
    const auto* master =
        reinterpret_cast<const std::byte*>(values.data() + uint64_t{c} * per_chunk);
    ++counters_.outcomes[static_cast<size_t>(adopt(p.first_chunk + c, master, true))];
  }
}

uint64_t ChunkTable::held_ranks(uint32_t key, uint32_t offset) const {
  uint64_t index = 0;
  const Outcome o = locate(key, offset, 0, index);
  if (o != Outcome::kHeld && o != Outcome::kBadLength) return 0;
  return chunks_[index].have;
}

uint32_t ChunkTable::slowest(uint32_t key, uint32_t offset) const {
  uint64_t index = 0;
  const Outcome o = locate(key, offset, 0, index);
  if (o != Outcome::kHeld && o != Outcome::kBadLength) return 0;
  return slowest_clock(index);
}

std::span<const float> ChunkTable::parameters(uint32_t key) const {
  if (key >= keys_.size() || keys_[key].local < 0) return {};
  const LocalBlock& p = local_[static_cast<uint32_t>(keys_[key].local)];
  return {params_.get() + p.first_element, p.elements};
}

std::span<const std::byte> ChunkTable::wire_values(uint32_t key) const {
  if (key >= keys_.size() || keys_[key].local < 0) return {};
  const LocalBlock& p = local_[static_cast<uint32_t>(keys_[key].local)];
  if (p.dtype == wire::Dtype::kFloat32) {
    return {reinterpret_cast<const std::byte*>(params_.get() + p.first_element),
            p.elements * kElementBytes};
  }
  return {half_out_ + 2 * p.first_element, p.elements * 2};
}

std::pair<uint32_t, uint32_t> ChunkTable::version_range() const {
  if (chunks_.empty()) return {0, 0};
  uint32_t lowest = chunks_[0].version;
  uint32_t highest = lowest;
  for (const Chunk& c : chunks_) {
    if (serial_diff(c.version, lowest) < 0) lowest = c.version;
    if (serial_diff(c.version, highest) > 0) highest = c.version;
  }
  return {lowest, highest};
}

ChunkTable::ChunkView ChunkTable::chunk_view(uint64_t index) const {
  const Chunk& ch = chunks_[index];
  const LocalBlock& p = local_[ch.block];
  const uint64_t e = ch.first_element;
  auto array = [&](const float* a) {
    return a == nullptr ? std::span<const float>{} : std::span<const float>(a + e, ch.elements);
  };
  return ChunkView{.key = p.key,
                   .offset = static_cast<uint32_t>((index - p.first_chunk) * chunk_bytes_),
                   .version = ch.version,
                   .steps = ch.version - (skipped_.empty() ? 0 : skipped_[index]),
                   .initialized = ch.initialized != 0 || ch.version != 0,
                   .params = array(params_.get()),
                   .state0 = array(state0_.get()),
                   .state1 = array(state1_.get())};
}

Outcome ChunkTable::restore(uint32_t key, uint32_t offset, uint32_t version,
                            std::span<const float> params, std::span<const float> state0,
                            std::span<const float> state1, std::optional<uint32_t> steps) {
  uint64_t index = 0;
  // The chunk's length on the wire: its elements in the block's dtype.
  const uint32_t shift = key < keys_.size() ? keys_[key].shift : 2;
  const uint64_t wire = std::min<uint64_t>(uint64_t{params.size()} << shift, UINT32_MAX);
  Outcome o = locate(key, offset, static_cast<uint32_t>(wire), index);
  if (o == Outcome::kHeld) {
    Chunk& ch = chunks_[index];
    const size_t n = ch.elements;
    const uint32_t taken = steps.value_or(version);
    const bool skipping = local_[ch.block].update == UpdateRule::kOptimizerRank0;
    if (params.size() != n || state0.size() != (state0_ ? n : 0) ||
        state1.size() != (state1_ ? n : 0) || taken > version || (taken != version && !skipping)) {
      o = Outcome::kBadLength;
    } else if (ch.initialized) {
      o = Outcome::kDuplicate;
    } else if (ch.version != 0 || ch.have != 0) {
      o = Outcome::kStale;
    } else {
      const uint64_t e = ch.first_element;
      std::memcpy(params_.get() + e, params.data(), params.size_bytes());
      if (state0_) std::memcpy(state0_.get() + e, state0.data(), state0.size_bytes());
      if (state1_) std::memcpy(state1_.get() + e, state1.data(), state1.size_bytes());
      ch.version = version;
      if (skipping) skipped_[index] = version - taken;
      ch.initialized = 1;
      o = Outcome::kInitialized;
      emit(index, 0, 0);
    }
  }
  ++counters_.outcomes[static_cast<size_t>(o)];
  return o;
}

uint64_t ChunkTable::rewind() {
  const auto staging_base = reinterpret_cast<uintptr_t>(staging_.get());
  uint64_t released = 0;
  for (uint64_t i = 0; i < chunks_.size(); ++i) {
    Chunk& ch = chunks_[i];
    for (uint64_t have = ch.have; have != 0; have &= have - 1) {
      const Held& h = slots_[i * workers_ + std::countr_zero(have)];
      if (h.token != staged_token()) {
        sink_.release(&h.token, 1);
        ++released;
      } else {
        staging_free_.push_back(static_cast<uint32_t>(
            (reinterpret_cast<uintptr_t>(h.data) - staging_base) / staging_stride(chunk_bytes_)));
        ++staging_released_;
      }
    }
    ch.have = 0;
    ch.version = 0;
    ch.oldest = 0;
    ch.initialized = 0;
  }
  held_ -= released;
  return released;
}

int64_t ChunkTable::chunk_index(uint32_t key, uint32_t offset) const {
  uint64_t index = 0;
  const Outcome o = locate(key, offset, 0, index);
  return o == Outcome::kHeld || o == Outcome::kBadLength ? static_cast<int64_t>(index) : -1;
}

Outcome ChunkTable::replicate(uint64_t index, uint32_t version, uint32_t steps,
                              std::span<const float> params, std::span<const float> state0,
                              std::span<const float> state1) {
  if (index >= chunks_.size()) return Outcome::kUnknownKey;
  Chunk& ch = chunks_[index];
  const size_t n = ch.elements;
  const bool skipping = local_[ch.block].update == UpdateRule::kOptimizerRank0;
  if (params.size() != n || state0.size() != (state0_ ? n : 0) ||
      state1.size() != (state1_ ? n : 0) || steps > version || (steps != version && !skipping)) {
    return Outcome::kBadLength;
  }
  const uint64_t e = ch.first_element;
  std::memcpy(params_.get() + e, params.data(), params.size_bytes());
  if (state0_) std::memcpy(state0_.get() + e, state0.data(), state0.size_bytes());
  if (state1_) std::memcpy(state1_.get() + e, state1.data(), state1.size_bytes());
  ch.version = version;
  if (skipping) skipped_[index] = version - steps;
  ch.initialized = 1;
  return Outcome::kInitialized;
}

uint32_t ChunkTable::version(uint32_t key, uint32_t offset) const {
  uint64_t index = 0;
  const Outcome o = locate(key, offset, 0, index);
  // Any length is fine here: only the address is asked about.
  return o == Outcome::kHeld || o == Outcome::kBadLength ? chunks_[index].version : UINT32_MAX;
}

}  // namespace mercury::agg
