// Background checkpoints without a node: a real chunk table whose sink
// snapshots as Shard::on_update does (snapshot.h), the writer's files in a
// real directory (checkpoint.h), read back and restored bit for bit.
#include "server/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "agg/shard_state.h"
#include "agg/sync_policy.h"

namespace mercury::server {
namespace {

constexpr uint32_t kChunkBytes = 1408;
constexpr uint32_t kWorkers = 2;

// The sink a Shard is, reduced to what a checkpoint needs: the snapshot's
// copy before the update would go out, and buffers nobody holds.
class SnapshotSink final : public agg::ChunkSink {
 public:
  ShardSnapshot* snapshot = nullptr;
  void on_update(const agg::Update& u) override {
    // Initial or restored values are no new state (Shard::on_update).
    if (snapshot != nullptr && u.contributors != 0) {
      snapshot->on_update_st(u.key, u.offset, u.version);
    }
  }
  void release(void* const*, uint32_t) override {}
};

agg::ShardConfig shard_config(agg::OptimizerKind kind) {
  return agg::ShardConfig{.shard = 0,
                          .workers = kWorkers,
                          .chunk_bytes = kChunkBytes,
                          .optimizer = {.kind = kind, .learning_rate = 0.1f, .momentum = 0.9f}};
}

std::vector<agg::TensorDecl> model() { return {{"conv", 1000, 0}, {"fc", 900, 1}, {"bias", 7, 2}}; }

// A directory of the test's own, removed with what is in it.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = ::testing::TempDir() + "/mercury-ckpt-XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  [[nodiscard]] bool has(const std::string& name) const {
    struct stat st {};
    return ::stat((path + "/" + name).c_str(), &st) == 0;
  }
};

// One shard of the job with its snapshot: updates are driven version by
// version, every rank's gradient a function of (chunk, rank, version).
class Job {
 public:
  explicit Job(uint32_t every_versions, agg::OptimizerKind kind = agg::OptimizerKind::kMomentum)
      : placement_(agg::Placement::compute(model(), 1)),
        table_(placement_, shard_config(kind), agg::make_bsp(), sink_) {
    plan_.every_versions = every_versions;
    snapshot_ = std::make_unique<ShardSnapshot>(table_, plan_, placement_.fingerprint());
    sink_.snapshot = snapshot_.get();
    for (uint64_t i = 0; i < table_.chunks(); ++i) {
      const agg::ChunkTable::ChunkView v = table_.chunk_view(i);
      std::vector<float> init(v.params.size());
      for (size_t e = 0; e < init.size(); ++e) init[e] = 0.001f * static_cast<float>(e + i);
      EXPECT_EQ(table_.initialize(v.key, v.offset, reinterpret_cast<const std::byte*>(init.data()),
                                  static_cast<uint32_t>(init.size() * 4)),
                agg::Outcome::kInitialized);
    }
  }

  // Every chunk from `first` on (table order) takes its update of iteration
  // version(chunk) (to version + 1).
  void update(uint64_t first = 0, uint64_t end = UINT64_MAX) {
    for (uint64_t i = first; i < std::min<uint64_t>(end, table_.chunks()); ++i) {
      const agg::ChunkTable::ChunkView v = table_.chunk_view(i);
      // The table holds rank 0's buffer until rank 1's completes the set.
      std::vector<std::vector<float>> g(kWorkers, std::vector<float>(v.params.size()));
      for (uint16_t r = 0; r < kWorkers; ++r) {
        for (size_t e = 0; e < g[r].size(); ++e) {
          g[r][e] = 0.01f * static_cast<float>((e * 7 + i * 3 + r * 5 + v.version) % 11) - 0.05f;
        }
      }
      for (uint16_t r = 0; r < kWorkers; ++r) {
        const agg::Outcome o = table_.contribute(
            agg::Contribution{.key = v.key,
                              .offset = v.offset,
                              .iteration = v.version,
                              .rank = r,
                              .data = reinterpret_cast<const std::byte*>(g[r].data()),
                              .bytes = static_cast<uint32_t>(g[r].size() * 4)});
        ASSERT_TRUE(agg::taken(o)) << agg::outcome_name(o);
      }
    }
  }
  // Every chunk's parameters and state, concatenated: the table now.
  [[nodiscard]] std::vector<float> state() const {
    std::vector<float> out;
    for (uint64_t i = 0; i < table_.chunks(); ++i) {
      const agg::ChunkTable::ChunkView v = table_.chunk_view(i);
      out.insert(out.end(), v.params.begin(), v.params.end());
      out.insert(out.end(), v.state0.begin(), v.state0.end());
    }
    return out;
  }
  [[nodiscard]] std::vector<float> snapshot_state() const {
    std::vector<float> out;
    for (uint64_t i = 0; i < snapshot_->chunks(); ++i) {
      const ShardSnapshot::Chunk c = snapshot_->chunk(i);
      out.insert(out.end(), c.params.begin(), c.params.end());
      out.insert(out.end(), c.state0.begin(), c.state0.end());
    }
    return out;
  }

  agg::Placement placement_;
  SnapshotSink sink_;
  agg::ChunkTable table_;
  CheckpointPlan plan_;
  std::unique_ptr<ShardSnapshot> snapshot_;
};

TEST(Snapshot, HoldsEveryChunkAtTheCheckpointVersionWhileTheTableMovesOn) {
  Job job(2);
  ASSERT_GE(job.table_.chunks(), 3u);
  uint32_t version = 0;
  job.update();  // version 1: not a checkpoint version
  EXPECT_FALSE(job.snapshot_->ready(version));
  job.update(0, 2);  // two chunks at version 2, the others at 1
  EXPECT_FALSE(job.snapshot_->ready(version)) << "a snapshot is whole or not ready";
  job.update(2);
  ASSERT_TRUE(job.snapshot_->ready(version));
  EXPECT_EQ(version, 2u);
  const std::vector<float> at2 = job.state();
  EXPECT_EQ(job.snapshot_state(), at2);
  // Version 3 changes the table, not the snapshot.
  job.update(0, 1);
  EXPECT_NE(job.state(), at2);
  EXPECT_EQ(job.snapshot_state(), at2);
  EXPECT_EQ(job.snapshot_->chunk(0).state.version, 2u);
  EXPECT_EQ(job.snapshot_->completed(), 1u);
}

TEST(Snapshot, IsSkippedWhileTheWriterHoldsThePreviousOne) {
  Job job(1);
  job.update();  // version 1: complete
  uint32_t version = 0;
  ASSERT_TRUE(job.snapshot_->ready(version));
  const std::vector<float> at1 = job.state();
  job.update();  // version 2: the writer still has version 1
  EXPECT_EQ(job.snapshot_->skipped(), 1u);
  ASSERT_TRUE(job.snapshot_->ready(version));
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(job.snapshot_state(), at1);
  job.snapshot_->release();
  job.update();  // version 3
  ASSERT_TRUE(job.snapshot_->ready(version));
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(job.snapshot_state(), job.state());
  // Given back while version 4 is under way: the chunks past it are not in
  // a fill started now, so version 4 is skipped, not left half taken.
  job.update(0, 2);
  job.snapshot_->release();
  job.update(2);
  EXPECT_FALSE(job.snapshot_->ready(version));
  EXPECT_EQ(job.snapshot_->skipped(), 2u);
  job.update();  // version 5
  ASSERT_TRUE(job.snapshot_->ready(version));
  EXPECT_EQ(version, 5u);
  EXPECT_EQ(job.snapshot_state(), job.state());
  EXPECT_EQ(job.snapshot_->failed(), 0u);
}

TEST(Snapshot, TimeArmsTheVersionAfterTheNextUpdate) {
  Job job(0);  // no checkpoint by version
  job.update();
  uint32_t version = 0;
  EXPECT_FALSE(job.snapshot_->ready(version));
  job.plan_.due.store(true);
  job.update(0, 1);  // chunk 0 at version 2 takes `due`: version 3 is armed
  EXPECT_EQ(job.plan_.armed.load(), 3u);
  EXPECT_FALSE(job.plan_.due.load());
  // Time is due again before every chunk reached the armed version: it stays.
  job.plan_.due.store(true);
  job.update(1);  // the others at 2
  EXPECT_EQ(job.plan_.armed.load(), 3u);
  EXPECT_FALSE(job.snapshot_->ready(version));
  job.update(0, 1);  // chunk 0 at 3: version 3 armed still
  EXPECT_EQ(job.plan_.armed.load(), 3u);
  job.update(1);  // every chunk at 3
  ASSERT_TRUE(job.snapshot_->ready(version));
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(job.snapshot_state(), job.state());
  job.snapshot_->release();
  job.update(0, 1);  // chunk 0 at 4, past the armed version: the next is armed
  EXPECT_EQ(job.plan_.armed.load(), 5u);
  EXPECT_EQ(job.snapshot_->failed(), 0u);
}

CheckpointWriterOptions writer_options(const TempDir& dir, uint32_t keep = 2) {
  return CheckpointWriterOptions{.dir = dir.path, .node = "s0", .keep = keep};
}

// A job whose one shard checkpoints every version, its writer looking.
struct Writing {
  TempDir dir;
  Job job{1};
  CheckpointSources sources;
  std::optional<CheckpointWriter> writer;
  // `subdir`: where the files go, under dir; `report`: the writer's lines.
  explicit Writing(uint32_t keep = 2, const std::string& subdir = "",
                   std::function<void(const std::string&, bool)> report = {}) {
    sources.snapshots.push_back(std::move(job.snapshot_));
    sources.job = job.placement_.fingerprint();
    sources.running.store(true);
    CheckpointWriterOptions o = writer_options(dir, keep);
    o.dir += subdir;
    o.report = std::move(report);
    writer.emplace(sources, o);
  }
};

TEST(CheckpointFile, IsWrittenReadBackAndRestoredBitForBit) {
  TempDir dir;
  Job job(2);
  CheckpointSources sources;
  sources.snapshots.push_back(std::move(job.snapshot_));
  job.snapshot_.reset();
  ShardSnapshot& snap = *sources.snapshots.front();
  sources.job = job.placement_.fingerprint();
  CheckpointWriter writer(sources, writer_options(dir));
  EXPECT_FALSE(writer.poll(0)) << "nothing before the job runs";
  sources.running.store(true);
  job.update();
  job.update();  // version 2
  const std::vector<float> at2 = job.state();
  job.update(0, 1);  // the table moves on before the writer looks
  ASSERT_TRUE(writer.poll(0));
  EXPECT_EQ(writer.counters().written.load(), 1u);
  EXPECT_EQ(writer.counters().last_version.load(), 2u);
  EXPECT_TRUE(dir.has("s0.v0000000002.ckpt"));
  EXPECT_FALSE(dir.has(".s0.v0000000002.ckpt.tmp"));
  uint32_t version = 0;
  EXPECT_FALSE(snap.ready(version)) << "given back to the shard";

  const CheckpointFile f = load_checkpoint(dir.path, "s0");
  EXPECT_EQ(f.version, 2u);
  EXPECT_EQ(f.chunks, job.table_.chunks());
  EXPECT_EQ(f.bytes.size(), writer.counters().bytes.load());
  EXPECT_EQ(checkpoint_fits(f, {.kind = agg::OptimizerKind::kMomentum}, kChunkBytes), "");
  const agg::StateFile checked = agg::check_server_state(f.bytes, job.placement_, 0, 1, kChunkBytes,
                                                         agg::OptimizerKind::kMomentum, false);
  EXPECT_EQ(checked.version, 2u);

  // A new table (a restarted server) restores the file: the state at version 2, exactly.
  SnapshotSink sink;
  agg::ChunkTable fresh(job.placement_, shard_config(agg::OptimizerKind::kMomentum),
                        agg::make_bsp(), sink);
  const std::vector<agg::RecordRef> records = agg::split_records(f.bytes, f.job);
  ASSERT_EQ(agg::restore_records(fresh, f.job, f.version, records), "");
  std::vector<float> restored;
  for (uint64_t i = 0; i < fresh.chunks(); ++i) {
    const agg::ChunkTable::ChunkView v = fresh.chunk_view(i);
    EXPECT_EQ(v.version, 2u);
    restored.insert(restored.end(), v.params.begin(), v.params.end());
    restored.insert(restored.end(), v.state0.begin(), v.state0.end());
  }
  EXPECT_EQ(std::memcmp(restored.data(), at2.data(), at2.size() * 4), 0);
}

TEST(CheckpointFile, KeepsTheNewestAndIgnoresTemporaryFiles) {
  Writing w(2);
  Job& job = w.job;
  const TempDir& dir = w.dir;
  CheckpointWriter& writer = *w.writer;
  for (int v = 1; v <= 3; ++v) {
    job.update();
    ASSERT_TRUE(writer.poll(0));
  }
  EXPECT_FALSE(dir.has("s0.v0000000001.ckpt")) << "pruned: two are kept";
  EXPECT_TRUE(dir.has("s0.v0000000002.ckpt"));
  EXPECT_TRUE(dir.has("s0.v0000000003.ckpt"));
  EXPECT_EQ(checkpoint_versions(dir.path, "s0"), (std::vector<uint32_t>{3, 2}));
  // A writer that died mid-file left a temporary file: never read...
  std::ofstream(dir.path + "/.s0.v0000000004.ckpt.tmp") << "torn";
  // ... nor another node's file.
  std::ofstream(dir.path + "/s1.v0000000009.ckpt") << "not ours";
  EXPECT_EQ(load_checkpoint(dir.path, "s0").version, 3u);
  // ... and the next checkpoint deletes it.
  job.update();
  ASSERT_TRUE(writer.poll(0));
  EXPECT_FALSE(dir.has(".s0.v0000000004.ckpt.tmp"));
  EXPECT_TRUE(dir.has("s0.v0000000004.ckpt"));
  EXPECT_TRUE(dir.has("s1.v0000000009.ckpt"));
  EXPECT_EQ(load_checkpoint(dir.path, "s0", 3).version, 3u);
  try {
    load_checkpoint(dir.path, "s0", 1);
    ADD_FAILURE() << "version 1 was pruned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint of node s0 at version 1 in " + dir.path +
                                         " (it has versions 4, 3;"),
              std::string::npos)
        << e.what();
  }
}

// A running server of several rolls back when another resumed
// (docs/durability.md, "Several servers"): its shard, at version 5 and half
// way to 6 with the snapshot of 6 half filled, is rewound and restored from
// its own file of version 3; the versions after it come again bit for bit,
// and so does the checkpoint of 4.
TEST(CheckpointFile, ARunningShardRollsBackToItsOwnCheckpointBitForBit) {
  Writing w(3);
  Job& job = w.job;
  ShardSnapshot& snap = *w.sources.snapshots.front();
  std::vector<std::vector<float>> at(6);
  for (uint32_t v = 1; v <= 5; ++v) {
    job.update();
    at[v] = job.state();
    ASSERT_TRUE(w.writer->poll(0));
  }
  ASSERT_EQ(checkpoint_versions(w.dir.path, "s0"), (std::vector<uint32_t>{5, 4, 3}));
  const std::vector<std::byte> file4 = load_checkpoint(w.dir.path, "s0", 4).bytes;
  job.update(0, 1);  // chunk 0 at 6: the snapshot of 6 fills
  uint32_t version = 0;
  ASSERT_FALSE(snap.ready(version));

  const CheckpointFile f = load_checkpoint(w.dir.path, "s0", 3);
  snap.rewind_st(3);
  job.table_.rewind();
  ASSERT_EQ(agg::restore_records(job.table_, f.job, 3, agg::split_records(f.bytes, f.job)), "");
  for (uint64_t i = 0; i < job.table_.chunks(); ++i) {
    EXPECT_EQ(job.table_.chunk_view(i).version, 3u);
  }
  EXPECT_EQ(job.state(), at[3]);
  EXPECT_FALSE(snap.ready(version)) << "restored values are not a checkpoint of their own";
  job.update();
  EXPECT_EQ(job.state(), at[4]);
  ASSERT_TRUE(snap.ready(version));
  EXPECT_EQ(version, 4u);
  ASSERT_TRUE(w.writer->poll(0));
  EXPECT_EQ(load_checkpoint(w.dir.path, "s0", 4).bytes, file4);
  job.update();
  EXPECT_EQ(job.state(), at[5]);
  EXPECT_EQ(snap.failed(), 0u);
  EXPECT_EQ(snap.skipped(), 0u);
}

TEST(CheckpointFile, ACorruptOrForeignOneIsRefusedNamingWhy) {
  Writing w;
  const TempDir& dir = w.dir;
  w.job.update();
  ASSERT_TRUE(w.writer->poll(0));
  const std::string path = dir.path + "/s0.v0000000001.ckpt";

  auto refusal = [&] {
    try {
      load_checkpoint(dir.path, "s0");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  // No checkpoint at all.
  TempDir empty;
  try {
    load_checkpoint(empty.path, "s0");
    ADD_FAILURE() << "an empty directory was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint of node s0"), std::string::npos);
  }
  // A flipped byte in a payload: its CRC.
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::vector<char> bad = bytes;
  bad[bad.size() - 5] ^= 0x10;
  std::ofstream(path, std::ios::binary).write(bad.data(), static_cast<std::streamsize>(bad.size()));
  std::string why = refusal();
  EXPECT_NE(why.find("is corrupt"), std::string::npos) << why;
  EXPECT_NE(why.find("payload CRC"), std::string::npos) << why;
  // Cut short: a record that does not split.
  std::ofstream(path, std::ios::binary).write(bytes.data(), 100);
  why = refusal();
  EXPECT_NE(why.find("is corrupt"), std::string::npos) << why;
  // Whole again: another optimizer, another packet size, another model.
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const CheckpointFile f = load_checkpoint(dir.path, "s0");
  why = checkpoint_fits(f, {.kind = agg::OptimizerKind::kAdam}, kChunkBytes);
  EXPECT_NE(why.find("is of optimizer momentum, the job's is adam"), std::string::npos) << why;
  why = checkpoint_fits(f, {.kind = agg::OptimizerKind::kMomentum}, 256);
  EXPECT_NE(why.find("more than the job's packets carry"), std::string::npos) << why;
  const agg::Placement other =
      agg::Placement::compute(std::vector<agg::TensorDecl>{{"conv", 1000, 0}, {"fc", 901, 1}}, 1);
  try {
    agg::check_server_state(f.bytes, other, 0, 1, kChunkBytes, agg::OptimizerKind::kMomentum,
                            false);
    ADD_FAILURE() << "another model's checkpoint was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("another job"), std::string::npos) << e.what();
  }
}

// A bfloat16 or float16 tensor's chunk holds twice a float32 one's elements
// (its float32 masters in the record): such a checkpoint fits the packet
// size; one element more fits no dtype's packet.
TEST(CheckpointFile, AHalfPrecisionChunkFitsItsPacket) {
  CheckpointFile f;
  f.path = "s0.v0000000004.ckpt";
  f.kind = agg::OptimizerKind::kMomentum;
  f.largest_chunk = kChunkBytes / 2;
  EXPECT_EQ(checkpoint_fits(f, {.kind = agg::OptimizerKind::kMomentum}, kChunkBytes), "");
  f.largest_chunk = kChunkBytes / 2 + 1;
  const std::string why = checkpoint_fits(f, {.kind = agg::OptimizerKind::kMomentum}, kChunkBytes);
  EXPECT_NE(why.find("has chunks of 705 elements, more than the job's packets carry (1408 bytes"),
            std::string::npos)
      << why;
}

TEST(CheckpointFile, AFailedWriteIsCountedAndTheJobGoesOn) {
  std::vector<std::string> errors;
  // A directory that is not there.
  Writing w(2, "/gone", [&](const std::string& line, bool error) {
    if (error) errors.push_back(line);
  });
  Job& job = w.job;
  ShardSnapshot& snap = *w.sources.snapshots.front();
  CheckpointWriter& writer = *w.writer;
  job.update();
  ASSERT_TRUE(writer.poll(0));
  EXPECT_EQ(writer.counters().failures.load(), 1u);
  EXPECT_EQ(writer.counters().written.load(), 0u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("failed (the job goes on): cannot create"), std::string::npos)
      << errors[0];
  uint32_t version = 0;
  EXPECT_FALSE(snap.ready(version)) << "given back: the next checkpoint can be taken";
  job.update();
  EXPECT_TRUE(snap.ready(version));
  EXPECT_EQ(version, 2u);
}

TEST(CheckpointFile, WriteCheckpointLeavesNoFileUnderItsNameOnFailure) {
  TempDir dir;
  const std::string why = write_checkpoint(dir.path, "s0", 5, 2, [](const WriteBytes& out) {
    const std::byte b[4]{};
    out(b);
  });
  EXPECT_EQ(why, "");
  EXPECT_TRUE(dir.has("s0.v0000000005.ckpt"));
  ASSERT_EQ(::chmod(dir.path.c_str(), 0500), 0);
  const std::string refused = write_checkpoint(dir.path, "s0", 6, 2, [](const WriteBytes&) {});
  ::chmod(dir.path.c_str(), 0700);
  if (::geteuid() != 0) {  // root writes anywhere
    EXPECT_NE(refused.find("cannot create"), std::string::npos) << refused;
    EXPECT_FALSE(dir.has("s0.v0000000006.ckpt"));
  }
}

}  // namespace
}  // namespace mercury::server
