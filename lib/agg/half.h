// Half-precision elements (bfloat16, float16) against float32 master
// parameters: the two conversions a server makes for a tensor whose workers
// push and pull 2-byte elements.
//
// What it is for. A server keeps every tensor in float32, whatever its dtype
// (docs/agg.md, "Element types"). When a chunk's set of bfloat16 or float16
// contributions is complete, the chunk table widens them to float32 and sums
// them in rank order (widen_sum: out = w(c0) + w(c1) + ... + w(c(n-1)), left
// to right per element, in float32; where NaNs meet, which payload the NaN
// sum keeps is the compiler's choice of operand order, as for float32
// sums), applies the optimizer to the float32
// parameters as for a float32 tensor, and rounds the updated chunk once, to
// nearest even, into the tensor's dtype for the fan-out (narrow). Widening
// is exact, so the aggregate of a half-precision tensor is bit for bit the
// float32 aggregate of the widened inputs.
//
// The conversions, as defined by the scalar functions below (every kernel
// matches them bit for bit; half_test.cpp checks each against an independent
// oracle over every 16-bit pattern and sweeps of float32 ties, subnormals,
// overflow, infinities and NaNs):
//   widen bfloat16  the bits shifted into the top half of a float32 (exact;
//                   a NaN stays the NaN it was, signalling or quiet)
//   widen float16   exact; subnormals become normal float32; a NaN keeps its
//                   sign and payload and is made quiet (as VCVTPH2PS does)
//   narrow          round to nearest, ties to even, on every finite value,
//                   subnormals included (gradual underflow, no flush to
//                   zero); too large for the type rounds to infinity (float16:
//                   |x| >= 65520); infinities stay; a NaN keeps its sign and
//                   top payload bits and is made quiet (as VCVTNEPS2BF16 and
//                   VCVTPS2PH do). PyTorch rounds the same way except that it
//                   turns every NaN into 0x7fc0 (bfloat16): both are NaN.
//
// Kernels and dispatch. Each dtype has a small table of implementations
// (HalfKernels: a widen_sum and a narrow function pointer), the portable one
// first, then by preference; half_kernels() takes the last. Every build
// compiles all of them, each in a unit of its own for its instruction set
// whatever the build's -march (half_kernels.h), and the table lists those
// this CPU runs, read once from cpuid, so a portable build (-Dnative=false)
// runs the AVX-512 kernels where the CPU has them:
//   bfloat16  portable | avx512 (AVX-512F/BW/VL integer ops) | avx512_bf16
//             (narrow with VCVTNEPS2BF16, its flush of subnormals undone;
//             AVX-512 BF16 and DQ too)
//   float16   portable | avx512 (VCVTPH2PS/VCVTPS2PH on 512-bit registers,
//             masked tails) | f16c (the same on 256-bit registers, AVX2 and
//             F16C: the faster of the two on this machine's AMD EPYC)
// The portable code is plain C++ (integer bit operations, one float add for
// float16's subnormal rounding), compiled for every set too and run at the
// widest the CPU has (AVX-512, else AVX2, else the build's own flags).
//
// Threads and costs: pure functions over caller memory, any thread; no
// allocation, locks or I/O. widen_sum reads n x 2 bytes and writes 4 bytes
// per element; narrow reads 4 and writes 2. Sources and destinations may
// have any alignment (payloads sit in packet buffers). lib/agg is compiled
// with -ffp-contract=off: the sums are plain IEEE float32 additions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "wire/dtype.h"

namespace mercury::agg {

// ---- the scalar definitions ----
// Always inlined: the kernels' units compile them for their instruction set,
// and an out-of-line copy of one (external linkage) could be the copy the
// linker keeps for every caller (half_kernels.h).

[[gnu::always_inline]] inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}

[[gnu::always_inline]] inline uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept part's lowest bit rounds the dropped 16 bits
  // to nearest, ties to even; a carry moves into the exponent (up to
  // infinity), which is what rounding up means there.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

[[gnu::always_inline]] inline float fp16_to_float(uint16_t h) {
  // Without branches, so that loops over it vectorise: all three cases are
  // computed and one is chosen by the exponent.
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t bits = uint32_t{h & 0x7fffu} << 13;  // exponent and mantissa, float32 places
  const uint32_t exp = bits & 0x0f800000u;
  const uint32_t normal = bits + 0x38000000u;  // exponent rebiased, 15 -> 127
  const uint32_t special = bits | 0x7f800000u | ((bits & 0x7fffffu) != 0 ? 0x400000u : 0);
  // Zero or subnormal, man x 2^-24: 2^-14 x (1 + man / 1024) - 2^-14, exact.
  const uint32_t small =
      std::bit_cast<uint32_t>(std::bit_cast<float>(bits + 0x38800000u) - 0x1p-14f);
  return std::bit_cast<float>(sign | (exp == 0x0f800000u ? special : exp == 0 ? small : normal));
}

[[gnu::always_inline]] inline uint16_t float_to_fp16(float f) {
  // Without branches, as fp16_to_float(): every case computed, one chosen.
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // NaN: quiet, sign and top payload bits kept.
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Normal in float16 (2^-14 <= |f| < 65520): rebias the exponent (127 ->
  // 15), round the 13 dropped mantissa bits to nearest even; a carry
  // reaches the exponent.
  const uint32_t r = a - 0x38000000u;
  const uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  // Below 2^-14: float16's subnormals are multiples of 2^-24. Adding 0.5
  // puts the value's 2^-24 place at the unit of the float32 mantissa, so the
  // float add rounds it there (to nearest even); the mantissa bits then are
  // the float16 ones (0x400, the smallest normal, when it rounds up to it).
  const uint32_t small = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  const uint32_t magnitude = a > 0x7f800000u    ? nan
                             : a >= 0x477ff000u ? 0x7c00u  // >= 65520 (and infinity): infinity
                             : a >= 0x38800000u ? normal
                                                : small;
  return static_cast<uint16_t>(sign | magnitude);
}

// ---- the kernels ----

/// out[i] = w(src[0][i]) + w(src[1][i]) + ... + w(src[n-1][i]) in float32, in
/// that order (w: the dtype's widening). n >= 1; 2-byte little-endian
/// elements at any alignment.
using WidenSumFn = void (*)(const std::byte* const* src, uint32_t n, uint64_t elements, float* out);
/// out[i] = the dtype's rounding of src[i] (2 bytes, little-endian, any alignment).
using NarrowFn = void (*)(const float* src, uint64_t elements, std::byte* out);

struct HalfKernels {
  std::string_view name;  ///< "portable", "avx512", "avx512_bf16", "f16c"
  WidenSumFn widen_sum;
  NarrowFn narrow;
};

/// The implementations of `dtype`'s kernels this CPU runs, the portable one
/// first (file comment). Empty unless dtype is kBFloat16 or
/// kFloat16.
std::span<const HalfKernels> half_kernel_variants(wire::Dtype dtype);

/// The implementation the chunk table uses for `dtype` (kBFloat16 or
/// kFloat16): the portable one if `portable`, else the preferred one this
/// CPU runs (benchmarks/agg/agg_bench.cpp measures them; docs/agg.md). Chosen once.
const HalfKernels& half_kernels(wire::Dtype dtype, bool portable = false);

}  // namespace mercury::agg
