// Handle: the result of a push, pull or push_pull, shared by the trainer
// thread that asked and the net core that finishes it.
//
// What it is for. Every trainer call returns a Handle at once; the transfer
// runs on the worker's net core. The trainer then either blocks in wait(),
// polls ready(), or registers on_complete(fn). The net core is the producer:
// it calls complete() or fail(message) exactly once per handle.
//
// Threads. A Handle is a copyable reference to one shared state (copies
// compare equal and see the same outcome). Any number of trainer threads may
// call wait(), ready(), ok(), error() and on_complete() on copies of the same
// handle at once, while the net core completes it. wait() blocks the calling
// thread in the kernel (a futex) after a few microseconds of pauses: it
// never spins a core. Callbacks run exactly once each: at once on the registering
// thread if the handle is already complete, otherwise on the completing
// thread (the net core), which is shared by every tensor of the process, so
// a callback must be short and must not block, wait on another handle, or
// throw: complete() and fail() are noexcept, so an exception escaping a
// callback run there terminates the process (one run at once by
// on_complete() propagates to its caller).
//
// Costs. Creating a handle allocates its state (trainer side). complete() /
// fail() on the net core do not allocate, lock or throw: one release store,
// one futex wake when someone waits, one exchange to take the callback list,
// and the callbacks themselves; fail() copies at most kMaxErrorBytes of the
// message into the state. on_complete() allocates one list node on the
// registering thread and pushes it with a CAS. A completed callback's node is
// freed on the thread that ran it. Dropping the last copy of a handle frees
// its state on whichever thread dropped it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

namespace mercury::worker {

/// Error texts longer than this are truncated (the state holds them inline,
/// so that failing on the net core never allocates).
inline constexpr size_t kMaxErrorBytes = 191;

class Handle {
 public:
  enum class Status : uint32_t { kPending = 0, kOk = 1, kFailed = 2 };

  /// A new, pending handle (allocates its shared state).
  Handle();
  /// A handle that is already complete (ok), e.g. a pull of a version that
  /// has already arrived.
  static Handle completed();

  // ---- trainer side: any thread, any number at once ----

  /// Blocks until the handle is complete (ok or failed); returns ok().
  bool wait() const;
  /// True once complete (ok or failed). Acquire: after it returns true the
  /// transferred bytes are visible to the caller.
  [[nodiscard]] bool ready() const;
  /// True if complete and successful.
  [[nodiscard]] bool ok() const;
  [[nodiscard]] Status status() const;
  /// Why it failed (e.g. naming the peer that failed); empty unless failed.
  [[nodiscard]] std::string_view error() const;
  /// Runs `fn(*this)` exactly once when the handle completes: now, on this
  /// thread, if it already has; otherwise on the completing thread (the net
  /// core), so `fn` must not block (see the file comment).
  void on_complete(std::function<void(const Handle&)> fn) const;

  // ---- producer side: the net core, exactly once per handle ----

  /// Completes successfully; runs the callbacks. Returns false (and counts
  /// it in extra_completions()) if the handle was already complete: a bug in
  /// the producer, asserted in debug builds.
  bool complete() const noexcept;
  /// Completes with an error; `message` is copied (truncated to
  /// kMaxErrorBytes). Same exactly-once rule as complete().
  bool fail(std::string_view message) const noexcept;

  /// Completions attempted after the first (should be 0).
  [[nodiscard]] uint64_t extra_completions() const;

  friend bool operator==(const Handle& a, const Handle& b) { return a.state_ == b.state_; }

 private:
  struct State;
  struct CallbackNode;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  bool finish(Status status, std::string_view message) const noexcept;

  std::shared_ptr<State> state_;
};

}  // namespace mercury::worker
