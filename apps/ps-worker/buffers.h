// Model-sized float buffers on transparent huge pages.
//
// A trace run's worker holds the model's parameters (VGG-16: 553 MB) and
// writes every byte of them before its first round. In 4 KiB pages that is
// a page fault per 4 KiB, and on a virtual machine each of those is a trap
// to the hypervisor (and the first touch of a populated page another): 3.5 s
// for 553 MB here, against about 0.1 s for the same buffer mapped with 2 MiB
// transparent huge pages and populated in one madvise call. The kernel may
// refuse huge pages (THP "never", no free 2 MiB frames): then the buffer is
// plain pages, as std::allocator's, only slower to fill.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace mercury::trainer {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t{2} << 20;

  HugePageAllocator() = default;
  template <class U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  // Buffers under 2 MiB gain nothing: the heap's.
  static size_t mapped_bytes(size_t n) { return (n * sizeof(T) + kHuge - 1) / kHuge * kHuge; }

  T* allocate(size_t n) {
    if (n * sizeof(T) < kHuge) return std::allocator<T>{}.allocate(n);
    const size_t len = mapped_bytes(n);
    // One huge page more than needed, to cut an aligned range out of it:
    // only 2 MiB-aligned ranges can be mapped with huge pages.
    void* raw =
        mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHuge - 1) & ~(kHuge - 1);
    // Unmap what lies before and after [aligned, aligned + len): the head
    // may be empty, the tail never is (aligned < base + kHuge).
    if (aligned > base) munmap(raw, aligned - base);
    munmap(reinterpret_cast<void*>(aligned + len), base + kHuge - aligned);
    auto* p = reinterpret_cast<void*>(aligned);
    // Advice only: refused, the buffer is plain pages.
    madvise(p, len, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
    madvise(p, len, MADV_POPULATE_WRITE);
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHuge) {
      std::allocator<T>{}.deallocate(p, n);
      return;
    }
    munmap(p, mapped_bytes(n));
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

/// A tensor's floats: parameters, gradients, references.
using Floats = std::vector<float, HugePageAllocator<float>>;

}  // namespace mercury::trainer
