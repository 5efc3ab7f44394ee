// A shard's state as records, and a job's state as a file: what a
// checkpoint of a job holds of the servers, and what a job that resumes
// starts from.
//
// What it is for. Every shard's parameters, optimizer state (momentum,
// Adam's moments), versions and hyperparameters make a resumed run the run
// that stopped. A server exports its shards' chunk tables page by page
// (export_page: optimizer_state.h records), a worker joins the pages of
// every server into the job's state file (join_state), and a job that
// resumes from that file gives each shard its records back (check_state
// on the worker, then restore_records on the server).
//
// The state file ("a job's state", docs/agg.md): optimizer_state.h records
// back to back, nothing else. The first is the hyperparameter record (type
// 2: the job's settings, which every shard holds alike); then one chunk
// record (type 1) per chunk of the job, in key then offset order. Every
// record carries the job's placement fingerprint (Placement::fingerprint:
// the tensors, their rules, the shards), so a file of another job, or of
// the same model on another shard layout, is refused. A consistent file
// under BSP has every chunk at one version (a step boundary): the version
// the job resumes at; the chunk's step count (Adam's t) is its version.
//
// Threads and costs. Pure functions over the caller's table and bytes, on
// the thread that owns the table; control path: they allocate and copy
// each byte once (the CRCs read it once more). Nothing here runs on the
// datapath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "agg/chunk_table.h"
#include "agg/optimizer_state.h"
#include "agg/placement.h"

namespace mercury::agg {

/// What one page of a shard's state holds at most (a control message, with
/// at least one record: a chunk record is at most 196 672 bytes).
inline constexpr uint64_t kStatePageBytes = uint64_t{1} << 20;

/// Appends the records of `table` from chunk `first` on to `out`: when
/// `first` is 0 the table's hyperparameter record first, then chunk
/// records in the table's order while the page stays within `page_bytes`
/// (at least one). Returns the next chunk to export: table.chunks() when
/// the table is done. `job`: the placement fingerprint.
uint64_t export_page(const ChunkTable& table, uint64_t job, uint64_t first, uint64_t page_bytes,
                     std::vector<std::byte>& out);

/// One whole record in a byte stream.
struct RecordRef {
  RecordHeader header;
  std::span<const std::byte> bytes;  ///< the record, header and payload
};

/// Splits `bytes` into whole records, each header checked
/// (decode_record_header) and of job `job`. Throws std::invalid_argument
/// naming the record (its index and byte offset) and why.
std::vector<RecordRef> split_records(std::span<const std::byte> bytes, uint64_t job);

/// Joins what the servers exported (every page of every shard, in any
/// order) into the job's state file: one hyperparameter record (the shards'
/// must agree, byte for byte), then every chunk record sorted by key and
/// offset. Throws std::invalid_argument naming what is wrong (a record
/// that does not split, no hyperparameter record, shards that disagree, a
/// chunk twice).
std::vector<std::byte> join_state(std::span<const std::byte> pages, uint64_t job);

/// A state file, checked against the job it resumes.
struct StateFile {
  RecordRef hyperparameters;
  std::vector<RecordRef> chunks;  ///< in key and offset order
  uint32_t version = 0;           ///< every chunk's: where the job resumes
};

/// Checks `bytes` as the state file of the job placed as `placement`, cut
/// into chunks of `chunk_bytes`, with optimizer `kind` (decoupled weight
/// decay or not): the records split and are this job's, the hyperparameter
/// record comes first and is the only one, every chunk of every block is
/// there once with its length, and at one version, with as many optimizer
/// steps (an optimizer_rank0 chunk's skipped steps are not: as many or
/// fewer). Throws std::invalid_argument naming the first thing wrong (the
/// tensor, block and offset of a chunk).
StateFile check_state(std::span<const std::byte> bytes, const Placement& placement,
                      uint32_t chunk_bytes, OptimizerKind kind, bool decoupled_weight_decay);

/// check_state for one server's checkpoint (docs/server.md, "Durability"):
/// the same file, holding only the blocks of the shards [first_shard,
/// first_shard + shards), the server's. "the job's last chunk" is then the
/// server's.
StateFile check_server_state(std::span<const std::byte> bytes, const Placement& placement,
                             uint32_t first_shard, uint32_t shards, uint32_t chunk_bytes,
                             OptimizerKind kind, bool decoupled_weight_decay);

/// Applies records to `table` (its shard's part of a state file, split by
/// split_records): the hyperparameter record restores its settings; each
/// chunk record restores its chunk (ChunkTable::restore: values, optimizer
/// state, version; emitted at that version). Every chunk must be at
/// `version`, with as many steps (optimizer_rank0: or fewer), and owned
/// by this table. Returns "" or
/// why not, naming the first record refused; the records before it stay
/// applied. `job`: the placement fingerprint.
std::string restore_records(ChunkTable& table, uint64_t job, uint32_t version,
                            std::span<const RecordRef> records);

/// How many chunks of `table` hold no values yet (neither initial nor
/// restored): after a resume's last page, 0.
uint64_t chunks_without_values(const ChunkTable& table);

}  // namespace mercury::agg
