#include "trace_rounds.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace mercury::trainer {

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// The emulated accelerator: one stream of work, each piece starting where the
// previous one ended, or, when the trainer had to wait before launching it,
// when it launched it. The trainer thread sleeps until the piece's end (an
// absolute deadline, so a late wake-up is not carried into the next piece).
class ComputeStream {
 public:
  void restart() { end_ = now_ns(); }
  /// Returns when the piece began (its end is end()).
  int64_t run(int64_t ns, bool after_wait) {
    const int64_t begin = after_wait ? std::max(end_, now_ns()) : end_;
    end_ = begin + ns;
    const timespec until{static_cast<time_t>(end_ / 1'000'000'000),
                         static_cast<long>(end_ % 1'000'000'000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
    }
    return begin;
  }
  [[nodiscard]] int64_t end() const { return end_; }

 private:
  int64_t end_ = 0;
};

struct Spread {
  double median = 0, min = 0, max = 0, mean = 0;
};

// Over v[from...]; v[from...] must not be empty.
Spread spread_of(std::vector<double> v, size_t from) {
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(from));
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {median, v.front(), v.back(), std::accumulate(v.begin(), v.end(), 0.0) / n};
}

// "rounds 2-10" / "round 1": the rounds a median was taken over (1-based).
std::string rounds_text(size_t from, size_t count) {
  return from + 1 == count ? "round " + std::to_string(count)
                           : "rounds " + std::to_string(from + 1) + "-" + std::to_string(count);
}

// A 64-bit digest of a tensor's bytes: four independent multiply-xorshift
// lanes over 8-byte words, so that reading 100 MB costs tens of
// milliseconds, not the second that recomputing its reference would.
uint64_t digest(std::span<const float> v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size_bytes();
  uint64_t h[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                   0x082efa98ec4e6c89ull};
  auto mix = [](uint64_t x, uint64_t w) {
    x = (x ^ w) * 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 29);
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (size_t l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = mix(h[l], w);
    }
  }
  for (; i < n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    h[0] = mix(h[0], w);
  }
  return mix(mix(mix(h[0], h[1]), h[2]), h[3] ^ n);
}

bool failed(const worker::Handle& h, const std::string& node, const char* phase, uint32_t round,
            const std::string& tensor) {
  if (h.ok()) return false;
  std::fprintf(stderr, "ps-worker: %s %s round %u, tensor %s: %s\n", node.c_str(), phase, round,
               tensor.c_str(), std::string(h.error()).c_str());
  return true;
}

}  // namespace

int run_trace_rounds(worker::Worker& w, const trace::Trace& t,
                     const std::vector<agg::TensorDecl>& decls, std::vector<Floats>& params,
                     std::vector<Floats>& reference, const Update& update, const TraceOptions& o) {
  const uint32_t rank = w.rank();
  const uint32_t n = w.workers();
  const size_t tensors = decls.size();
  const char* node = o.node.c_str();
  // Sleeps end within a microsecond or so of their deadline instead of the
  // default 50 us of timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  // The two gradient sets, by round parity: round r pushes grads[r % 2].
  // Unchecked (--verify none), each tensor's gradient is its own parameter
  // buffer, already faulted in: the bytes moved are the same, and fresh memory
  // costs seconds per 100 MB to fault in on these VMs, even for reading (this
  // kernel maps no zero page). Only the net core touches that buffer: it reads
  // the push (or its resends) and writes the pull, and under BSP a chunk's
  // aggregate comes back only after every worker's copy of it has arrived, so
  // a resend that reads the new values is a duplicate the server drops.
  std::vector<Floats> owned[2];
  std::vector<std::span<const float>> grads[2];
  for (uint32_t s = 0; s < 2; ++s) {
    grads[s].resize(tensors);
    if (o.check_final) owned[s].resize(tensors);
    for (size_t k = 0; k < tensors; ++k) {
      if (o.check_final) {
        owned[s][k].resize(decls[k].elements);
        gradient(owned[s][k], rank, s, k);
        grads[s][k] = owned[s][k];
      } else {
        grads[s][k] = params[k];
      }
    }
  }
  auto mismatches = [&] {
    uint64_t wrong = 0;
    for (size_t k = 0; k < tensors; ++k) {
      wrong += std::memcmp(params[k].data(), reference[k].data(), reference[k].size() * 4) != 0;
    }
    return wrong;
  };
  // Every parameter is in place before the first round (version 0).
  std::vector<worker::Handle> pending(tensors, worker::Handle::completed());

  // Communication alone: every tensor pushed and pulled at once, as the
  // synthetic rounds do, after a barrier. Nothing heavier than a digest of
  // the aggregates runs between these rounds, as nothing runs between the
  // trace rounds: the references (a second or more of CPU per round for
  // ResNet-50, on CPUs the net cores share) are computed after the trace
  // rounds and compared with the digests then.
  std::vector<double> comm_s;
  std::vector<std::vector<uint64_t>> comm_digest(o.comm_rounds, std::vector<uint64_t>(tensors));
  for (uint32_t round = 0; round < o.comm_rounds; ++round) {
    w.barrier();
    const int64_t start = now_ns();
    for (size_t k = tensors; k-- > 0;) {
      pending[k] = w.push_pull(static_cast<worker::Key>(k), grads[round % 2][k], params[k]);
    }
    for (size_t k = 0; k < tensors; ++k) {
      pending[k].wait();
      if (failed(pending[k], o.node, "comm", round + 1, decls[k].name)) return 1;
    }
    comm_s.push_back(seconds(now_ns() - start));
    for (size_t k = 0; k < tensors && o.check_comm_rounds; ++k) {
      comm_digest[round][k] = digest(params[k]);
    }
    std::printf("%s comm round %3u: %7.3f s  retransmissions %llu\n", node, round + 1,
                comm_s.back(), static_cast<unsigned long long>(w.stats().retransmits));
    std::fflush(stdout);
  }

  // Communication alone, streamed: no barrier between rounds; in each pass,
  // every tensor in forward order waits for its previous round's aggregate
  // and is pushed again at once, so consecutive rounds overlap as far as BSP
  // allows, as they do in training. A round's time is the gap between the
  // ends of successive passes. Each pass moves a round's data, but the
  // first also fills the pipeline and the last (no pushes: it only waits
  // for the last round) finds most of it already moved, since that round's
  // first tensors overtook the round before's last ones (priority): the
  // median is taken over the passes between. A burst round above also
  // counts the time the job takes to fill and drain, which the trace rounds
  // partly hide; the bound takes the faster of the two.
  std::vector<double> stream_s;
  int64_t pass_end = now_ns();
  for (uint32_t p = 0; p <= o.comm_rounds && o.comm_rounds > 0; ++p) {
    const uint32_t round = o.comm_rounds + p;
    for (size_t k = 0; k < tensors; ++k) {
      pending[k].wait();
      if (failed(pending[k], o.node, "streamed comm", p, decls[k].name)) return 1;
      if (p < o.comm_rounds) {
        pending[k] = w.push_pull(static_cast<worker::Key>(k), grads[round % 2][k], params[k]);
      }
    }
    const int64_t end = now_ns();
    if (p > 0) {
      stream_s.push_back(seconds(end - pass_end));
      std::printf("%s streamed comm round %3u: %7.3f s  retransmissions %llu%s\n", node, p,
                  stream_s.back(), static_cast<unsigned long long>(w.stats().retransmits),
                  p == o.comm_rounds && p > 1 ? "  (the drain: not counted)" : "");
      std::fflush(stdout);
    }
    pass_end = end;
  }
  std::vector<uint64_t> stream_digest(tensors);
  for (size_t k = 0; k < tensors && o.check_comm_rounds; ++k) {
    stream_digest[k] = digest(params[k]);
  }
  const uint32_t first_trace_round = 2 * o.comm_rounds;

  // The trace rounds. Nothing but waits, sleeps and push_pull calls runs on
  // the clock; every rank starts together.
  w.barrier();
  // With a timeline (MERCURY_TIMELINE), each layer's compute and each wait
  // for parameters become the trainer's rows, beside the tensors' phases.
  const bool timeline = w.timeline_enabled();
  const bool async = w.sync() != "bsp";
  ComputeStream gpu;
  gpu.restart();
  std::vector<double> round_s, waited_s;
  int64_t round_start = now_ns();
  for (uint32_t i = 0; i < o.rounds; ++i) {
    const uint32_t round = first_trace_round + i;  // its gradient set and place in the reference
    int64_t waited = 0;
    for (const trace::Layer& l : t.layers) {
      bool blocked = false;
      for (uint32_t k = l.first_tensor; k < l.first_tensor + l.tensors; ++k) {
        if (!pending[k].ready()) {
          const int64_t from = now_ns();
          pending[k].wait();
          const int64_t to = now_ns();
          waited += to - from;
          blocked = true;
          if (timeline) {
            w.timeline_span(l.name, "wait", static_cast<uint64_t>(from), static_cast<uint64_t>(to));
          }
        }
        if (failed(pending[k], o.node, "trace", i + 1, decls[k].name)) return 1;
        // The version this layer computes with: its gradient's base.
        if (async) w.mark_read(static_cast<worker::Key>(k));
      }
      // Round 1's forward pass finds every parameter in place (version 0, or
      // the comm-only rounds' last aggregate) and overlaps no communication:
      // unless it is the only round (then the one timed) or a rank straggles
      // (whose lag behind the others it starts), it is not computed.
      if (i == 0 && o.rounds > 1 && o.ranks_alike) continue;
      const int64_t began = gpu.run(static_cast<int64_t>(l.forward_us * o.scale * 1e3), blocked);
      if (timeline) {
        w.timeline_span(l.name, "forward", static_cast<uint64_t>(began),
                        static_cast<uint64_t>(gpu.end()));
      }
    }
    for (size_t j = t.layers.size(); j-- > 0;) {
      const trace::Layer& l = t.layers[j];
      const int64_t began = gpu.run(static_cast<int64_t>(l.backward_us * o.scale * 1e3), false);
      if (timeline) {
        w.timeline_span(l.name, "backward", static_cast<uint64_t>(began),
                        static_cast<uint64_t>(gpu.end()));
      }
      for (uint32_t k = l.first_tensor + l.tensors; k-- > l.first_tensor;) {
        pending[k] = w.push_pull(static_cast<worker::Key>(k), grads[round % 2][k], params[k]);
      }
    }
    // The next forward pass starts now: this round ends here.
    const int64_t end = now_ns();
    round_s.push_back(seconds(end - round_start));
    waited_s.push_back(seconds(waited));
    round_start = end;
    std::printf("%s trace round %3u: %7.3f s  waited %.3f s for parameters  retransmissions %llu\n",
                node, i + 1, round_s.back(), waited_s.back(),
                static_cast<unsigned long long>(w.stats().retransmits));
    std::fflush(stdout);
  }
  // The last round's parameters, as the next forward pass would wait for them.
  for (size_t k = 0; k < tensors; ++k) {
    pending[k].wait();
    if (failed(pending[k], o.node, "trace", o.rounds, decls[k].name)) return 1;
  }
  const double drain_s = seconds(now_ns() - round_start);

  // Every round's update, replayed here, off the clock: each comm-only
  // round's aggregates must have the digests taken then, and the final
  // parameters must be exactly what every trace round's update leads to
  // (with sum only, the last round's aggregate).
  const uint32_t end = first_trace_round + o.rounds;
  const uint32_t last_streamed = first_trace_round - 1;
  std::vector<uint32_t> comm_wrong(o.comm_rounds + 1);  // the burst rounds, then the streamed
  Floats other;
  for (size_t k = 0; k < tensors && o.check_final; ++k) {
    Floats by_parity[2];
    for (uint32_t s = 0; s < 2; ++s) average(by_parity[s], other, n, s, k, grads[s][k], rank);
    OptState state;  // the servers' optimizer state of this tensor, replayed
    for (uint32_t round = 0; round < end; ++round) {
      const bool digested =
          o.check_comm_rounds && (round < o.comm_rounds || round == last_streamed);
      if (update.sum_only && !digested && round + 1 < end) {
        continue;  // with sum only, nothing carries over from round to round
      }
      apply(reference[k], by_parity[round % 2], update, state);
      if (digested) {
        const uint64_t want = round < o.comm_rounds ? comm_digest[round][k] : stream_digest[k];
        comm_wrong[std::min(round, o.comm_rounds)] += digest(reference[k]) != want;
      }
    }
  }
  const uint64_t wrong = o.check_final ? mismatches() : 0;

  const size_t warm = round_s.size() > 1 ? 1 : 0;
  const size_t comm_warm = comm_s.size() > 1 ? 1 : 0;
  const Spread iteration = spread_of(round_s, warm);
  const Spread waits = spread_of(waited_s, warm);
  const double compute_s = t.compute_us() * o.scale / 1e6;
  if (o.comm_rounds == 0) {
    // No comm-only rounds: the iteration alone (a run whose bound another
    // run measures).
    std::printf(
        "%s: iteration %.3f s, compute %.3f s, communication not measured (--comm-rounds 0)\n",
        node, iteration.median, compute_s);
    std::printf(
        "%s: iteration: median of trace %s [%.3f, %.3f], mean %.3f, waiting for parameters %.3f s "
        "of it; compute: %s's %.1f ms x %g; the last round's parameters arrived %.3f s after its "
        "backward pass\n",
        node, rounds_text(warm, round_s.size()).c_str(), iteration.min, iteration.max,
        iteration.mean, waits.median, t.source.c_str(), t.compute_us() / 1e3, o.scale, drain_s);
    std::fflush(stdout);
  } else {
    const Spread comm = spread_of(comm_s, comm_warm);
    // Passes 1..N: without the drain (N) when there is another, then without
    // the first when there is another.
    if (stream_s.size() > 1) stream_s.pop_back();
    const size_t stream_warm = stream_s.size() > 1 ? 1 : 0;
    const Spread stream = spread_of(stream_s, stream_warm);
    const double communication = std::min(comm.median, stream.median);
    const double bound = std::max(compute_s, communication);
    std::printf(
        "%s: iteration %.3f s, compute %.3f s, communication %.3f s, lower bound %.3f s, "
        "ratio %.3f\n",
        node, iteration.median, compute_s, communication, bound, iteration.median / bound);
    std::printf(
        "%s: iteration: median of trace %s [%.3f, %.3f], mean %.3f, waiting for parameters %.3f s "
        "of it; "
        "communication: the faster of burst %.3f s (median of comm-only %s [%.3f, %.3f]) and "
        "streamed %.3f s (median of %s [%.3f, %.3f]); compute: %s's %.1f ms x %g; "
        "the last round's parameters arrived %.3f s after its backward pass\n",
        node, rounds_text(warm, round_s.size()).c_str(), iteration.min, iteration.max,
        iteration.mean, waits.median, comm.median, rounds_text(comm_warm, comm_s.size()).c_str(),
        comm.min, comm.max, stream.median, rounds_text(stream_warm, stream_s.size()).c_str(),
        stream.min, stream.max, t.source.c_str(), t.compute_us() / 1e3, o.scale, drain_s);
    std::fflush(stdout);
  }
  for (uint32_t round = 0; round <= o.comm_rounds && o.check_comm_rounds; ++round) {
    if (comm_wrong[round] != 0) {
      std::fprintf(stderr, "ps-worker: %s: %u tensors differ from the reference\n",
                   round < o.comm_rounds ? ("comm round " + std::to_string(round + 1)).c_str()
                                         : "the last streamed comm round",
                   comm_wrong[round]);
      return 1;
    }
  }
  if (o.check_comm_rounds && o.comm_rounds > 0) {
    std::printf(
        "%s: comm-only %s and the last streamed round: every aggregate exact (each tensor's "
        "digest)\n",
        node, rounds_text(0, o.comm_rounds).c_str());
  }
  if (wrong != 0) {
    std::fprintf(stderr,
                 "ps-worker: after the trace rounds %llu tensors differ from the reference\n",
                 static_cast<unsigned long long>(wrong));
    return 1;
  }
  if (!o.check_final) {
    std::printf("%s: final parameters not checked (--verify none)\n", node);
    return 0;
  }
  std::printf(
      "%s: final parameters exact (%s)\n", node,
      update.sum_only ? "the last trace round's aggregate" : "every trace round's update applied");
  return 0;
}

}  // namespace mercury::trainer
