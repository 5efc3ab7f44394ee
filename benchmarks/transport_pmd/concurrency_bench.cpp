// The endpoint's any-thread send path, timed: the PMD test's case
// (pmd-tests/common/concurrency_case.h: 20 000 messages of 64 B .. 16 KiB
// over a net_ring link, every byte checked) under loss, against the same
// messages loss-free, in the same run.
//
//   <producer>/lossfree/<descriptors>  no faults: the limit.
//   <producer>/loss<p>%/<descriptors>  p % loss both ways, with 5 % reordering
//                                      and 2 % duplication.
// <producer> is lcore1 (a producer on lcore 1 submits while the main lcore
// polls) or same_thread (the polling thread submits too); <descriptors> is
// the sender's max_messages, small so that descriptors are completed and
// reused while others wait for resends. The pairs of loss and descriptors
// are the ones the concurrency sweep ran by hand (docs/transport.md).
//
// An iteration is one case with a seed of its own (the run's seeds are
// 1, 2, ...); counter "msgs_per_s": messages per second of the case (manual
// time: from the first submission to the last completion), the ratio
// against lossfree is the share of the loss-free rate kept under loss. A
// case that does not deliver every message exactly once, every byte right,
// within 60 s ends the benchmark (a fault to look at, not a figure).
// Run (see benchmarks/transport_pmd/README.md):
//   build/benchmarks/transport_pmd/concurrency_bench --benchmark_repetitions=3
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "bench_eal.h"
#include "concurrency_case.h"
#include "net/eal.h"
#include "ratio_reporter.h"

namespace mercury::bench {
namespace {

constexpr int kSeedsPerRepetition = 3;

struct Sweep {
  const char* name;  ///< the variant
  double loss;
  uint32_t descriptors;
};
constexpr Sweep kSweeps[] = {{"loss0.5%", 0.005, 32},
                             {"loss2%", 0.02, 256},
                             {"loss2%", 0.02, 8192},
                             {"loss5%", 0.05, 64},
                             {"loss10%", 0.10, 1024}};

uint64_t g_seed = 0;  // the last seed used

void run(benchmark::State& state, const std::string& name, double loss, bool same_thread) {
  const auto descriptors = static_cast<uint32_t>(state.range(0));
  uint64_t messages = 0;
  for (auto _ : state) {
    const pmdtest::ConcurrencyResult r = pmdtest::run_concurrency_case({.loss = loss,
                                                                        .seed = ++g_seed,
                                                                        .descriptors = descriptors,
                                                                        .same_thread = same_thread,
                                                                        .deadline_s = 60});
    if (r.launch != 0) throw std::runtime_error("lcore 1 did not start the producer");
    if (!r.stuck.empty() || r.completed != r.messages || !r.exactly_once || r.producer_exit != 0) {
      throw std::runtime_error(name + ", seed " + std::to_string(g_seed) + ": " +
                               std::to_string(r.completed) + " of " + std::to_string(r.messages) +
                               " delivered, first failure: " + r.first_error + "; " + r.stuck);
    }
    state.SetIterationTime(r.seconds);
    messages += r.messages;
  }
  state.counters["msgs_per_s"] =
      benchmark::Counter(static_cast<double>(messages), benchmark::Counter::kIsRate);
}

void register_all() {
  for (const bool same_thread : {false, true}) {
    const std::string producer = same_thread ? "same_thread/" : "lcore1/";
    for (const Sweep& s : kSweeps) {
      for (const bool lossy : {false, true}) {
        const double loss = lossy ? s.loss : 0;
        const std::string name = producer + (lossy ? s.name : "lossfree");
        benchmark::RegisterBenchmark(
            name.c_str(),
            [name, loss, same_thread](benchmark::State& st) { run(st, name, loss, same_thread); })
            ->Arg(s.descriptors)
            ->Iterations(kSeedsPerRepetition)
            ->UseManualTime();
      }
    }
  }
}

}  // namespace
}  // namespace mercury::bench

int main(int argc, char** argv) {
  namespace bench = mercury::bench;
  return bench::run_with_eal(argc, argv, "concurrency_bench", {"--lcores=0@0,1@1"}, [] {
    bench::register_all();
    bench::RatioReporter reporter("msgs_per_s", "lossfree");
    benchmark::RunSpecifiedBenchmarks(&reporter);
  });
}
