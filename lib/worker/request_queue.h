// RequestQueue: the bounded multi-producer, single-consumer queue that
// carries trainer requests (push, pull, barrier, start, stop) to the
// worker's net core (whose loop's node::Doorbell the producers ring after
// each request, so that a sleeping net core wakes at once).
//
// What it is for. Any number of trainer threads call try_push_mp() at once;
// the net core drains with try_pop_sc(). Nothing is locked and nothing is
// allocated after construction: each cell carries a sequence number (the
// bounded queue of D. Vyukov), a producer claims a cell with one CAS on the
// tail and publishes it with a release store of the cell's sequence.
//
// Preemption. A producer preempted between its claim and its publish does
// not block the other producers (they claim later cells); the consumer sees
// the queue as empty at that cell until the producer resumes, so requests
// are delivered in claim order and never lost. That is why it suits
// preemptible trainer threads (docs/architecture.md, "Threads and ownership").
//
// Costs. try_push_mp(): one relaxed load and one CAS on the tail (retried
// under contention), an acquire load of the cell, the move of T, a release
// store. try_pop_sc(): an acquire load, the move of T, a release store.
// Memory: capacity (a power of two) cells of T plus an 8-byte sequence each,
// the head and tail on their own cache lines.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mercury::worker {

template <typename T>
class RequestQueue {
 public:
  /// `capacity` is rounded up to a power of two (>= 2). Throws
  /// std::invalid_argument for 0 or more than 2^30.
  explicit RequestQueue(size_t capacity) {
    if (capacity == 0 || capacity > (size_t{1} << 30)) {
      throw std::invalid_argument("RequestQueue: capacity must be in [1, 2^30]");
    }
    const size_t n = std::bit_ceil(std::max<size_t>(capacity, 2));
    mask_ = n - 1;
    cells_ = std::make_unique<Cell[]>(n);
    for (size_t i = 0; i < n; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;
  ~RequestQueue() {
    while (try_pop_sc()) {
    }
  }

  [[nodiscard]] size_t capacity() const { return mask_ + 1; }

  /// Any thread. Moves `value` in and returns true, or returns false (value
  /// untouched) when the queue is full.
  bool try_push_mp(T& value) {
    size_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      // Acquire pairs with the consumer's release in try_pop_sc(): the cell's
      // previous value has been moved out and destroyed.
      const size_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          new (c.storage) T(std::move(value));
          // Release pairs with the consumer's acquire: the value is visible.
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;  // the cell still holds a value from one lap ago: full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  /// The one consumer thread: true when try_pop_sc() would return nothing.
  /// Acquire, like try_pop_sc().
  [[nodiscard]] bool empty_sc() const {
    return cells_[head_ & mask_].seq.load(std::memory_order_acquire) != head_ + 1;
  }

  /// The one consumer thread. The oldest published value, or nullopt when
  /// the next cell in order is not published yet (empty, or its producer is
  /// between claim and publish).
  std::optional<T> try_pop_sc() {
    Cell& c = cells_[head_ & mask_];
    const size_t seq = c.seq.load(std::memory_order_acquire);
    if (seq != head_ + 1) return std::nullopt;
    T* p = std::launder(reinterpret_cast<T*>(c.storage));
    std::optional<T> out(std::move(*p));
    p->~T();
    c.seq.store(head_ + mask_ + 1, std::memory_order_release);
    ++head_;
    return out;
  }

 private:
  struct Cell {
    std::atomic<size_t> seq{0};
    alignas(T) std::byte storage[sizeof(T)];
  };

  size_t mask_ = 0;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<size_t> tail_{0};  // producers
  alignas(64) size_t head_ = 0;              // the consumer only
};

}  // namespace mercury::worker
