// What ps-worker trains with and how it checks the servers: deterministic
// initial parameters and gradients that depend only on (rank, seed, tensor),
// so any rank can generate every rank's gradients and compute, bit for bit,
// the aggregate the servers must return (rank-order sum, times 1/N, then the
// job's optimizer, as lib/agg computes it).
//
// Control path, one trainer thread. Built with -ffp-contract=off (like
// lib/agg), or the reference would round differently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "agg/optimizer.h"
#include "buffers.h"
#include "config/config.h"
#include "wire/dtype.h"

namespace mercury::trainer {

/// Rank 0's initial values of tensor `tensor`.
void initial(std::span<float> p, size_t tensor);

/// Rank `rank`'s gradient of `tensor` for gradient seed `seed`.
void gradient(std::span<float> g, uint32_t rank, uint32_t seed, size_t tensor);

/// The update the servers apply: sgd, momentum, adam or sum only, with the
/// job's constants as the servers hold them (job::optimizer_config).
struct Update {
  agg::OptimizerConfig opt;
  bool sum_only = false;
  /// Of a BSP job (every round checked). Throws std::runtime_error for
  /// another mode.
  static Update of(const config::TrainingConfig& t);
  /// The job's optimizer, whatever its mode.
  static Update optimizer_of(const config::TrainingConfig& t);
};

/// One tensor's optimizer state as the servers keep it: momentum's u (s0),
/// Adam's m (s0) and v (s1), and how many updates were applied (Adam's t).
struct OptState {
  Floats s0, s1;
  uint64_t updates = 0;
};

/// The rank-order average over `workers` ranks of gradient(r, seed, tensor),
/// as the servers compute it, into `avg`. `own` is rank `own_rank`'s
/// gradient, already generated (it is used instead of generating it again).
/// `other` holds another rank's gradient meanwhile: the caller keeps it, so
/// that checking a round allocates nothing once both have grown to the
/// largest tensor.
/// For a bfloat16 or float16 tensor (`dtype`, ps-worker --dtype) every
/// rank's gradient is what the servers receive, its values rounded into the
/// dtype and widened back (`own` must be already); the servers keep the sum
/// and the parameters in float32.
void average(Floats& avg, Floats& other, uint32_t workers, uint32_t seed, size_t tensor,
             std::span<const float> own, uint32_t own_rank,
             wire::Dtype dtype = wire::Dtype::kFloat32);
/// The same over the ranks of `ranks` (bit r: rank r; own_rank among them),
/// x 1/their count: a set of a BSP job that shrank (docs/membership.md).
void average_of(Floats& avg, Floats& other, uint64_t ranks, uint32_t seed, size_t tensor,
                std::span<const float> own, uint32_t own_rank,
                wire::Dtype dtype = wire::Dtype::kFloat32);

/// Half-precision tensors (ps-worker --dtype): `f` rounded to nearest even
/// into `dtype` (bfloat16 or float16), as the servers round every update
/// and a trainer its gradients.
void narrow(std::span<const float> f, std::span<uint16_t> out, wire::Dtype dtype);
/// Each value of `f` as a `dtype` buffer carries it: narrowed, widened back.
/// Nothing for float32.
void quantize(std::span<float> f, wire::Dtype dtype);
/// A bfloat16 or float16 element's value (exact).
float widened(uint16_t h, wire::Dtype dtype);
/// Whether `h` is bit for bit `reference` narrowed into `dtype`.
bool equals_narrowed(std::span<const uint16_t> h, std::span<const float> reference,
                     wire::Dtype dtype);

/// `params` after the servers applied `avg` (an average()), with the
/// optimizer's formulas of lib/agg/optimizer.h, operation for operation
/// (this file is built with -ffp-contract=off, as lib/agg is); `state` is
/// the tensor's, carried from update to update.
void apply(std::span<float> params, std::span<const float> avg, const Update& u, OptState& state);

}  // namespace mercury::trainer
