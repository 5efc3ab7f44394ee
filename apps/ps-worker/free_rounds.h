// ps-worker --compute-ms: free-running rounds, the way the synchronisation
// modes differ. Each round the trainer "computes" (sleeps compute_ms, or
// factor x compute_ms on the straggler's rank), then push_pulls every tensor,
// last layer first, and waits for them; there is no barrier between rounds,
// so each rank goes at the pace its mode allows: under bsp every rank waits
// for the slowest's gradient every round, under asp and psplus nobody waits
// for anyone, under ssp a rank waits only when it would get more than
// training.staleness_bound rounds ahead of the slowest (docs/worker.md).
//
// The end state is known bit for bit whatever order the servers applied the
// gradients in. sgd: values on a grid (initial values and each rank's
// gradient, the same every round, multiples of 2^-6 in [-1, 1]; the
// learning rate a power of two), so every partial sum is exact in float and
// the end state is
//   bsp:                 initial - rounds x lr x (sum over ranks of g) / N
//                        (replayed round by round in float as the servers
//                        compute it: 1/N is not always a power of two)
//   asp, ssp, psplus:    initial - rounds x lr x (sum over ranks of g)
// momentum and adam: every rank pushes the same gradient, so every update
// of a chunk is the same and the end state is the optimizer's step replayed
// (reference.h) rounds times (bsp) or N x rounds times (ssp, psplus; asp is
// refused: it sends a worker only its own updates, and one more push to read
// the end state would move the optimizer's state). psplus is checked only
// with staleness_lr none: a stale update's learning rate is otherwise
// scaled, and the result depends on the order.
//
// Reading the end state: bsp, the last round's pull. Otherwise a barrier,
// then for sgd one more push_pull, of zeros, which changes nothing but
// returns, once applied, the parameters after every rank's every push, and a
// pull of version N x rounds + 1 (psplus's pulls are eager); for momentum
// and adam a pull of version N x rounds, which ssp and psplus send to every
// worker. Then every element is compared for exact equality (a -0 for a +0
// is the only difference allowed).
//
// Half-precision tensors (ps-worker --dtype): the grid's values are exact in
// bfloat16 and float16, so the gradients travel unrounded and the servers'
// float32 master parameters end exactly as a float32 tensor's would; the
// check is that end state rounded once, to nearest even, into the dtype.
//
// After every round, no tensor's version (Worker::version) may have gone
// back. Each round prints its time and the compute in it; the summary gives the
// mean iteration time of the rounds after the first. Control path, one
// trainer thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agg/placement.h"
#include "buffers.h"
#include "config/config.h"
#include "mercury/worker.h"
#include "wire/dtype.h"

namespace mercury::trainer {

struct FreeOptions {
  std::string node;
  uint32_t rounds = 10;
  double compute_ms = 0;
  uint32_t straggler_rank = UINT32_MAX;  // none
  double straggler_factor = 1;
};

/// Refuses (std::runtime_error, saying why) a job whose end state is not
/// known bit for bit: optimizer sum, momentum or adam under asp, sgd with a
/// learning rate that is not a power of two. Returns whether the end state
/// can be checked (false for psplus with a staleness_lr rule other than none).
bool free_rounds_checkable(const config::TrainingConfig& t);

/// Rank 0's initial values of `tensor` on the grid.
void grid_initial(Floats& p, size_t tensor);

/// The buffers the worker declared: tensor k's is params[k] when dtypes[k]
/// is float32, else half_params[k] (its elements' bits).
struct FreeBuffers {
  std::vector<Floats>& params;
  std::vector<std::vector<uint16_t>>& half_params;
  const std::vector<wire::Dtype>& dtypes;
};

/// Runs the rounds on a started worker whose declared buffers are `b`
/// (holding grid_initial(), rounded into each tensor's dtype). Returns 0,
/// or 1 after printing why.
int run_free_rounds(worker::Worker& w, const config::TrainingConfig& t,
                    const std::vector<agg::TensorDecl>& decls, FreeBuffers b, const FreeOptions& o);

}  // namespace mercury::trainer
