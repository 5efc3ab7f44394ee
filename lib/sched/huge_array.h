// HugeArray<T>: a fixed array of value-initialised T, allocated on the
// control path for the datapath to use, in transparent huge pages from 2 MB
// up. A server's endpoint holds 131072 message descriptors per port (16 MB):
// faulted in 4 KB at a time they cost this VM about 0.25 s per 64 MB at
// start, in 2 MB pages a few milliseconds, and the datapath then walks them
// with fewer TLB misses. The hint may be refused (THP off): the array is
// then as it would be from new[].
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

namespace mercury::sched {

inline constexpr size_t kHugePage = size_t{2} << 20;

/// Control path: `bytes` (rounded up to the alignment) from std::aligned_alloc,
/// `align`-aligned below kHugePage; from kHugePage up 2 MB aligned and asked
/// for transparent huge pages (a hint; refused is fine). Untouched: its pages
/// cost nothing until first written. Free with std::free. Throws
/// std::bad_alloc.
inline void* allocate_huge_hinted(size_t bytes, size_t align) {
  const bool huge = bytes >= kHugePage;
  if (huge) align = kHugePage;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

template <class T>
class HugeArray {
 public:
  static constexpr size_t kHugePage = sched::kHugePage;

  HugeArray() = default;
  /// Control path: `n` value-initialised elements. Throws std::bad_alloc.
  explicit HugeArray(size_t n) : n_(n) {
    if (n == 0) return;
    p_ = static_cast<T*>(allocate_huge_hinted(n * sizeof(T), alignof(T) > 64 ? alignof(T) : 64));
    try {
      std::uninitialized_value_construct_n(p_, n);
    } catch (...) {
      std::free(p_);
      throw;
    }
  }
  ~HugeArray() { release(); }
  HugeArray(HugeArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HugeArray& operator=(HugeArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;

  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  [[nodiscard]] size_t size() const { return n_; }

 private:
  void release() {
    if (p_ == nullptr) return;
    std::destroy_n(p_, n_);
    std::free(p_);
    p_ = nullptr;
  }

  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace mercury::sched
