// A shard's snapshot for a checkpoint: every chunk's float32 parameters,
// optimizer state and version at one version, copied without stopping
// aggregation (docs/server.md, "Durability").
//
// What it is for. A background checkpoint must hold every chunk of the
// server at one version while the job goes on. Under BSP a chunk moves from
// version V to V + 1 only once every worker has pulled V of every chunk (a
// gradient of iteration V is computed from all of them), so every chunk's
// version is within one of every other's. The shard therefore copies each
// chunk into the snapshot in its on_update of version V, before the update
// goes out to the workers and so before the chunk can take its next
// update: the snapshot is the state at V, and aggregation never waits.
//
// Which versions (CheckpointPlan, one per server node, shared by its
// shards): every multiple of `every_versions`, which every server of the job
// computes alike without talking; and, with `every_s`, the version after the
// one a shard is updated to once the writer says time is due (`due`): no
// chunk of the job can be at that version yet, since this chunk's update has
// not gone out (the loader allows every_s with one server node only).
//
// Threads. A snapshot's chunks and metadata are written by its shard's
// thread while it fills (kFilling) and read by the checkpoint writer once
// it is complete (kReady, a release store the writer's acquire load pairs
// with); the writer gives it back (kFree, release; the shard's acquire).
// A snapshot still being written when the next checkpoint version comes is
// skipped (counted): the shard never waits for the disk.
//
// Costs. Memory: the shard's parameters and optimizer state once more
// (momentum: 2 x the parameters, Adam: 3 x), 8 B per chunk, the
// hyperparameter record's room (kHyperBytes); reserved when the shards are
// built. Per update: one compare (is this a checkpoint version); per
// checkpoint: one copy of each chunk on its shard's thread (a memcpy of its
// values and state), the hyperparameter record encoded once. No
// allocation, lock or log on the shard's thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/optimizer_state.h"
#include "base/owner.h"

namespace mercury::server {

/// When a server node's shards snapshot (see the file comment).
struct CheckpointPlan {
  uint32_t every_versions = 0;  ///< every multiple (0: none by version)
  /// Set by the writer when every_s has passed; taken by the first shard
  /// updated after it, which arms the next version.
  std::atomic<bool> due{false};
  /// The version armed by time (0: none): release-stored by the shard that
  /// took `due`, acquire-loaded by every shard.
  std::atomic<uint32_t> armed{0};

  /// The shard's thread, per update to `version`: whether the chunk is to be
  /// snapshot at it (arming the next version when time is due).
  [[nodiscard]] bool at_st(uint32_t version) {
    if (version == 0) return false;  // initial values: the job can start from them again
    // Under BSP every chunk is at version - 1 or later: an armed version
    // below `version` has been reached everywhere, so a new one may be armed
    // (arming again sooner would move it under the chunks still to reach it).
    if (due.load(std::memory_order_relaxed) && armed.load(std::memory_order_acquire) < version &&
        due.exchange(false, std::memory_order_acq_rel)) {
      armed.store(version + 1, std::memory_order_release);
    }
    return (every_versions != 0 && version % every_versions == 0) ||
           version == armed.load(std::memory_order_acquire);
  }
};

class ShardSnapshot {
 public:
  /// Room for the hyperparameter record: 64 KiB, 2340 changes of settings.
  static constexpr size_t kHyperBytes = 64 << 10;

  /// Control path, when the shard is built: room for every chunk of `table`
  /// (which must outlive the snapshot). `job`: the placement fingerprint
  /// the records carry. Throws std::bad_alloc.
  ShardSnapshot(const agg::ChunkTable& table, CheckpointPlan& plan, uint64_t job);

  /// The shard's thread, from its on_update, before the fan-out: the chunk
  /// at (key, offset) is now at `version`. Copies it when `version` is a
  /// checkpoint version. Never throws.
  void on_update_st(uint32_t key, uint32_t offset, uint32_t version);

  /// The shard's thread: the shard rolled back to `version` (Shard::
  /// rewind_st). A fill in progress is abandoned (its chunks will reach
  /// its version again); the next fill starts at the first version past
  /// `version`. A snapshot the writer holds is left to it.
  void rewind_st(uint32_t version);

  // ---- the writer's side: any one thread --------------------------------
  /// Whether the snapshot is complete (acquire); its version then.
  [[nodiscard]] bool ready(uint32_t& version) const;
  [[nodiscard]] uint64_t chunks() const { return chunks_.size(); }
  /// Chunk `i` (table order) as it was at the version: for encode_chunk_record.
  struct Chunk {
    agg::ChunkState state;
    std::span<const float> params, state0, state1;
  };
  [[nodiscard]] Chunk chunk(uint64_t i) const;
  /// The hyperparameter record as of the snapshot's completion.
  [[nodiscard]] std::span<const std::byte> hyperparameters() const {
    return {hyper_.get(), hyper_bytes_};
  }
  /// Done with it (release): the shard may fill it again.
  void release();

  /// Counters, any thread (relaxed): snapshots completed; checkpoint
  /// versions skipped because the previous one was still being written, or
  /// failed (a snapshot left incomplete by a version it missed, or
  /// settings too many for kHyperBytes).
  [[nodiscard]] uint64_t completed() const { return completed_.load(std::memory_order_relaxed); }
  [[nodiscard]] uint64_t skipped() const { return skipped_.load(std::memory_order_relaxed); }
  [[nodiscard]] uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }

  /// The shard moves to another thread (its shard core).
  void hand_over() { owner_.hand_over(); }

 private:
  enum State : uint8_t { kFree, kFilling, kReady };
  struct Meta {
    uint64_t first_element;  // in the snapshot's arrays
    uint32_t key;
    uint32_t offset;
    uint32_t elements;
    uint32_t taken;  // the generation that copied it
  };
  void complete_st();

  const agg::ChunkTable& table_;
  CheckpointPlan& plan_;
  uint64_t job_;
  uint32_t chunk_bytes_;
  uint32_t arrays_;                    // optimizer state arrays per element
  std::vector<uint64_t> first_chunk_;  // per block key of the job: its first chunk here, or ~0
  std::vector<Meta> chunks_;
  uint64_t elements_ = 0;
  std::unique_ptr<float[]> params_, state0_, state1_;
  std::unique_ptr<std::byte[]> hyper_;
  uint64_t hyper_bytes_ = 0;
  uint32_t version_ = 0;     // the one filling or ready
  uint32_t generation_ = 0;  // one per fill
  uint64_t taken_ = 0;       // chunks copied in this fill
  uint32_t skipped_version_ = 0;
  uint32_t newest_ = 0;  // the newest version any chunk of the shard was updated to
  std::atomic<uint8_t> state_{kFree};
  std::atomic<uint64_t> completed_{0}, skipped_{0}, failed_{0};
  base::Owner owner_;  // the shard's thread
};

}  // namespace mercury::server
