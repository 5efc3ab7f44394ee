#include "memory_limit.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

#include "agg/optimizer.h"

namespace mercury::bench {

Floats huge_floats(uint64_t elements) {
  constexpr uint64_t kHuge = 2u << 20;
  const uint64_t bytes = (elements * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint; fine if refused
  std::memset(p, 0, bytes);
  return Floats(static_cast<float*>(p));
}

uint64_t limit_sum(const std::byte* const* src, uint32_t n, uint64_t bytes, float* out) {
  agg::reduce_sum(agg::Simd::kAuto, src, n, bytes / 4, out);
  return uint64_t{n} * bytes;
}

}  // namespace mercury::bench
