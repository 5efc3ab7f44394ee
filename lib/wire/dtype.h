// Element types: what a Mercury payload is made of (the header's dtype
// field), and what a declared tensor is made of.
//
// A tensor is float32, bfloat16 or float16; its packets carry its elements
// as they are, little-endian, and a server keeps float32 master parameters
// for every tensor whatever its dtype (docs/agg.md, "Element types").
// Control messages and raw transport data are opaque bytes. The numbering is
// the wire's: docs/wire-format.md, "Dtypes". Pure, constexpr, any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace mercury::wire {

enum class Dtype : uint8_t {
  kBytes = 0,     ///< opaque bytes (control messages, raw transport data)
  kFloat32 = 1,   ///< IEEE-754 binary32, little-endian in the payload
  kBFloat16 = 2,  ///< bfloat16 (the top half of a binary32), little-endian in the payload
  kFloat16 = 3,   ///< IEEE-754 binary16, little-endian in the payload
};
/// Dtype values 0 .. kDtypeCount - 1 are valid on the wire.
inline constexpr uint8_t kDtypeCount = 4;

/// Bytes per element: 4, 2 or 2 for a tensor dtype, 1 for kBytes (any
/// length), 0 for a value outside the enum.
constexpr uint32_t element_bytes(Dtype d) {
  switch (d) {
    case Dtype::kBytes:
      return 1;
    case Dtype::kFloat32:
      return 4;
    case Dtype::kBFloat16:
    case Dtype::kFloat16:
      return 2;
  }
  return 0;
}

/// Whether a tensor may be declared with `d` (every dtype but kBytes).
constexpr bool is_tensor_dtype(Dtype d) {
  return d == Dtype::kFloat32 || d == Dtype::kBFloat16 || d == Dtype::kFloat16;
}

/// "bytes", "float32", "bfloat16", "float16" (PyTorch's names), "?" otherwise.
constexpr std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kBytes:
      return "bytes";
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat16:
      return "float16";
  }
  return "?";
}

}  // namespace mercury::wire
