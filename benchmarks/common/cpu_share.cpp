#include "cpu_share.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace mercury::bench {

namespace {

// Median [min, max] n, with `format` taking those four, or "-" in a field of
// `width` when there is none.
void print_spread(std::vector<double> v, const char* format, int width) {
  if (v.empty()) {
    std::printf("%*s", width, "- ");
    return;
  }
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  std::printf(format, median, v.front(), v.back(), n);
}

}  // namespace

CpuShareReporter::CpuShareReporter(std::string counter, std::string limit_variant, double min_share)
    : RatioReporter(counter, limit_variant),
      counter_(std::move(counter)),
      limit_(std::move(limit_variant)),
      min_share_(min_share) {}

void CpuShareReporter::ReportRuns(const std::vector<Run>& runs) {
  std::vector<Run> split = runs;
  for (Run& r : split) {
    if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
    const auto tx = r.counters.find("tx_cpu");
    const auto rx = r.counters.find("rx_cpu");
    if (tx == r.counters.end() || rx == r.counters.end()) continue;
    const bool clean = std::min(tx->second.value, rx->second.value) >= min_share_;
    std::string& name = r.run_name.function_name;  // "<group>/<variant>"
    const size_t slash = name.find('/');
    if (const auto v = r.counters.find(counter_); v != r.counters.end()) {
      samples_[r.run_name.args][name.substr(slash + 1)][r.repetition_index] = {v->second.value,
                                                                               clean};
    }
    if (!clean && slash != std::string::npos) name.insert(slash, "_shared_cpu");
  }
  RatioReporter::ReportRuns(split);
}

void CpuShareReporter::Finalize() {
  RatioReporter::Finalize();
  std::printf(
      "\nper repetition, both runs clean (each side >= %.2f of its core); ratio to %s of the "
      "same repetition:\n%-6s %-16s %10s %22s %3s %9s %19s %3s\n",
      min_share_, limit_.c_str(), "arg", "variant", counter_.c_str(), "[min, max]", "n", "ratio",
      "[min, max]", "n");
  for (const auto& [arg, variants] : samples_) {
    const auto limit = variants.find(limit_);
    for (const auto& [variant, reps] : variants) {
      std::vector<double> values, ratios;
      for (const auto& [rep, sample] : reps) {
        if (!sample.clean) continue;
        values.push_back(sample.value);
        if (limit == variants.end() || variant == limit_) continue;
        const auto l = limit->second.find(rep);
        if (l != limit->second.end() && l->second.clean && l->second.value > 0) {
          ratios.push_back(sample.value / l->second.value);
        }
      }
      std::printf("%-6s %-16s", arg.c_str(), variant.c_str());
      print_spread(values, "%10.4g   [%8.4g, %8.4g] %3zu", 36);
      if (variant != limit_) print_spread(ratios, " %9.3f   [%6.3f, %6.3f] %3zu", 35);
      std::printf("\n");
    }
  }
  for (const auto& [variant, reference] : pairs_) {
    std::printf("\nper repetition, both runs clean; %s / %s of the same repetition:\n",
                variant.c_str(), reference.c_str());
    for (const auto& [arg, variants] : samples_) {
      const auto v = variants.find(variant), r = variants.find(reference);
      std::vector<double> ratios;
      if (v != variants.end() && r != variants.end()) {
        for (const auto& [rep, sample] : v->second) {
          const auto ref = r->second.find(rep);
          if (sample.clean && ref != r->second.end() && ref->second.clean &&
              ref->second.value > 0) {
            ratios.push_back(sample.value / ref->second.value);
          }
        }
      }
      std::printf("%-6s", arg.c_str());
      print_spread(ratios, " %9.3f   [%6.3f, %6.3f] %3zu", 35);
      std::printf("\n");
    }
  }
}

double take_flag(int& argc, char** argv, const char* name, double fallback) {
  const std::string flag = std::string("--") + name + "=";
  double value = fallback;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with(flag)) {
      value = std::atof(argv[i] + flag.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return value;
}

bool take_switch(int& argc, char** argv, const char* name) {
  const std::string flag = std::string("--") + name;
  bool found = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (flag == argv[i]) {
      found = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return found;
}

}  // namespace mercury::bench
