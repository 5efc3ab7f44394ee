// The kernels compiled with the build's own flags (optimizer_kernels.h): the
// portable ones, which every CPU the build runs on has.
#include "agg/optimizer_kernels.h"

namespace mercury::agg {

const KernelSet kBaselineKernels = kernel_set<Scalar>();

}  // namespace mercury::agg
