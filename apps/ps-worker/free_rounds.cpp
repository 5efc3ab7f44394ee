#include "free_rounds.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "../common/synthetic.h"
#include "reference.h"
#include "report.h"

namespace mercury::trainer {

namespace {

using Clock = std::chrono::steady_clock;

// A multiple of 2^-6 in [-1, 1].
float on_grid(apps::Noise& n) { return std::round(n.next() * 64.0f) / 64.0f; }

void grid_gradient(Floats& g, uint32_t rank, size_t tensor) {
  apps::Noise n{0x2545f4914f6cdd1dull * ((uint64_t{rank} + 1) * 1009 + tensor + 1)};
  for (float& x : g) x = on_grid(n);
}

// Whether an update depends on more than the gradient (state, or the decay's term of the
// parameters), so that updates applied in another order give other parameters.
bool stateful(const config::TrainingConfig& t) {
  return t.optimizer == config::Optimizer::kMomentum || t.optimizer == config::Optimizer::kAdam ||
         t.optimizer == config::Optimizer::kAdamW || t.weight_decay != 0;
}

}  // namespace

void grid_initial(Floats& p, size_t tensor) {
  apps::Noise n{0x6a09e667f3bcc909ull + tensor};
  for (float& x : p) x = on_grid(n);
}

bool free_rounds_checkable(const config::TrainingConfig& t) {
  if (t.optimizer == config::Optimizer::kSum) {
    throw std::runtime_error(
        "ps-worker --compute-ms checks the final parameters, which optimizer sum does not keep");
  }
  if (stateful(t) && (t.sync == config::Sync::kAsp || t.sync == config::Sync::kSsp)) {
    throw std::runtime_error(
        "ps-worker --compute-ms checks " + std::string(config::to_string(t.optimizer)) +
        " under psplus and bsp: " + std::string(config::to_string(t.sync)) +
        " sends each worker only the updates of its own pushes, so a worker reads the state "
        "after every push only by pushing once more, which moves the optimizer's state");
  }
  int exponent = 0;
  if (!stateful(t) && std::frexp(t.learning_rate, &exponent) != 0.5) {
    throw std::runtime_error(
        "ps-worker --compute-ms needs a learning rate that is a power of two (e.g. 0.0625), so "
        "that the final parameters are exact in any order; the job has " +
        std::to_string(t.learning_rate));
  }
  return t.sync != config::Sync::kPsPlus || t.staleness_lr == config::StalenessLr::kNone;
}

int run_free_rounds(worker::Worker& w, const config::TrainingConfig& t,
                    const std::vector<agg::TensorDecl>& decls, FreeBuffers b,
                    const FreeOptions& o) {
  const bool checkable = free_rounds_checkable(t);
  const uint32_t rank = w.rank();
  const uint32_t n = w.workers();
  const double factor = rank == o.straggler_rank ? o.straggler_factor : 1.0;
  const auto compute = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(o.compute_ms * factor));
  std::vector<Floats> grads(decls.size());
  std::vector<std::vector<uint16_t>> half_grads(decls.size());
  auto half = [&](size_t k) { return b.dtypes[k] != wire::Dtype::kFloat32; };
  for (size_t k = 0; k < decls.size(); ++k) {
    grads[k].resize(decls[k].elements);
    // Momentum and Adam: every rank the same gradient, so that every update
    // of a chunk is the same and the end state depends only on their count.
    grid_gradient(grads[k], stateful(t) ? 0 : rank, k);
    if (half(k)) {  // exact: the grid's values are bfloat16 and float16 values
      half_grads[k].resize(decls[k].elements);
      narrow(grads[k], half_grads[k], b.dtypes[k]);
    }
  }
  auto push_pull = [&](size_t k) {
    const auto key = static_cast<worker::Key>(k);
    return half(k) ? w.push_pull(key, half_grads[k], b.half_params[k])
                   : w.push_pull(key, grads[k], b.params[k]);
  };
  std::printf("%s: free-running rounds, compute %.1f ms a round%s, training.sync %s\n",
              o.node.c_str(), o.compute_ms * factor, factor != 1.0 ? " (the straggler)" : "",
              std::string(w.sync()).c_str());
  std::fflush(stdout);
  std::vector<worker::Handle> pending(decls.size());
  auto wait_all = [&](const char* what, uint32_t round) {
    for (size_t k = 0; k < decls.size(); ++k) {
      if (!pending[k].wait()) {
        std::fprintf(stderr, "ps-worker: %s %u, tensor %s: %s\n", what, round,
                     decls[k].name.c_str(), std::string(pending[k].error()).c_str());
        return false;
      }
    }
    return true;
  };
  double total_s = 0;
  // The version each tensor's last pull delivered: a later pull never
  // delivers an older one.
  std::vector<uint32_t> seen(decls.size(), 0);
  auto went_back = [&](const char* when) {
    for (size_t k = 0; k < decls.size(); ++k) {
      const uint32_t v = w.version(static_cast<worker::Key>(k));
      if (v < seen[k]) {
        std::fprintf(stderr, "ps-worker: %s: tensor %s: a pull delivered version %u after %u\n",
                     when, decls[k].name.c_str(), v, seen[k]);
        return true;
      }
      seen[k] = v;
    }
    return false;
  };
  auto round_start = Clock::now();
  for (uint32_t round = 0; round < o.rounds; ++round) {
    // Compute stands for the forward and backward passes: the trainer
    // sleeps, leaving the CPU to the net cores.
    std::this_thread::sleep_until(round_start + compute);
    for (size_t k = decls.size(); k-- > 0;) pending[k] = push_pull(k);
    if (!wait_all("round", round + 1)) return 1;
    const auto end = Clock::now();
    if (went_back("round")) return 1;
    const double secs = std::chrono::duration<double>(end - round_start).count();
    if (round > 0) total_s += secs;
    const worker::WorkerStats s = w.stats();
    std::printf(
        "%s round %3u: %7.3f s iteration (compute %.3f s), staleness max %llu, ssp waits %llu, "
        "retransmissions %llu\n",
        o.node.c_str(), round + 1, secs, std::chrono::duration<double>(compute).count(),
        static_cast<unsigned long long>(s.staleness_max),
        static_cast<unsigned long long>(s.ssp_waits),
        static_cast<unsigned long long>(s.retransmits));
    std::fflush(stdout);
    round_start = end;
  }

  // The end state. bsp: each round's pull was every rank's aggregate, the
  // last one is it. Otherwise every rank's every push is applied, or on its
  // way (psplus: acknowledged before the barrier, so applied before anything
  // pushed after it). sgd: one more push, of zeros, which changes nothing
  // and returns, once applied, the state after all of them (asp and ssp send
  // a worker only its own updates). momentum and adam (psplus): the version
  // every chunk reaches after the last push, which psplus sends to every
  // worker.
  const bool bsp = t.sync == config::Sync::kBsp;
  uint32_t after_all = o.rounds;
  if (!bsp) {
    w.barrier();
    after_all = n * o.rounds;
    if (!stateful(t)) {
      for (size_t k = decls.size(); k-- > 0;) {
        std::fill(grads[k].begin(), grads[k].end(), 0.0f);
        std::fill(half_grads[k].begin(), half_grads[k].end(), uint16_t{0});  // +0
        pending[k] = push_pull(k);
      }
      if (!wait_all("final push", 0)) return 1;
      ++after_all;
    }
    for (size_t k = 0; k < decls.size(); ++k) {
      const auto key = static_cast<worker::Key>(k);
      pending[k] =
          half(k) ? w.pull(key, b.half_params[k], after_all) : w.pull(key, b.params[k], after_all);
    }
    if (!wait_all("final pull", 0)) return 1;
  }
  if (went_back("final pull")) return 1;
  uint64_t wrong = 0, old = 0;
  if (checkable) {
    const Update u = Update::optimizer_of(t);
    std::vector<double> sum;
    Floats g, avg;
    for (size_t k = 0; k < decls.size(); ++k) {
      if (w.version(static_cast<worker::Key>(k)) < after_all) ++old;
      sum.assign(decls[k].elements, 0.0);
      g.resize(decls[k].elements);
      avg.assign(decls[k].elements, 0.0f);
      for (uint32_t r = 0; r < n; ++r) {
        grid_gradient(g, stateful(t) ? 0 : r, k);
        for (size_t i = 0; i < g.size(); ++i) {
          sum[i] += g[i];
          avg[i] = r == 0 ? g[i] : avg[i] + g[i];  // rank order, in float, as the servers add
        }
      }
      Floats want(decls[k].elements);
      grid_initial(want, k);
      if (bsp || stateful(t)) {
        // Replayed update by update as the servers compute them (reference.h):
        // bsp the rank-order sum times 1/N each round (1/N need not be a power
        // of two), the asynchronous modes one rank's gradient per update.
        // (Momentum and Adam: g is every rank's gradient.)
        if (bsp) {
          const float scale = 1.0f / static_cast<float>(n);
          for (float& x : avg) x = x * scale;
        }
        OptState state;
        const uint32_t updates = bsp ? o.rounds : n * o.rounds;
        for (uint32_t r = 0; r < updates; ++r) apply(want, bsp ? avg : g, u, state);
      } else {
        const double step = t.learning_rate * o.rounds;
        for (size_t i = 0; i < want.size(); ++i) {
          want[i] = static_cast<float>(static_cast<double>(want[i]) - step * sum[i]);
        }
      }
      // A half-precision tensor holds the float32 end state rounded once.
      if (half(k)) quantize(want, b.dtypes[k]);
      auto got = [&](size_t i) {
        return half(k) ? widened(b.half_params[k][i], b.dtypes[k]) : b.params[k][i];
      };
      // Exactly equal as numbers: the servers' order of operations may give
      // -0 where this sum gives +0, every other value has one encoding.
      size_t i = 0;
      while (i < want.size() && want[i] == got(i)) ++i;
      if (i != want.size()) {
        ++wrong;
        std::fprintf(stderr, "ps-worker: %s: tensor %s (%s) element %zu is %.9g, not %.9g\n",
                     o.node.c_str(), decls[k].name.c_str(),
                     std::string(wire::dtype_name(b.dtypes[k])).c_str(), i,
                     static_cast<double>(got(i)), static_cast<double>(want[i]));
      }
    }
  }
  w.barrier();  // nobody leaves before every rank has its final parameters
  const worker::WorkerStats s = w.stats();
  const uint32_t timed = o.rounds > 1 ? o.rounds - 1 : 1;
  std::printf(
      "%s: done, %u free-running rounds, mean iteration %.4f s (rounds 2..%u), pushes stale %llu "
      "(staleness sum %llu, max %llu), ssp waits %llu (gap max %llu), %s, %s\n",
      o.node.c_str(), o.rounds, total_s / timed, o.rounds,
      static_cast<unsigned long long>(s.stale_pushes),
      static_cast<unsigned long long>(s.staleness_sum),
      static_cast<unsigned long long>(s.staleness_max),
      static_cast<unsigned long long>(s.ssp_waits), static_cast<unsigned long long>(s.ssp_gap_max),
      !checkable ? "final parameters not checked (psplus scales stale updates' learning rate)"
      : wrong == 0 && old == 0 ? "the final parameters exact"
                               : "MISMATCH",
      drops_text(w).c_str());
  std::fflush(stdout);
  if (checkable && (wrong != 0 || old != 0)) {
    std::fprintf(
        stderr, "ps-worker: %llu tensors differ from the reference, %llu older than version %u\n",
        static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(old), after_all);
    return 1;
  }
  return 0;
}

}  // namespace mercury::trainer
