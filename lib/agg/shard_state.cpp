#include "agg/shard_state.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <utility>

#include "wire/dtype.h"

namespace mercury::agg {

namespace {

std::string where(size_t index, size_t offset) {
  return "record " + std::to_string(index) + " (byte " + std::to_string(offset) + ")";
}

std::string chunk_name(const RecordHeader& h) {
  return "the chunk at byte " + std::to_string(h.offset) + " of block " + std::to_string(h.key);
}

}  // namespace

uint64_t export_page(const ChunkTable& table, uint64_t job, uint64_t first, uint64_t page_bytes,
                     std::vector<std::byte>& out) {
  const ShardOptimizer& opt = table.optimizer();
  const size_t start = out.size();
  if (first == 0) {
    const HyperparameterTable& h = opt.hyperparameters();
    out.resize(start + hyperparameter_record_bytes(h));
    encode_hyperparameter_record(job, h, std::span(out).subspan(start));
  }
  uint64_t i = first;
  for (; i < table.chunks(); ++i) {
    const ChunkTable::ChunkView c = table.chunk_view(i);
    const uint64_t bytes = chunk_record_bytes(opt.kind(), static_cast<uint32_t>(c.params.size()));
    const size_t at = out.size();
    if (i > first && at - start + bytes > page_bytes) break;
    out.resize(at + bytes);
    encode_chunk_record(job,
                        ChunkState{.key = c.key,
                                   .offset = c.offset,
                                   .version = c.version,
                                   .steps = c.steps,
                                   .kind = opt.kind(),
                                   .decoupled_weight_decay = opt.decoupled_weight_decay()},
                        c.params, c.state0, c.state1, std::span(out).subspan(at));
  }
  return i;
}

std::vector<RecordRef> split_records(std::span<const std::byte> bytes, uint64_t job) {
  std::vector<RecordRef> records;
  size_t at = 0;
  while (at < bytes.size()) {
    RecordHeader h;
    const std::span<const std::byte> rest = bytes.subspan(at);
    if (const RecordReject r = decode_record_header(rest, h); r != RecordReject::kNone) {
      throw std::invalid_argument(where(records.size(), at) +
                                  " is refused: " + std::string(record_reject_name(r)));
    }
    if (h.job != job) {
      char text[96];
      std::snprintf(text, sizeof text, "job %016llx, this job's is %016llx",
                    static_cast<unsigned long long>(h.job), static_cast<unsigned long long>(job));
      throw std::invalid_argument(where(records.size(), at) + " is of another job (" + text +
                                  ": another model, update rules or shard layout)");
    }
    records.push_back(RecordRef{h, rest.first(h.record_bytes())});
    at += h.record_bytes();
  }
  return records;
}

std::vector<std::byte> join_state(std::span<const std::byte> pages, uint64_t job) {
  const std::vector<RecordRef> records = split_records(pages, job);
  std::span<const std::byte> hyper;
  std::map<std::pair<uint32_t, uint32_t>, std::span<const std::byte>> chunks;
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordRef& r = records[i];
    if (r.header.type == RecordType::kHyperparameters) {
      if (hyper.empty()) {
        hyper = r.bytes;
      } else if (!std::equal(hyper.begin(), hyper.end(), r.bytes.begin(), r.bytes.end())) {
        throw std::invalid_argument("the shards' hyperparameters differ (record " +
                                    std::to_string(i) +
                                    "): their settings should have changed together");
      }
      continue;
    }
    if (!chunks.emplace(std::pair(r.header.key, r.header.offset), r.bytes).second) {
      throw std::invalid_argument(chunk_name(r.header) + " comes twice");
    }
  }
  if (hyper.empty()) throw std::invalid_argument("no hyperparameter record among the pages");
  std::vector<std::byte> out(hyper.begin(), hyper.end());
  for (const auto& [at, bytes] : chunks) out.insert(out.end(), bytes.begin(), bytes.end());
  return out;
}

namespace {

// check_state over the blocks of the shards [first, first + count).
StateFile check_shards(std::span<const std::byte> bytes, const Placement& placement, uint32_t first,
                       uint32_t count, uint32_t chunk_bytes, OptimizerKind kind, bool decoupled) {
  if (bytes.empty()) throw std::invalid_argument("the state is empty");
  const std::vector<RecordRef> records = split_records(bytes, placement.fingerprint());
  StateFile f;
  if (records.front().header.type != RecordType::kHyperparameters) {
    throw std::invalid_argument("the first record is not the hyperparameter record");
  }
  f.hyperparameters = records.front();
  const RecordHeader& hh = f.hyperparameters.header;
  if (hh.kind != kind || hh.decoupled_weight_decay != decoupled) {
    throw std::invalid_argument(
        "the state is of optimizer " + std::string(optimizer_name(hh.kind)) +
        (hh.decoupled_weight_decay ? " (decoupled weight decay)" : "") + ", the job's is " +
        std::string(optimizer_name(kind)) + (decoupled ? " (decoupled weight decay)" : ""));
  }
  // Every chunk of the job in key, then offset order, as the job cuts them.
  size_t next = 1;
  for (const Block& b : placement.blocks()) {
    if (b.shard < first || b.shard - first >= count) continue;
    for (uint64_t at = 0; at < b.bytes(); at += chunk_bytes) {
      const std::string which = "tensor " + std::to_string(b.tensor) + " block " +
                                std::to_string(b.key) + " byte " + std::to_string(at);
      if (next >= records.size()) throw std::invalid_argument("the state has no " + which);
      const RecordRef& r = records[next];
      const RecordHeader& h = r.header;
      if (h.type != RecordType::kChunk) {
        throw std::invalid_argument(where(next, 0) + " is a second hyperparameter record");
      }
      if (h.key != b.key || h.offset != at) {
        throw std::invalid_argument("the state has " + chunk_name(h) + " where " + which +
                                    " should be (missing, twice or out of order)");
      }
      // A chunk is chunk_bytes of the block's dtype; the record holds its
      // float32 master values, one per element.
      const uint64_t elements =
          std::min<uint64_t>(chunk_bytes, b.bytes() - at) / wire::element_bytes(b.dtype);
      if (h.count != elements) {
        throw std::invalid_argument(which + " has " + std::to_string(h.count) +
                                    " elements in the state, " + std::to_string(elements) +
                                    " in the job (another packet size?)");
      }
      if (h.kind != kind || h.decoupled_weight_decay != decoupled) {
        throw std::invalid_argument(which + " is of another optimizer than the job's");
      }
      if (next == 1) f.version = h.version;
      // A skipped step (optimizer_rank0) moves the version on without a step.
      const bool skips = b.update == UpdateRule::kOptimizerRank0;
      if (h.version != f.version || h.steps > h.version || (!skips && h.steps != h.version)) {
        throw std::invalid_argument(which + " is at version " + std::to_string(h.version) +
                                    " after " + std::to_string(h.steps) + " steps, the first at " +
                                    std::to_string(f.version) +
                                    ": the state is not of one step boundary");
      }
      f.chunks.push_back(r);
      ++next;
    }
  }
  if (next != records.size()) {
    throw std::invalid_argument("the state has " + std::to_string(records.size() - next) +
                                " records past the job's last chunk");
  }
  return f;
}

}  // namespace

StateFile check_state(std::span<const std::byte> bytes, const Placement& placement,
                      uint32_t chunk_bytes, OptimizerKind kind, bool decoupled) {
  return check_shards(bytes, placement, 0, placement.shards(), chunk_bytes, kind, decoupled);
}

StateFile check_server_state(std::span<const std::byte> bytes, const Placement& placement,
                             uint32_t first_shard, uint32_t shards, uint32_t chunk_bytes,
                             OptimizerKind kind, bool decoupled) {
  return check_shards(bytes, placement, first_shard, shards, chunk_bytes, kind, decoupled);
}

std::string restore_records(ChunkTable& table, uint64_t job, uint32_t version,
                            std::span<const RecordRef> records) {
  ShardOptimizer& opt = table.optimizer();
  const uint32_t arrays = state_floats_per_element(opt.kind());
  std::vector<float> params, state0, state1;
  for (const RecordRef& r : records) {
    const RecordHeader& h = r.header;
    if (h.type == RecordType::kHyperparameters) {
      if (const RecordReject why =
              decode_hyperparameter_record(job, r.bytes, opt.hyperparameters());
          why != RecordReject::kNone) {
        return "the hyperparameter record is refused: " + std::string(record_reject_name(why));
      }
      continue;
    }
    if (h.version != version || h.steps > version) {
      return chunk_name(h) + " is at version " + std::to_string(h.version) + " (" +
             std::to_string(h.steps) + " steps); the job resumes at " + std::to_string(version);
    }
    params.resize(h.count);
    state0.resize(arrays >= 1 ? h.count : 0);
    state1.resize(arrays >= 2 ? h.count : 0);
    RecordHeader read;
    const RecordReject why =
        decode_chunk_record(job, r.bytes,
                            ChunkState{.key = h.key,
                                       .offset = h.offset,
                                       .kind = opt.kind(),
                                       .decoupled_weight_decay = opt.decoupled_weight_decay()},
                            params, state0, state1, read);
    if (why != RecordReject::kNone) {
      return chunk_name(h) + " is refused: " + std::string(record_reject_name(why));
    }
    const Outcome o = table.restore(h.key, h.offset, h.version, params, state0, state1, h.steps);
    if (o != Outcome::kInitialized) {
      return chunk_name(h) + " cannot be restored here: " + std::string(outcome_name(o));
    }
  }
  return "";
}

uint64_t chunks_without_values(const ChunkTable& table) {
  uint64_t n = 0;
  for (uint64_t i = 0; i < table.chunks(); ++i) n += table.chunk_view(i).initialized ? 0 : 1;
  return n;
}

}  // namespace mercury::agg
