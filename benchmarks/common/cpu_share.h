// The CPU-share guard of the two-process benchmarks (net_memif): each side
// reports the share of its core it got during a run (counters "tx_cpu" and
// "rx_cpu", CPU time over wall time); a repetition in which either had less
// than --min_cpu_share (default 0.9) measured the scheduler more than the
// link, and is reported, and counted, under the group "<group>_shared_cpu"
// instead of "<group>". Nothing is dropped.
//
// Besides RatioReporter's table (which pairs the i-th run of a variant with
// the i-th run of the limit in the same group, so once the guard has moved
// some runs out those pairs may come from different repetitions), Finalize
// prints ratios taken within one repetition only (Google Benchmark's
// repetition index: with random interleaving, the variant and the limit of
// one repetition ran in the same round), counting a repetition only when both
// runs were clean.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ratio_reporter.h"

namespace mercury::bench {

class CpuShareReporter final : public RatioReporter {
 public:
  /// `counter` and `limit_variant` as RatioReporter's; `min_share` 0 keeps
  /// every run in its group.
  CpuShareReporter(std::string counter, std::string limit_variant, double min_share);

  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override;
  /// Also prints, per arg, the ratio of `variant` to `reference` over the
  /// repetitions where both ran clean.
  void add_pair(std::string variant, std::string reference) {
    pairs_.emplace_back(std::move(variant), std::move(reference));
  }

 private:
  struct Sample {
    double value = 0;
    bool clean = false;
  };
  std::string counter_;
  std::string limit_;
  double min_share_;
  // [arg][variant][repetition]
  std::map<std::string, std::map<std::string, std::map<int64_t, Sample>>> samples_;
  std::vector<std::pair<std::string, std::string>> pairs_;
};

/// Takes `--<name>=<value>` out of argv (before Google Benchmark reads the
/// rest) and returns the value, or `fallback` when it is absent.
double take_flag(int& argc, char** argv, const char* name, double fallback);
/// Takes `--<name>` out of argv; true when it was there.
bool take_switch(int& argc, char** argv, const char* name);

}  // namespace mercury::bench
