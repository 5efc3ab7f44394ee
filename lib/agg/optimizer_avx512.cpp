// The AVX-512 kernels (optimizer_kernels.h), compiled with AVX-512F/BW/VL
// whatever the build's -march: called only on CPUs that have the three.
#include "agg/optimizer_kernels.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "optimizer_avx512.cpp is compiled with -mavx512f -mavx512bw -mavx512vl (lib/agg/meson.build)"
#endif

namespace mercury::agg {

const KernelSet kAvx512Kernels = kernel_set<Avx512>();

}  // namespace mercury::agg
