// The half-precision kernels this CPU runs, listed once: the portable ones
// from the widest unit the CPU has, then each unit's own that it has
// (half_kernels.h; the CPU's sets from isa.h).
#include "agg/half.h"

#include "agg/half_kernels.h"
#include "agg/isa.h"

namespace mercury::agg {

const HalfSet kHalfBaseline = {portable_bf16(), portable_fp16(), {}, {}};

namespace {

using wire::Dtype;

struct Variants {
  HalfKernels v[3];
  size_t n = 0;
  void add(const HalfKernels& k) { v[n++] = k; }
};

// Per dtype, portable first, then in order of preference: half_kernels()
// takes the last. The order comes from agg_bench (docs/agg.md): on this
// machine's AMD EPYC the 256-bit F16C conversions beat the 512-bit ones in
// both directions, and VCVTNEPS2BF16 beats the integer rounding.
struct AllVariants {
  Variants bf16;
  Variants fp16;
};

const AllVariants& variants() {
  static const AllVariants all = [] {
    const Isa& isa = cpu_isa();
    const bool avx512 = isa.avx512();
    const bool f16c = isa.avx2 && isa.f16c;
    const HalfSet& widest = avx512 ? kHalfAvx512 : f16c ? kHalfAvx2 : kHalfBaseline;
    AllVariants a;
    a.bf16.add(widest.bf16_portable);
    a.fp16.add(widest.fp16_portable);
    if (avx512) {
      a.bf16.add(kHalfAvx512.bf16);
      a.fp16.add(kHalfAvx512.fp16);
      if (isa.avx512bf16 && isa.avx512dq) {
        a.bf16.add(
            {kHalfAvx512Bf16.bf16.name, kHalfAvx512.bf16.widen_sum, kHalfAvx512Bf16.bf16.narrow});
      }
    }
    if (f16c) a.fp16.add(kHalfAvx2.fp16);
    return a;
  }();
  return all;
}

}  // namespace

std::span<const HalfKernels> half_kernel_variants(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBFloat16:
      return {variants().bf16.v, variants().bf16.n};
    case Dtype::kFloat16:
      return {variants().fp16.v, variants().fp16.n};
    default:
      return {};
  }
}

const HalfKernels& half_kernels(Dtype dtype, bool portable) {
  const std::span<const HalfKernels> v =
      half_kernel_variants(dtype == Dtype::kFloat16 ? Dtype::kFloat16 : Dtype::kBFloat16);
  return portable ? v.front() : v.back();
}

}  // namespace mercury::agg
