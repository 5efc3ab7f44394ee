// ps-worker --trace: a trace-driven trainer. It replays a real model's
// per-layer compute times (apps/common/trace.h) around the worker API the
// way a data-parallel trainer overlaps them with communication:
//
//   forward, layer by layer in order: wait for the layer's tensors (the
//     previous round's push_pull), then compute forward_us x scale;
//   backward, in reverse order: compute backward_us x scale, then
//     push_pull the layer's tensors (priority = model file order).
//
// Compute is emulated as a GPU would run it: the trainer thread sleeps until
// an absolute deadline (clock_nanosleep, TIMER_ABSTIME) and leaves the CPU to
// the net cores; consecutive layers' deadlines are chained, so timer
// overshoot does not add up, and a layer starts late only when it had to
// wait for its parameters.
//
// A run: `comm_rounds` burst rounds (a barrier, then one push_pull of every
// tensor, no compute), `comm_rounds` streamed rounds (no barrier: each
// tensor, in forward order, waits for its previous aggregate and is pushed
// again at once), then `rounds` trace rounds. A trace round lasts from the
// start of its forward pass to the start of the next one; the iteration
// time is the median of the trace rounds after the first. The first starts
// with every parameter in place, so its forward pass would overlap no
// communication and is skipped (unless it is the only round, or a rank
// straggles: ranks_alike): round 1 is its backward pass alone, whose pushes
// start the pipeline that round 2, the first timed, runs in. The lower
// bound is max(compute = the trace's sum x scale, communication = the faster
// of the burst rounds' median after the first and the streamed rounds'
// median without their first and last passes); with no comm-only rounds
// (comm_rounds 0) it is not measured and the summary says so.
//
// Gradients alternate between two precomputed sets (round parity), so
// nothing is generated while the clock runs. Checks, after the trace rounds
// (the references cost far more CPU than a round): every comm-only round's
// aggregates against the 64-bit digests taken after it, and the final
// parameters bit for bit against every round's update replayed here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/trace.h"
#include "agg/placement.h"
#include "mercury/worker.h"
#include "reference.h"

namespace mercury::trainer {

struct TraceOptions {
  std::string node;  // for the output lines
  double scale = 1.0;
  uint32_t comm_rounds = 5;
  uint32_t rounds = 10;
  bool check_comm_rounds = true;  // false: only the final parameters (--verify last)
  bool check_final = true;        // false: nothing checked (--verify none, timing runs)
  // Every rank computes at the same pace (no --straggler): round 1's forward
  // pass is skipped (above). With a straggler it runs, so that round 2 starts
  // with the ranks as far apart as every later round does.
  bool ranks_alike = true;
};

/// Runs the comm-only and trace rounds on a started worker whose declared
/// buffers are `params` (holding version 0, equal to `reference`); prints a
/// line per round and the summary. Returns 0, or 1 after printing why
/// (a failed handle or a wrong aggregate).
int run_trace_rounds(worker::Worker& w, const trace::Trace& t,
                     const std::vector<agg::TensorDecl>& decls, std::vector<Floats>& params,
                     std::vector<Floats>& reference, const Update& update, const TraceOptions& o);

}  // namespace mercury::trainer
