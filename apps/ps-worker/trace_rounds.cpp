#include "trace_rounds.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
  void run(int64_t ns, bool after_wait) {
    end_ = (after_wait ? std::max(end_, now_ns()) : end_) + ns;
    const timespec until{static_cast<time_t>(end_ / 1'000'000'000),
                         static_cast<long>(end_ % 1'000'000'000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
    }
  }

 private:
  int64_t end_ = 0;
};

struct Spread {
  double median = 0, min = 0, max = 0;
};

// Over v[from...]; v[from...] must not be empty.
Spread spread_of(std::vector<double> v, size_t from) {
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(from));
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {median, v.front(), v.back()};
}

// "rounds 2-10" / "round 1": the rounds a median was taken over (1-based).
std::string rounds_text(size_t from, size_t count) {
  return from + 1 == count ? "round " + std::to_string(count)
                           : "rounds " + std::to_string(from + 1) + "-" + std::to_string(count);
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
                     const std::vector<agg::TensorDecl>& decls,
                     std::vector<std::vector<float>>& params,
                     std::vector<std::vector<float>>& reference, const Update& update,
                     const TraceOptions& o) {
  const uint32_t rank = w.rank();
  const uint32_t n = w.workers();
  const size_t tensors = decls.size();
  const char* node = o.node.c_str();
  // Sleeps end within a microsecond or so of their deadline instead of the
  // default 50 us of timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  // The two gradient sets, by round parity: round r pushes grads[r % 2].
  std::vector<std::vector<float>> grads[2];
  for (uint32_t s = 0; s < 2; ++s) {
    grads[s].resize(tensors);
    for (size_t k = 0; k < tensors; ++k) {
      grads[s][k].resize(decls[k].elements);
      gradient(grads[s][k], rank, s, k);
    }
  }
  std::vector<float> avg;
  auto mismatches = [&] {
    uint64_t wrong = 0;
    for (size_t k = 0; k < tensors; ++k) {
      wrong += std::memcmp(params[k].data(), reference[k].data(), reference[k].size() * 4) != 0;
    }
    return wrong;
  };
  std::vector<worker::Handle> pending(tensors);

  // Communication alone: every tensor pushed and pulled at once, as the
  // synthetic rounds do, after a barrier.
  std::vector<double> comm_s;
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
      average(avg, n, round % 2, k, grads[round % 2][k], rank);
      apply(reference[k], avg, update);
    }
    const uint64_t wrong = o.check_comm_rounds ? mismatches() : 0;
    std::printf("%s comm round %3u: %7.3f s  %s  retransmissions %llu\n", node, round + 1,
                comm_s.back(),
                !o.check_comm_rounds ? "not checked"
                : wrong == 0         ? "every aggregate exact"
                                     : "MISMATCH",
                static_cast<unsigned long long>(w.stats().retransmits));
    std::fflush(stdout);
    if (wrong != 0) {
      std::fprintf(stderr, "ps-worker: comm round %u: %llu tensors differ from the reference\n",
                   round + 1, static_cast<unsigned long long>(wrong));
      return 1;
    }
  }

  // The trace rounds. Nothing but waits, sleeps and push_pull calls runs on
  // the clock; every rank starts together.
  w.barrier();
  ComputeStream gpu;
  gpu.restart();
  std::vector<double> round_s, waited_s;
  int64_t round_start = now_ns();
  for (uint32_t i = 0; i < o.rounds; ++i) {
    const uint32_t round = o.comm_rounds + i;  // its gradient set and its place in the reference
    int64_t waited = 0;
    for (const trace::Layer& l : t.layers) {
      bool blocked = false;
      for (uint32_t k = l.first_tensor; k < l.first_tensor + l.tensors; ++k) {
        if (!pending[k].ready()) {
          const int64_t from = now_ns();
          pending[k].wait();
          waited += now_ns() - from;
          blocked = true;
        }
        if (failed(pending[k], o.node, "trace", i + 1, decls[k].name)) return 1;
      }
      gpu.run(static_cast<int64_t>(l.forward_us * o.scale * 1e3), blocked);
    }
    for (size_t j = t.layers.size(); j-- > 0;) {
      const trace::Layer& l = t.layers[j];
      gpu.run(static_cast<int64_t>(l.backward_us * o.scale * 1e3), false);
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

  // Every trace round's update, replayed here: the final parameters must be
  // exactly what they lead to (with sum only, the last round's aggregate).
  for (size_t k = 0; k < tensors; ++k) {
    std::vector<float> by_parity[2];
    for (uint32_t s = 0; s < 2; ++s) average(by_parity[s], n, s, k, grads[s][k], rank);
    const uint32_t end = o.comm_rounds + o.rounds;
    const uint32_t first = update.sum_only       ? end - 1
                           : o.check_comm_rounds ? o.comm_rounds
                                                 : 0;  // the comm rounds' updates too
    for (uint32_t round = first; round < end; ++round) {
      apply(reference[k], by_parity[round % 2], update);
    }
  }
  const uint64_t wrong = mismatches();

  const size_t warm = round_s.size() > 1 ? 1 : 0;
  const size_t comm_warm = comm_s.size() > 1 ? 1 : 0;
  const Spread iteration = spread_of(round_s, warm);
  const Spread waits = spread_of(waited_s, warm);
  const double compute_s = t.compute_us() * o.scale / 1e6;
  const Spread comm = comm_s.empty() ? Spread{} : spread_of(comm_s, comm_warm);
  const double bound = std::max(compute_s, comm.median);
  std::printf(
      "%s: iteration %.3f s, compute %.3f s, communication %.3f s, lower bound %.3f s, "
      "ratio %.3f\n",
      node, iteration.median, compute_s, comm.median, bound, iteration.median / bound);
  std::printf(
      "%s: iteration: median of trace %s [%.3f, %.3f], waiting for parameters %.3f s of it; "
      "communication: median of comm-only %s [%.3f, %.3f]; compute: %s's %.1f ms x %g; "
      "the last round's parameters arrived %.3f s after its backward pass\n",
      node, rounds_text(warm, round_s.size()).c_str(), iteration.min, iteration.max, waits.median,
      comm_s.empty() ? "rounds (none)" : rounds_text(comm_warm, comm_s.size()).c_str(), comm.min,
      comm.max, t.source.c_str(), t.compute_us() / 1e3, o.scale, drain_s);
  std::fflush(stdout);
  if (wrong != 0) {
    std::fprintf(stderr,
                 "ps-worker: after the trace rounds %llu tensors differ from the reference\n",
                 static_cast<unsigned long long>(wrong));
    return 1;
  }
  std::printf(
      "%s: final parameters exact (%s)\n", node,
      update.sum_only ? "the last trace round's aggregate" : "every trace round's update applied");
  return 0;
}

}  // namespace mercury::trainer
