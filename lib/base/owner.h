// The thread contract, asserted: a single-threaded object's owner.
//
// What it is for. A function whose name ends in _st may run on one thread
// only: the object's owner (its poll loop's thread, or the control thread
// before the loop starts). The suffix says so; base::Owner checks it. An
// object with _st functions holds an Owner and opens each public _st entry
// point with MERCURY_OWNED(owner_): the first call claims the object for the
// calling thread, and a later call from any other thread aborts the process
// with the function's name and both threads' ids (eRPC's
// assert(in_dispatch()), made to name the culprit).
//
// Hand-over. Ownership moves only at points the code names: hand_over()
// leaves the object unclaimed (the next _st call claims it), as when a node
// built on the control thread starts its loop on another thread, or a shard
// is attached to its shard core. Loop::run() hands its pollers over to the
// loop's thread before the first pass.
//
// Cost. With MERCURY_OWNER_CHECKS (meson option owner_checks; on in builds
// that build the tests, docs/node.md), a check is one relaxed load, a
// pthread_self() and a compare; the first call a compare-and-swap. Without
// it, Owner is empty and MERCURY_OWNED compiles to nothing.
//
// Threads: check() and hand_over() from any thread (that is the point);
// owner() for messages and tests.
#pragma once

#include <cstdint>

#ifndef MERCURY_OWNER_CHECKS
#define MERCURY_OWNER_CHECKS 0
#endif

#if MERCURY_OWNER_CHECKS
#include <pthread.h>

#include <atomic>
#endif

namespace mercury::base {

/// Aborts: `function` was called on thread `caller`, the object belongs to
/// thread `owner`. Prints one line to stderr first.
[[noreturn]] void wrong_thread(const char* function, uint64_t owner, uint64_t caller) noexcept;

#if MERCURY_OWNER_CHECKS

inline constexpr bool kOwnerChecks = true;

class Owner {
 public:
  Owner() = default;
  // A copy or move of an object belongs to whoever uses it next.
  Owner(const Owner&) noexcept {}
  Owner& operator=(const Owner&) noexcept { return *this; }

  /// The calling thread may run this object's _st functions: it claims an
  /// unclaimed object; another thread's object aborts (wrong_thread).
  void check(const char* function) const noexcept {
    const uint64_t me = self();
    uint64_t owner = owner_.load(std::memory_order_relaxed);
    if (owner == me) return;
    // Relaxed: the claim publishes nothing; the object's data reached this
    // thread through whatever handed it over (a ring, a launch, a join).
    if (owner == 0 && owner_.compare_exchange_strong(owner, me, std::memory_order_relaxed)) return;
    if (owner != me) wrong_thread(function, owner, me);
  }
  /// Leaves the object unclaimed: its next _st call claims it.
  void hand_over() noexcept { owner_.store(0, std::memory_order_relaxed); }
  /// The owning thread's id (pthread_self), 0 while unclaimed.
  [[nodiscard]] uint64_t owner() const noexcept { return owner_.load(std::memory_order_relaxed); }

  static uint64_t self() noexcept { return static_cast<uint64_t>(pthread_self()); }

 private:
  mutable std::atomic<uint64_t> owner_{0};
};

#define MERCURY_OWNED(owner) (owner).check(__func__)

#else

inline constexpr bool kOwnerChecks = false;

class Owner {
 public:
  void check(const char*) const noexcept {}
  void hand_over() noexcept {}
  [[nodiscard]] uint64_t owner() const noexcept { return 0; }
};

// Names the field (so an Owner used only here is not an unused field) and
// compiles to nothing.
#define MERCURY_OWNED(owner) static_cast<void>(owner)

#endif

}  // namespace mercury::base
