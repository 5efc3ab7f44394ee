// A Google Benchmark reporter that, besides the usual console table, pairs
// each variant with the limit it is measured against and prints the ratio.
//
// Benchmarks are registered as "<group>/<variant>/<arg>"; the limit variant
// of a group is named when the reporter is made. Run with
// --benchmark_repetitions=N --benchmark_enable_random_interleaving=true: the
// variants are interleaved (A B A B ...), and for each repetition i the ratio
// variant_i / limit_i is taken, so a slow phase of the machine hits both
// sides of a ratio alike. Printed: medians, [min, max] spread, and the ratio.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace mercury::bench {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  /// `counter`: the user counter compared (e.g. "pps"); `limit_variant`: the
  /// variant every other one is divided by.
  RatioReporter(std::string counter, std::string limit_variant);
  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override;

 protected:
  struct Key {
    std::string group, arg;
    bool operator<(const Key& o) const { return group != o.group ? group < o.group : arg < o.arg; }
  };
  /// The counter's values so far, per group and arg, per variant, in run
  /// order: for reporters that add tables of their own.
  using Samples = std::map<Key, std::map<std::string, std::vector<double>>>;
  [[nodiscard]] const Samples& samples() const { return samples_; }
  /// The values of `variant` in `group` with `arg`; empty when there are none.
  [[nodiscard]] std::vector<double> values(const std::string& group, const std::string& variant,
                                           const std::string& arg) const;

 private:
  std::string counter_;
  std::string limit_;
  Samples samples_;
};

/// The median of `v` (0 when empty).
double median(std::vector<double> v);
/// values[i] / limit[i] for each repetition i both have (where limit[i] > 0).
std::vector<double> ratios(const std::vector<double>& values, const std::vector<double>& limit);

}  // namespace mercury::bench
