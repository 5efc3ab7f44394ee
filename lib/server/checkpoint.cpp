#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "agg/shard_state.h"
#include "wire/dtype.h"

namespace mercury::server {

namespace {

std::string error_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string path_of(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string temporary_name(const std::string& node, uint32_t version) {
  std::string name(1, '.');
  name += checkpoint_name(node, version);
  name += ".tmp";
  return name;
}

// A file descriptor, closed once.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

bool write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return true;
}

// The version of `name` if it is one of node's complete checkpoints.
std::optional<uint32_t> version_of(const std::string& name, const std::string& node) {
  const std::string head = node + ".v";
  const std::string tail = ".ckpt";
  if (name.size() != head.size() + 10 + tail.size() || !name.starts_with(head) ||
      !name.ends_with(tail)) {
    return std::nullopt;
  }
  uint64_t v = 0;
  for (size_t i = head.size(); i < head.size() + 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  if (v > UINT32_MAX) return std::nullopt;
  return static_cast<uint32_t>(v);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) throw std::runtime_error("cannot read the directory " + dir + ": " + error_text(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d.get())) names.emplace_back(e->d_name);
  return names;
}

}  // namespace

std::string checkpoint_name(const std::string& node, uint32_t version) {
  char v[16];
  std::snprintf(v, sizeof v, "%010u", version);
  return node + ".v" + v + ".ckpt";
}

std::string write_checkpoint(const std::string& dir, const std::string& node, uint32_t version,
                             uint32_t keep, const std::function<void(const WriteBytes&)>& fill,
                             uint64_t* bytes_written) {
  const std::string tmp = path_of(dir, temporary_name(node, version));
  const std::string final_path = path_of(dir, checkpoint_name(node, version));
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) return "cannot create " + tmp + ": " + error_text(errno);
  uint64_t total = 0;
  int err = 0;
  fill([&](std::span<const std::byte> b) {
    if (err != 0) return false;
    if (!write_all(f.fd, b)) {
      err = errno;
      return false;
    }
    total += b.size();
    return true;
  });
  std::string why;
  if (err != 0) {
    why = "cannot write " + tmp + ": " + error_text(err);
  } else if (::fsync(f.fd) != 0) {
    why = "cannot fsync " + tmp + ": " + error_text(errno);
  } else if (::close(f.release()) != 0) {
    why = "cannot close " + tmp + ": " + error_text(errno);
  } else if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    why = "cannot rename " + tmp + " to " + final_path + ": " + error_text(errno);
  }
  if (!why.empty()) {
    ::unlink(tmp.c_str());
    return why;
  }
  // The rename is durable once the directory is.
  Fd d{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0 || ::fsync(d.fd) != 0) {
    return "cannot fsync the directory " + dir + ": " + error_text(errno);
  }
  if (bytes_written != nullptr) *bytes_written = total;
  // Pruning: the newest `keep` stay; older ones and stray temporary files go.
  std::vector<uint32_t> versions;
  try {
    versions = checkpoint_versions(dir, node);
    std::string stray(1, '.');
    stray += node;
    stray += ".v";
    for (const std::string& name : names_in(dir)) {
      if (name.starts_with(stray) && name.ends_with(".ckpt.tmp")) {
        ::unlink(path_of(dir, name).c_str());
      }
    }
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  for (size_t i = keep; i < versions.size(); ++i) {
    if (::unlink(path_of(dir, checkpoint_name(node, versions[i])).c_str()) != 0 &&
        errno != ENOENT) {
      return "cannot delete the old checkpoint " + checkpoint_name(node, versions[i]) + ": " +
             error_text(errno);
    }
  }
  return "";
}

std::vector<uint32_t> checkpoint_versions(const std::string& dir, const std::string& node) {
  std::vector<uint32_t> versions;
  for (const std::string& name : names_in(dir)) {
    if (const std::optional<uint32_t> v = version_of(name, node)) versions.push_back(*v);
  }
  std::sort(versions.begin(), versions.end(), std::greater<>());
  return versions;
}

CheckpointFile load_checkpoint(const std::string& dir, const std::string& node,
                               std::optional<uint32_t> version) {
  const std::vector<uint32_t> versions = checkpoint_versions(dir, node);
  if (versions.empty()) {
    throw std::runtime_error("no checkpoint of node " + node + " in " + dir + " (no file " + node +
                             ".v<version>.ckpt)");
  }
  if (version && std::find(versions.begin(), versions.end(), *version) == versions.end()) {
    std::string have;
    for (uint32_t v : versions) have += (have.empty() ? "" : ", ") + std::to_string(v);
    throw std::runtime_error("no checkpoint of node " + node + " at version " +
                             std::to_string(*version) + " in " + dir + " (it has version" +
                             (versions.size() == 1 ? " " : "s ") + have +
                             "; checkpoint.keep says how many are kept)");
  }
  CheckpointFile f;
  f.version = version.value_or(versions.front());
  f.path = path_of(dir, checkpoint_name(node, f.version));
  {
    Fd in{::open(f.path.c_str(), O_RDONLY | O_CLOEXEC)};
    struct stat st {};
    if (in.fd < 0 || ::fstat(in.fd, &st) != 0) {
      throw std::runtime_error("cannot read " + f.path + ": " + error_text(errno));
    }
    f.bytes.resize(static_cast<size_t>(st.st_size));
    size_t at = 0;
    while (at < f.bytes.size()) {
      const ssize_t n = ::read(in.fd, f.bytes.data() + at, f.bytes.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("cannot read " + f.path + ": " + error_text(errno));
      at += static_cast<size_t>(n);
    }
  }
  const std::string corrupt = "the checkpoint " + f.path + " is corrupt: ";
  agg::RecordHeader first;
  if (f.bytes.empty()) throw std::runtime_error(corrupt + "it is empty");
  if (const agg::RecordReject r = agg::decode_record_header(f.bytes, first);
      r != agg::RecordReject::kNone) {
    throw std::runtime_error(
        corrupt + "record 0 (byte 0) is refused: " + std::string(agg::record_reject_name(r)));
  }
  f.job = first.job;
  std::vector<agg::RecordRef> records;
  try {
    records = agg::split_records(f.bytes, f.job);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(corrupt + e.what());
  }
  size_t at = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const agg::RecordRef& r = records[i];
    const auto payload = r.bytes.subspan(agg::kStateHeaderBytes);
    if (agg::crc32c(payload) != r.header.payload_crc) {
      throw std::runtime_error(corrupt + "record " + std::to_string(i) + " (byte " +
                               std::to_string(at) + ") fails its payload CRC");
    }
    at += r.bytes.size();
    const bool hyper = r.header.type == agg::RecordType::kHyperparameters;
    if (hyper != (i == 0)) {
      throw std::runtime_error(corrupt + "record " + std::to_string(i) +
                               (hyper ? " is a second hyperparameter record"
                                      : " is a chunk where the hyperparameter record should be"));
    }
    if (hyper) continue;
    if (r.header.version != f.version || r.header.steps != f.version) {
      throw std::runtime_error(corrupt + "the chunk at byte " + std::to_string(r.header.offset) +
                               " of block " + std::to_string(r.header.key) + " is at version " +
                               std::to_string(r.header.version) + ", the file's is " +
                               std::to_string(f.version));
    }
    ++f.chunks;
    f.largest_chunk = std::max(f.largest_chunk, r.header.count);
  }
  f.kind = first.kind;
  f.decoupled_weight_decay = first.decoupled_weight_decay;
  return f;
}

std::string checkpoint_fits(const CheckpointFile& f, const agg::OptimizerConfig& optimizer,
                            uint32_t chunk_bytes) {
  if (f.kind != optimizer.kind || f.decoupled_weight_decay != optimizer.decoupled_weight_decay) {
    auto name = [](agg::OptimizerKind k, bool decoupled) {
      return std::string(agg::optimizer_name(k)) + (decoupled ? " (decoupled weight decay)" : "");
    };
    return "the checkpoint " + f.path + " is of optimizer " +
           name(f.kind, f.decoupled_weight_decay) + ", the job's is " +
           name(optimizer.kind, optimizer.decoupled_weight_decay);
  }
  // The records do not say their tensors' dtypes (the placement does, once the
  // workers declared: agg::check_server_state checks each chunk's length then),
  // so here a chunk is too long only if no dtype's elements fit a packet: a
  // bfloat16 or float16 chunk holds chunk_bytes / 2 elements.
  constexpr uint32_t kNarrowest = wire::element_bytes(wire::Dtype::kBFloat16);
  if (uint64_t{f.largest_chunk} * kNarrowest > chunk_bytes) {
    return "the checkpoint " + f.path + " has chunks of " + std::to_string(f.largest_chunk) +
           " elements, more than the job's packets carry (" + std::to_string(chunk_bytes) +
           " bytes: another network.mtu or auth_key_file?)";
  }
  return "";
}

// ---------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(CheckpointSources& sources, CheckpointWriterOptions options)
    : sources_(sources), options_(std::move(options)) {}

void CheckpointWriter::start() {
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    while (!stop_.load(std::memory_order_acquire)) {
      if (!poll(now_s())) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    poll(now_s());  // a snapshot completed as the job ended
  });
}

void CheckpointWriter::stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

bool CheckpointWriter::poll(double now_s) {
  if (!sources_.running.load(std::memory_order_acquire)) return false;
  if (last_s_ < 0) last_s_ = now_s;
  if (options_.every_s > 0 && now_s - last_s_ >= options_.every_s &&
      !sources_.plan.due.load(std::memory_order_relaxed)) {
    sources_.plan.due.store(true, std::memory_order_relaxed);
    last_s_ = now_s;  // counted from the request; the write resets it too
  }
  uint32_t version = 0;
  uint32_t least = UINT32_MAX, most = 0;
  for (const auto& s : sources_.snapshots) {
    if (!s->ready(version)) return false;
    least = std::min(least, version);
    most = std::max(most, version);
  }
  if (sources_.snapshots.empty()) return false;
  if (least != most) {
    // A shard skipped a version another took: the older ones cannot make a
    // whole checkpoint any more.
    counters_.failures.fetch_add(1, std::memory_order_relaxed);
    for (const auto& s : sources_.snapshots) {
      if (s->ready(version) && version != most) s->release();
    }
    if (options_.report) {
      options_.report("checkpoint at version " + std::to_string(least) +
                          " not written: a shard skipped it (its previous one was still being "
                          "written)",
                      true);
    }
    return true;
  }
  write(most);
  if (options_.every_s > 0) last_s_ = now_s;
  return true;
}

// The calling thread's CPU time so far, in seconds.
static double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void CheckpointWriter::write(uint32_t version) {
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_s();
  // Every chunk of the server in key and offset order: the shards' own
  // orders merged.
  std::vector<std::pair<std::pair<uint32_t, uint32_t>, std::pair<size_t, uint64_t>>> order;
  for (size_t s = 0; s < sources_.snapshots.size(); ++s) {
    const ShardSnapshot& snap = *sources_.snapshots[s];
    for (uint64_t i = 0; i < snap.chunks(); ++i) {
      const agg::ChunkState& c = snap.chunk(i).state;
      order.push_back({{c.key, c.offset}, {s, i}});
    }
  }
  std::sort(order.begin(), order.end());
  uint64_t bytes = 0;
  const std::string why = write_checkpoint(
      options_.dir, options_.node, version, options_.keep,
      [&](const WriteBytes& out) {
        if (!out(sources_.snapshots.front()->hyperparameters())) return;
        for (const auto& [at, where] : order) {
          const ShardSnapshot::Chunk c = sources_.snapshots[where.first]->chunk(where.second);
          record_.resize(
              agg::chunk_record_bytes(c.state.kind, static_cast<uint32_t>(c.params.size())));
          agg::encode_chunk_record(sources_.job, c.state, c.params, c.state0, c.state1, record_);
          if (!out(record_)) return;
        }
      },
      &bytes);
  for (const auto& s : sources_.snapshots) s->release();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_s = thread_cpu_s() - cpu0;
  if (!why.empty()) {
    counters_.failures.fetch_add(1, std::memory_order_relaxed);
    if (options_.report) {
      options_.report(
          "checkpoint at version " + std::to_string(version) + " failed (the job goes on): " + why,
          true);
    }
    return;
  }
  counters_.written.fetch_add(1, std::memory_order_relaxed);
  counters_.bytes.fetch_add(bytes, std::memory_order_relaxed);
  counters_.last_version.store(version, std::memory_order_relaxed);
  if (options_.report) {
    char text[192];
    std::snprintf(text, sizeof text,
                  "checkpoint at version %u written: %s (%.1f MB, %.2f s, %.2f s of CPU)", version,
                  checkpoint_name(options_.node, version).c_str(), static_cast<double>(bytes) / 1e6,
                  secs, cpu_s);
    options_.report(text, false);
  }
}

}  // namespace mercury::server
