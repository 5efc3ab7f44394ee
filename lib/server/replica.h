// A shard's replication to its hot standby (docs/durability.md, "A hot
// standby"): what each side keeps per chunk, as plain structures with no
// I/O, which Shard drives (shard_replica.cpp) and replica_test.cpp checks.
//
// The stream. For every update of a chunk (and its initial or restored
// values) the primary sends the chunk after the update to the standby: its
// float32 parameters and each optimizer state array (momentum's u, Adam's m
// and v), one slice each, as kAggData packets of the chunk's block and
// offset whose param_version is the new version and whose iteration is
// replica_tag(steps, array). Only once the standby's transport has
// acknowledged every one of them does the update go to the workers
// (ReplicaGates), so every version a worker has seen is on the standby.
// The standby keeps the arrays of a version apart until the last is in
// (ReplicaAssembly), then adopts them into its table at once: promoted at
// any moment, it holds each chunk whole at one version.
//
// Why the chunk after and not the averaged gradient: the gradient is one
// array where the chunk after is 1 + the optimizer's state arrays (SGD 1,
// momentum 2, Adam 3), so the gradient is fewer bytes for every optimizer
// but SGD. It is not what is sent because the standby would then have to
// reproduce the primary's arithmetic bit for bit (its kernel, its
// hyperparameter versions, skipped steps) to hold the same parameters; the
// chunk after makes the standby a copy by construction.
//
// Threads: each structure belongs to its shard's thread (the net core: a
// pair's shards run inline). Costs: ReplicaGates 1 B per chunk;
// ReplicaAssembly the shard's parameters and state once more, plus 12 B per
// chunk, allocated by reset() (control path); add() is a copy of one array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace mercury::server {

/// A replica packet's wire iteration: the optimizer steps the chunk has
/// taken (Adam's t counts them; a skipped step moves the version, not the
/// steps) and which array it carries (0 the parameters, 1 and 2 the state).
inline constexpr uint32_t kReplicaArrays = 3;
inline constexpr uint32_t kMaxReplicaSteps = (uint32_t{1} << 30) - 1;
constexpr uint32_t replica_tag(uint32_t steps, uint32_t array) { return steps << 2 | array; }
constexpr uint32_t replica_array(uint32_t tag) { return tag & 3; }
constexpr uint32_t replica_steps(uint32_t tag) { return tag >> 2; }

/// Primary: per chunk, the standby's acknowledgements its update still
/// waits for before it goes to the workers.
class ReplicaGates {
 public:
  /// Control path: `chunks` gates, all open.
  void reset(uint64_t chunks) { waiting_.assign(chunks, 0); }
  /// Chunk `i`'s update waits for `sends` acknowledgements (1..255).
  void arm(uint64_t i, uint32_t sends) { waiting_[i] = static_cast<uint8_t>(sends); }
  /// One of chunk `i`'s sends ended. True when it was the last one its
  /// update waited for: the update goes out now. A settle of an open gate
  /// (released by open_all) is ignored.
  bool settle(uint64_t i) {
    if (waiting_[i] == 0) return false;
    return --waiting_[i] == 0;
  }
  /// The standby is gone: calls f(i) once for every chunk still waiting,
  /// opening its gate (its update goes out unreplicated).
  template <class F>
  uint64_t open_all(F&& f) {
    uint64_t opened = 0;
    for (uint64_t i = 0; i < waiting_.size(); ++i) {
      if (waiting_[i] == 0) continue;
      waiting_[i] = 0;
      ++opened;
      f(i);
    }
    return opened;
  }
  [[nodiscard]] uint32_t waiting(uint64_t i) const { return waiting_[i]; }
  [[nodiscard]] uint64_t chunks() const { return waiting_.size(); }

 private:
  std::vector<uint8_t> waiting_;
};

/// Standby: the arrays of each chunk's newest version, kept apart until
/// every one is in.
class ReplicaAssembly {
 public:
  enum class Verdict : uint8_t {
    kPending,   ///< taken; the version waits for more arrays
    kComplete,  ///< taken, and every array of the version is in: adopt it now
    kStale,     ///< a version the chunk has (or had) already: dropped
    kBad,       ///< an array number or a length the chunk does not have: dropped
  };

  /// Control path: `chunks` chunks of at most `floats` elements, each with
  /// `arrays` arrays (1 + the optimizer's state arrays). Allocates.
  void reset(uint64_t chunks, uint32_t arrays, uint32_t floats) {
    arrays_ = arrays;
    floats_ = floats;
    memory_.assign(chunks * arrays * floats, 0.0f);
    version_.assign(chunks, 0);
    steps_.assign(chunks, 0);
    have_.assign(chunks, 0);
    started_.assign(chunks, 0);
  }

  /// Array `array` of chunk `i` at `version` (its optimizer `steps`):
  /// `bytes`, the chunk's `elements` float32 values (any alignment).
  /// `adopted`: the version the chunk holds, or nothing yet (`has_values`
  /// false). Copies the values.
  Verdict add(uint64_t i, uint32_t version, uint32_t steps, uint32_t array,
              std::span<const std::byte> bytes, uint32_t elements, bool has_values,
              uint32_t adopted) {
    if (array >= arrays_ || bytes.size() != uint64_t{elements} * sizeof(float) ||
        elements > floats_) {
      return Verdict::kBad;
    }
    if (has_values && static_cast<int32_t>(version - adopted) <= 0) return Verdict::kStale;
    if (started_[i] == 0 || version_[i] != version) {
      // A newer version than the one being assembled: under the gate the
      // primary sends a version's arrays only after the previous version's
      // were all acknowledged, so the older one was complete (and adopted).
      version_[i] = version;
      have_[i] = 0;
      started_[i] = 1;
    }
    steps_[i] = steps;
    std::memcpy(at(i, array), bytes.data(), bytes.size());
    have_[i] |= static_cast<uint8_t>(1u << array);
    if (have_[i] != (1u << arrays_) - 1) return Verdict::kPending;
    started_[i] = 0;
    return Verdict::kComplete;
  }

  /// Chunk `i`'s assembled array `array`, `elements` long.
  [[nodiscard]] std::span<const float> array(uint64_t i, uint32_t array, uint32_t elements) const {
    return {at(i, array), elements};
  }
  [[nodiscard]] uint32_t version(uint64_t i) const { return version_[i]; }
  [[nodiscard]] uint32_t steps(uint64_t i) const { return steps_[i]; }
  [[nodiscard]] uint32_t arrays() const { return arrays_; }
  /// Whether chunk `i` has a version partly in (some arrays, not all).
  [[nodiscard]] bool partial(uint64_t i) const { return started_[i] != 0; }

 private:
  [[nodiscard]] float* at(uint64_t i, uint32_t array) {
    return memory_.data() + (i * arrays_ + array) * floats_;
  }
  [[nodiscard]] const float* at(uint64_t i, uint32_t array) const {
    return memory_.data() + (i * arrays_ + array) * floats_;
  }

  uint32_t arrays_ = 1;
  uint32_t floats_ = 0;
  std::vector<float> memory_;
  std::vector<uint32_t> version_, steps_;
  std::vector<uint8_t> have_, started_;
};

}  // namespace mercury::server
