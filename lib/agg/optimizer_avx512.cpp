// The AVX-512 kernels (optimizer_kernels.h), compiled with -mavx512f whatever
// the build's -march: called only on CPUs that have AVX-512F.
#include "agg/optimizer_kernels.h"

#if !defined(__AVX512F__)
#error "optimizer_avx512.cpp is compiled with -mavx512f (lib/agg/meson.build)"
#endif

namespace mercury::agg {

const KernelSet kAvx512Kernels = kernel_set<Avx512>();

}  // namespace mercury::agg
