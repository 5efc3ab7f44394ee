// Published<T>: a copy of an lcore's counters that other threads may read.
//
// What it is for. Datapath structures keep their counters as plain fields
// read with *_st() accessors by their owning lcore only (an Endpoint's,
// a ServerNode's). A stats printer or the telemetry thread needs them too.
// The owner calls publish_st() now and then (e.g. every 100 ms of its poll
// loop); readers call read() at any time.
//
// T must be a trivially copyable aggregate of 64-bit counters (uint64_t
// fields and arrays of them, as EndpointCounters and ServerCounters are).
// Both sides copy it word by word with relaxed atomic accesses, so a reader
// sees every counter whole, possibly from two consecutive publications
// (counters only grow, so a torn snapshot is still a valid lower bound).
//
// Threads: one writer (the owning lcore), any number of readers. Cost of
// publish_st: sizeof(T) / 8 relaxed stores; no lock, no allocation.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "base/owner.h"

namespace mercury::base {

template <typename T>
class Published {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(sizeof(T) % sizeof(uint64_t) == 0, "T must be made of 64-bit counters");
  static constexpr size_t kWords = sizeof(T) / sizeof(uint64_t);

 public:
  /// Owner only.
  void publish_st(const T& value) {
    MERCURY_OWNED(writer_);
    const auto w = std::bit_cast<std::array<uint64_t, kWords>>(value);
    for (size_t i = 0; i < kWords; ++i) words_[i].store(w[i], std::memory_order_relaxed);
  }

  /// The writer changes (its thread has stopped).
  void hand_over() { writer_.hand_over(); }

  /// Any thread.
  [[nodiscard]] T read() const {
    std::array<uint64_t, kWords> w;
    for (size_t i = 0; i < kWords; ++i) w[i] = words_[i].load(std::memory_order_relaxed);
    return std::bit_cast<T>(w);
  }

 private:
  std::array<std::atomic<uint64_t>, kWords> words_{};
  base::Owner writer_;
};

}  // namespace mercury::base
