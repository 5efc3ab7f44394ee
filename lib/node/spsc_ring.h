// node::SpscRing<T>: a bounded single-producer, single-consumer ring of
// trivially copyable items, moved in bursts: how one core hands work to
// another (the server's net core to a shard core).
//
// The classic Lamport ring with cached indices: the producer owns `tail`,
// the consumer `head`, each on its own cache line; each side keeps a copy
// of the other's index and reloads it only when the copy says the ring is
// full (producer) or empty (consumer), so a burst costs one acquire load at
// most and one release store.
//
// Threads: enqueue_burst() belongs to the one producer thread, dequeue_burst()
// to the one consumer thread; size_approx() to anyone. Each side asserts its
// thread (base/owner.h). Costs: per burst, a release store and at most one
// acquire load per side, and the copy of the items. Memory: capacity (the
// next power of two of the requested size) items.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "base/owner.h"

namespace mercury::node {

template <class T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  /// At least `capacity` items (rounded up to a power of two). Throws
  /// std::invalid_argument for 0 or more than 2^31.
  explicit SpscRing(uint32_t capacity) {
    if (capacity == 0 || capacity > (1u << 31)) {
      throw std::invalid_argument("node::SpscRing: capacity must be 1..2^31");
    }
    size_ = std::bit_ceil(capacity);
    mask_ = size_ - 1;
    items_ = std::make_unique<T[]>(size_);
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  /// Producer: copies up to `n` items in; returns how many went (fewer
  /// only when the ring is full).
  uint32_t enqueue_burst(const T* items, uint32_t n) {
    MERCURY_OWNED(producer_);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_cache_ + n > size_) {
      // Acquire: pairs with dequeue_burst's release of head, so the slots
      // it freed are no longer read when they are overwritten here.
      head_cache_ = head_.load(std::memory_order_acquire);
      n = static_cast<uint32_t>(std::min<uint64_t>(n, size_ - (tail - head_cache_)));
    }
    for (uint32_t i = 0; i < n; ++i) items_[(tail + i) & mask_] = items[i];
    // Release: the items above are visible before the consumer sees them counted.
    tail_.store(tail + n, std::memory_order_release);
    return n;
  }

  /// Consumer: copies up to `n` items out; returns how many.
  uint32_t dequeue_burst(T* out, uint32_t n) {
    MERCURY_OWNED(consumer_);
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (tail_cache_ - head < n) {
      // Acquire: pairs with enqueue_burst's release of tail.
      tail_cache_ = tail_.load(std::memory_order_acquire);
      n = static_cast<uint32_t>(std::min<uint64_t>(n, tail_cache_ - head));
    }
    for (uint32_t i = 0; i < n; ++i) out[i] = items_[(head + i) & mask_];
    // Release: the slots are read before the producer may reuse them.
    head_.store(head + n, std::memory_order_release);
    return n;
  }

  /// Any thread: items queued, as of two racing loads.
  [[nodiscard]] uint64_t size_approx() const {
    const uint64_t head = head_.load(std::memory_order_acquire);
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    return tail > head ? tail - head : 0;
  }
  [[nodiscard]] uint32_t capacity() const { return size_; }
  /// The consumer role moves to another thread (a stopped core's ring
  /// drained by the control path).
  void hand_over_consumer() { consumer_.hand_over(); }

 private:
  // The producer's line, the consumer's line, then the shared read-mostly fields.
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t head_cache_ = 0;
  base::Owner producer_;
  alignas(64) std::atomic<uint64_t> head_{0};
  uint64_t tail_cache_ = 0;
  base::Owner consumer_;
  alignas(64) uint32_t size_ = 0;
  uint32_t mask_ = 0;
  std::unique_ptr<T[]> items_;
};

}  // namespace mercury::node
