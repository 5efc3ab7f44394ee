// Timeline: one worker's iterations as a Chrome trace (chrome://tracing,
// https://ui.perfetto.dev), the way BytePS's timeline shows them: a row per
// tensor, in priority order, with the phases of each iteration's transfer,
// and a row per trainer track (forward, backward, compute) with the spans the
// trainer records.
//
// What a tensor's row shows, per iteration i (docs/timeline.md):
//   queued     the push request was taken by the net core -> its first block
//              was handed to the transport (it waits for version i and for
//              the tensor's previous push to settle)
//   push       first block handed to the transport -> every block acknowledged
//              by the servers: the gradient's time in the scheduler and on the
//              wire, behind more urgent tensors
//   aggregate  acknowledged -> the first chunk of version i + 1 arrives: the
//              servers wait for every worker's copy, reduce, update and send
//   pull       first chunk of version i + 1 -> its last chunk is in the
//              trainer's buffer
// A phase whose end came before its start (a chunk can overtake the last
// acknowledgement) is left out.
//
// Threads and costs. mark_st() belongs to the net core: it appends 24 bytes
// to a buffer reserved at construction and reads CLOCK_MONOTONIC (vDSO); no
// allocation, no lock; when the buffer is full the event is counted in
// dropped() instead. span() is for trainer threads: a mutex and an
// allocation per call (control path), at most kMaxSpans kept (then counted
// in dropped()). write() runs once the net core has
// stopped. Timestamps are CLOCK_MONOTONIC, the clock of Python's
// time.monotonic_ns() and of std::chrono::steady_clock on Linux, so traces of
// processes on one machine line up; across machines they do not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/owner.h"
#include "worker/tensor_table.h"

namespace mercury::worker {

class Timeline {
 public:
  enum class Mark : uint8_t { kRequested, kSending, kPushed, kFirstChunk, kComplete };

  /// Events reserved by default: 1 M (24 MB), about 200 k tensor-iterations.
  static constexpr size_t kDefaultEvents = size_t{1} << 20;
  /// Trainer spans kept at most (about 100 MB); later ones are counted.
  static constexpr size_t kMaxSpans = size_t{1} << 21;

  /// A timeline written to `path` at the end, for worker `node` (rank
  /// `rank`: its process id in the trace). Reserves `events` events.
  Timeline(std::string path, std::string node, uint32_t rank, size_t events = kDefaultEvents);

  /// CLOCK_MONOTONIC in nanoseconds.
  static uint64_t now_ns() noexcept;

  /// Net core: tensor `t`'s iteration `iteration` reached `mark` now.
  void mark_st(TensorId t, uint32_t iteration, Mark mark) noexcept {
    MERCURY_OWNED(owner_);
    if (events_.size() == events_.capacity()) {
      ++dropped_;
      return;
    }
    events_.push_back(Event{now_ns(), t, iteration, mark});
  }

  /// Any trainer thread: a span [begin_ns, end_ns) named `name` on the
  /// trainer's row `track` (rows appear in the order first used).
  void span(std::string_view name, std::string_view track, uint64_t begin_ns, uint64_t end_ns);

  /// After the net core has stopped: writes the trace; returns "" or why it
  /// could not (the file's path and the error).
  [[nodiscard]] std::string write(const TensorTable& table) const;

  [[nodiscard]] const std::string& path() const { return path_; }
  /// Events and spans that did not fit. After the net core has stopped.
  [[nodiscard]] uint64_t dropped() const {
    std::lock_guard lock(mutex_);
    return dropped_ + dropped_spans_;
  }

 private:
  struct Event {
    uint64_t ns;
    TensorId tensor;
    uint32_t iteration;
    Mark mark;
  };
  struct Span {
    std::string name;
    uint32_t track;
    uint64_t begin_ns, end_ns;
  };

  std::string path_;
  std::string node_;
  uint32_t rank_;
  std::vector<Event> events_;  // net core
  base::Owner owner_;          // the net core (mark_st)
  uint64_t dropped_ = 0;       // net core
  mutable std::mutex mutex_;   // the trainer's spans and tracks
  std::vector<Span> spans_;
  uint64_t dropped_spans_ = 0;
  std::vector<std::string> tracks_;
};

}  // namespace mercury::worker
