// Doorbell: what an idle node::Loop sleeps on, and what a producer on
// another thread rings to wake it (a trainer thread that queued a request
// for the worker's net core). A loop that nobody rings sleeps its timeout,
// as a timed sleep would.
//
// Threads: arm(), sleep() and disarm() belong to the loop's thread; ring()
// to any thread. Costs: arm() a store, a fence and a load; ring() a fence
// and a load, plus an increment and a futex wake when the loop sleeps.
#pragma once

#include <atomic>
#include <cstdint>

namespace mercury::node {

/// How an idle loop sleeps without making a producer's work wait for the end
/// of its sleep: it sleeps on a futex with a timeout (its timers still run),
/// and a producer that finds it asleep rings (one increment and one futex
/// wake; nothing when the loop is polling).
///
/// The lost-wake-up argument (a Dekker pair): the loop stores `sleeping`,
/// fences, reads the ticket, then checks the queue; a producer publishes its
/// request, fences, then reads `sleeping`. With both fences seq_cst, either
/// the loop sees the request (and does not sleep) or the producer sees
/// `sleeping` and rings, which changes the ticket, so the futex wait
/// returns at once.
class Doorbell {
 public:
  /// The loop's thread, before its last look at the queue. Returns the ticket to sleep on.
  uint32_t arm() {
    sleeping_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return word_.load(std::memory_order_relaxed);
  }
  /// The loop's thread: sleeps up to `timeout_us` unless rung since arm() (or a
  /// signal or spurious wake-up), then disarms.
  void sleep(uint32_t ticket, uint32_t timeout_us);
  void disarm() { sleeping_.store(false, std::memory_order_relaxed); }
  /// Any thread, after publishing a request.
  void ring() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!sleeping_.load(std::memory_order_relaxed)) return;
    word_.fetch_add(1, std::memory_order_relaxed);
    wake();
  }

 private:
  void wake();
  alignas(64) std::atomic<uint32_t> word_{0};
  std::atomic<bool> sleeping_{false};
};

}  // namespace mercury::node
