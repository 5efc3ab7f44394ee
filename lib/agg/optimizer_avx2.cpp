// The AVX2 kernels (optimizer_kernels.h), compiled with -mavx2 whatever the
// build's -march: called only on CPUs that have AVX2.
#include "agg/optimizer_kernels.h"

#if !defined(__AVX2__)
#error "optimizer_avx2.cpp is compiled with -mavx2 (lib/agg/meson.build)"
#endif

namespace mercury::agg {

const KernelSet kAvx2Kernels = kernel_set<Avx2>();

}  // namespace mercury::agg
