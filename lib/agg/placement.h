// Placement: which shard owns which block of which tensor, and the key each
// block travels under on the wire.
//
// What it is for. Workers declare the model's tensors (name, element count,
// priority, dtype). Every node of a job (each worker, each server) calls
// Placement::compute() with the same declaration list and the same global
// shard count and gets the same answer, with no message exchanged: the result
// is a pure function of (declarations, shard count, options). Shard ids are
// global across the job's servers; which server process and lcore runs shard
// s is lib/server's business, not this file's.
//
// Blocks and keys. A tensor is cut into one or more *blocks*, each a
// contiguous range of its elements; a block is owned by exactly one shard
// and is the unit a worker pushes and pulls as one transport message. Its
// *key* (wire field block_key) is its index in the list of all blocks
// ordered by (tensor declaration index, range start): tensor t's blocks
// have consecutive keys, in range order. The byte offset of a packet inside a
// block (wire field offset) names the chunk (see chunk_table.h).
//
// Sizes are the tensors' bytes on the wire (elements x the dtype's element
// size): what a block costs its shard's links and what its message carries.
//
// Balance. A tensor larger than max_block_bytes is split into near-equal
// ranges (boundaries aligned to align_elements); blocks are then assigned
// largest first to the least-loaded shard (ties: lower key first, lower shard
// id first). That greedy (LPT) bound gives every shard at most
// mean + max_block_bytes; the default max_block_bytes of
// total / (8 x shards) keeps the worst shard within 12.5% of the mean.
//
// Threads and costs. Control path only: compute() allocates and may throw
// std::invalid_argument; it costs O(P log P) for P blocks. A Placement is
// immutable afterwards, so any thread may read it concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/dtype.h"

namespace mercury::agg {

/// Bytes of a float32 element: the servers' parameters and optimizer state
/// are float32 whatever a tensor's dtype (its wire elements are
/// wire::element_bytes(dtype) bytes each).
inline constexpr uint32_t kElementBytes = 4;

/// Largest tensor a job may declare, in elements (2^36: 256 GiB of float32),
/// and longest tensor name, in bytes. Beyond them a declaration is refused
/// (by the worker's declare, the control decoder and Placement::compute), so
/// no size computation downstream can overflow.
inline constexpr uint64_t kMaxTensorElements = uint64_t{1} << 36;
inline constexpr size_t kMaxTensorNameBytes = 1024;

/// How the servers make a tensor's next version from the ranks' pushes.
/// The optimizer's is the job's (training.optimizer); average and rank0
/// are for tensors that are no parameters beside a server-side optimizer
/// (the running statistics of BatchNorm), optimizer_rank0 for parameters
/// whose gradient every trainer finished alike (docs/agg.md, "Placement and
/// keys").
enum class UpdateRule : uint8_t {
  kOptimizer = 0,  ///< the job's optimizer applied to the averaged push
  kAverage = 1,    ///< the pushes averaged in rank order (the optimizer's "sum-only")
  kRank0 = 2,      ///< rank 0's push as it is (a broadcast from rank 0)
  /// The job's optimizer applied to rank 0's push as the gradient, not
  /// averaged (the ranks push the same bits: a gradient every trainer
  /// averaged, unscaled and clipped alike); a push that begins with
  /// kSkipStepBits applies nothing: a skipped step (GradScaler), whose
  /// version carries the values as they are and takes no optimizer step.
  kOptimizerRank0 = 3,
};
inline constexpr uint8_t kUpdateRules = 4;
/// The first element of a kOptimizerRank0 chunk that skips the step, per
/// wire dtype: signalling NaNs, which no arithmetic produces (it quiets a
/// NaN), so no computed gradient is taken for one.
inline constexpr uint32_t kSkipStepFloat32 = 0x7FA55A5Au;
inline constexpr uint16_t kSkipStepBFloat16 = 0x7FA5u;
inline constexpr uint16_t kSkipStepFloat16 = 0x7D5Au;
std::string_view update_rule_name(UpdateRule rule);

/// One tensor as a worker declares it.
struct TensorDecl {
  std::string name;
  uint64_t elements = 0;  ///< 1..kMaxTensorElements
  uint8_t priority = 0;   ///< 0 is the most urgent (first layer of the forward pass)
  /// Its elements on the wire and in the workers' buffers: float32,
  /// bfloat16 or float16 (wire::is_tensor_dtype).
  wire::Dtype dtype = wire::Dtype::kFloat32;
  UpdateRule update = UpdateRule::kOptimizer;
};

/// A contiguous range of one tensor, owned by one shard; the unit on the wire.
struct Block {
  uint32_t key = 0;                            ///< wire block_key; index in Placement::blocks()
  uint32_t tensor = 0;                         ///< index into the declaration list
  uint64_t first_element = 0;                  ///< first element of the range within the tensor
  uint64_t elements = 0;                       ///< > 0
  uint32_t shard = 0;                          ///< global shard id
  uint8_t priority = 0;                        ///< the tensor's priority
  UpdateRule update = UpdateRule::kOptimizer;  ///< the tensor's
  wire::Dtype dtype = wire::Dtype::kFloat32;   ///< the tensor's dtype
  /// Bytes on the wire and in a worker's buffer: the message's length.
  [[nodiscard]] uint64_t bytes() const { return elements * wire::element_bytes(dtype); }
};

struct PlacementOptions {
  /// Split tensors larger than this. 0 = automatic: ceil(total / (8 x shards))
  /// when there is more than one shard, no split with one shard.
  uint64_t max_block_bytes = 0;
  /// Split points are multiples of this many elements (64 = 256 B = 4 lines).
  uint32_t align_elements = 64;
  /// A block is one transport message: its byte length is a 32-bit
  /// field on the wire, so blocks are capped below 4 GiB regardless.
  static constexpr uint64_t kMaxMessageBytes = (uint64_t{1} << 32) - 256;
};

class Placement {
 public:
  /// Places `tensors` on `shards` global shards. Throws std::invalid_argument
  /// for no tensors, a zero-element tensor, a dtype that is not a tensor
  /// dtype, zero shards, a zero alignment or more than 2^32 - 1 blocks.
  static Placement compute(std::span<const TensorDecl> tensors, uint32_t shards,
                           const PlacementOptions& options = {});

  /// Every block, indexed by key.
  [[nodiscard]] const std::vector<Block>& blocks() const { return blocks_; }
  /// Block `key`; key must be < blocks().size().
  [[nodiscard]] const Block& at(uint32_t key) const { return blocks_[key]; }
  /// Tensor t's blocks in range order (consecutive keys).
  [[nodiscard]] std::span<const Block> tensor_blocks(uint32_t tensor) const;
  [[nodiscard]] uint32_t tensors() const { return static_cast<uint32_t>(tensor_first_.size() - 1); }
  [[nodiscard]] uint32_t shards() const { return static_cast<uint32_t>(shard_bytes_.size()); }
  /// Bytes (on the wire) of the blocks shard s owns.
  [[nodiscard]] uint64_t shard_bytes(uint32_t shard) const { return shard_bytes_[shard]; }
  /// Keys owned by shard s, ascending.
  [[nodiscard]] std::vector<uint32_t> shard_keys(uint32_t shard) const;
  /// 64-bit FNV-1a over every block's (key, tensor, range, shard,
  /// priority, update rule, dtype): nodes compare it at join time to prove
  /// they agree; a job's state records carry it (optimizer_state.h).
  [[nodiscard]] uint64_t fingerprint() const;

 private:
  std::vector<Block> blocks_;
  std::vector<uint32_t> tensor_first_;  // first key of each tensor; one past the end appended
  std::vector<uint64_t> shard_bytes_;
};

/// Parses a model-shape list (config/models/*.txt: "name elements shape"
/// per line, '#' comments, forward order) into float32 declarations whose
/// priority is the line order, saturated at 255. Pure: the caller reads the
/// file.
/// Throws std::invalid_argument naming the line for a malformed one.
std::vector<TensorDecl> parse_model_shapes(std::string_view text);

}  // namespace mercury::agg
