// A compute trace: per-layer forward and backward times of a real model
// (config/traces/*.txt, measured by config/traces/measure.py), read against
// the model's tensor list (config/models/*.txt) for ps-worker --trace.
//
// The format, one layer per line in forward order, '#' starts a comment:
//
//   <layer> <forward_us> <backward_us> <tensor> [<tensor>...]
//
// A layer's tensors are the model file's next lines, in order, and the
// layers together cover every tensor of the model exactly once; times are
// decimal microseconds, 0 <= t <= 1e9. Anything else is refused with the
// trace file and line (and the model file's line where it is the model
// that disagrees).
//
// Control path, pure (no DPDK, no I/O): the caller reads both files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agg/placement.h"

namespace mercury::trace {

/// One layer: the compute before and after it in a training step, and the
/// tensors it owns (indices into the model's declarations).
struct Layer {
  std::string name;
  double forward_us = 0;
  double backward_us = 0;
  uint32_t first_tensor = 0;  // its tensors are [first_tensor, first_tensor + tensors)
  uint32_t tensors = 0;
  uint32_t line = 0;  // in the trace file
};

struct Trace {
  std::string source;  // the trace file, for messages
  std::vector<Layer> layers;

  /// Sum of every layer's forward plus backward time, in microseconds.
  [[nodiscard]] double compute_us() const;
};

/// A named text: a file's path (for messages) and its contents.
struct Text {
  std::string_view path;
  std::string_view contents;
};

/// Parses `trace` against `model` (its text, and its declarations as
/// agg::parse_model_shapes gave them). Throws std::invalid_argument with
/// "<trace path>:<line>: ..." for the first bad line, or "<trace path>: ..."
/// for what only the end shows (no layer, model tensors left over).
Trace parse_trace(Text trace, Text model, const std::vector<agg::TensorDecl>& decls);

}  // namespace mercury::trace
