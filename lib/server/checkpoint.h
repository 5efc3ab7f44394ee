// A server's checkpoint files and the thread that writes them
// (docs/server.md, "Durability").
//
// The file. One per server node per checkpoint, `<dir>/<node>.v<version, 10
// digits>.ckpt`: a state file of docs/agg.md ("A job's state": the
// hyperparameter record, then one chunk record per chunk in key and offset
// order) holding the server's own chunks only, every one at the file's
// version. It is written to `<dir>/.<node>.v<version>.ckpt.tmp`, fsync'd,
// renamed to its name and the directory fsync'd, so a file under its name is
// whole; a temporary file (a writer that died) is never read and is deleted
// by the next checkpoint. The newest `keep` files of the node are kept.
//
// The writer. CheckpointWriter's thread (not a poll-mode lcore; the Runner
// owns it) waits for every shard's snapshot (snapshot.h) to be complete at
// one version, writes the file from them, gives them back, and tells the
// shards when every_s has passed. A failure (a full disk, a directory that
// went away) is counted and reported, and the job goes on; the next
// checkpoint tries again.
//
// Threads: the file functions are pure control path (any thread; they
// allocate, do blocking I/O and throw or return errors). CheckpointWriter:
// construct, start and stop on one thread; its counters from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "agg/optimizer.h"
#include "agg/placement.h"
#include "server/snapshot.h"

namespace mercury::server {

/// `<node>.v<version>.ckpt`, the version in 10 digits.
std::string checkpoint_name(const std::string& node, uint32_t version);

/// Writes `bytes` as `dir`'s checkpoint of `node` at `version` (temporary
/// file, fsync, rename, fsync of the directory), then deletes the node's
/// older checkpoints beyond the newest `keep` and its temporary files.
/// `fill(write)` produces the bytes, calling `write(span)` as often as it
/// likes. Returns "" or why not (the file and the system's reason); a
/// failure leaves no file under the checkpoint's name.
using WriteBytes = std::function<bool(std::span<const std::byte>)>;
std::string write_checkpoint(const std::string& dir, const std::string& node, uint32_t version,
                             uint32_t keep, const std::function<void(const WriteBytes&)>& fill,
                             uint64_t* bytes_written = nullptr);

/// The versions of `node`'s checkpoints in `dir` (complete files only: a
/// temporary file is not one), newest first. Throws std::runtime_error if
/// the directory cannot be read.
std::vector<uint32_t> checkpoint_versions(const std::string& dir, const std::string& node);

/// A checkpoint read back and checked in itself.
struct CheckpointFile {
  std::string path;
  std::vector<std::byte> bytes;
  uint32_t version = 0;
  uint64_t job = 0;  ///< the placement fingerprint its records carry
  agg::OptimizerKind kind = agg::OptimizerKind::kSgd;
  bool decoupled_weight_decay = false;
  uint64_t chunks = 0;
  uint32_t largest_chunk = 0;  ///< elements
};

/// Reads `node`'s newest checkpoint in `dir`, or that of `version` when
/// given, and checks it: every record whole, both CRCs, one job, the
/// hyperparameter record first and alone, every chunk at the version of the
/// file's name. Throws std::runtime_error naming the file and what is wrong
/// ("no checkpoint of node s0 in DIR", "no checkpoint of node s0 at
/// version 30 in DIR (it has versions 50, 40; ...)", "... is corrupt:
/// record 3 (byte 1234): ...").
CheckpointFile load_checkpoint(const std::string& dir, const std::string& node,
                               std::optional<uint32_t> version = std::nullopt);

/// "" when the checkpoint can serve a job with this optimizer and packet
/// size (no chunk longer than a packet of 2-byte elements carries), else
/// what differs (the job's tensors, their dtypes and shards are checked
/// against it once the workers declared them: agg::check_server_state).
std::string checkpoint_fits(const CheckpointFile& f, const agg::OptimizerConfig& optimizer,
                            uint32_t chunk_bytes);

/// What the writer has done (each a counter, relaxed).
struct CheckpointCounters {
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> last_version{0};
  std::atomic<uint64_t> failures{0};
};

struct CheckpointWriterOptions {
  std::string dir;
  std::string node;
  uint32_t keep = 2;
  double every_s = 0;  ///< 0: versions only
  /// One line per checkpoint written, and per failure (`error` true).
  std::function<void(const std::string&, bool error)> report;
};

/// The node's side the writer reads: its plan and, once the job runs, its
/// shards' snapshots (published with a release store; see ServerNode).
struct CheckpointSources {
  CheckpointPlan plan;
  std::vector<std::unique_ptr<ShardSnapshot>> snapshots;
  uint64_t job = 0;
  std::atomic<bool> running{false};  ///< set (release) once `snapshots` is complete
};

class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointSources& sources, CheckpointWriterOptions options);
  ~CheckpointWriter() { stop(); }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Starts the thread.
  void start();
  /// Writes a checkpoint that is complete, then joins the thread.
  void stop();
  [[nodiscard]] const CheckpointCounters& counters() const { return counters_; }

  /// One look (the thread's body, every few milliseconds; tests call it):
  /// writes a checkpoint if every snapshot is complete. Returns whether it
  /// wrote or failed one.
  bool poll(double now_s);

 private:
  void write(uint32_t version);

  CheckpointSources& sources_;
  CheckpointWriterOptions options_;
  CheckpointCounters counters_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  double last_s_ = -1;  // when the last checkpoint was written (or the job was first seen)
  std::vector<std::byte> record_;
};

}  // namespace mercury::server
