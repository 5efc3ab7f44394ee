#include "ratio_reporter.h"

#include <algorithm>
#include <cstdio>

namespace mercury::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<double> ratios(const std::vector<double>& values, const std::vector<double>& limit) {
  std::vector<double> r;
  for (size_t i = 0; i < values.size() && i < limit.size(); ++i) {
    if (limit[i] > 0) r.push_back(values[i] / limit[i]);
  }
  return r;
}

namespace {

// "group/variant/arg" -> parts; arg may be absent.
void split(const std::string& name, std::string& group, std::string& variant, std::string& arg) {
  const size_t a = name.find('/');
  const size_t b = a == std::string::npos ? std::string::npos : name.find('/', a + 1);
  group = name.substr(0, a);
  variant = a == std::string::npos ? "" : name.substr(a + 1, b - a - 1);
  arg = b == std::string::npos ? "" : name.substr(b + 1);
  // Google Benchmark appends "/repeats:N" and similar; keep the first arg only.
  if (const size_t c = arg.find('/'); c != std::string::npos) arg = arg.substr(0, c);
}

}  // namespace

std::vector<double> RatioReporter::values(const std::string& group, const std::string& variant,
                                          const std::string& arg) const {
  const auto k = samples_.find(Key{group, arg});
  if (k == samples_.end()) return {};
  const auto v = k->second.find(variant);
  return v == k->second.end() ? std::vector<double>{} : v->second;
}

RatioReporter::RatioReporter(std::string counter, std::string limit_variant)
    : counter_(std::move(counter)), limit_(std::move(limit_variant)) {}

void RatioReporter::ReportRuns(const std::vector<Run>& runs) {
  ConsoleReporter::ReportRuns(runs);
  for (const Run& r : runs) {
    if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
    auto it = r.counters.find(counter_);
    if (it == r.counters.end()) continue;
    std::string group, variant, arg;
    split(r.run_name.str(), group, variant, arg);
    samples_[Key{group, arg}][variant].push_back(it->second.value);
  }
}

void RatioReporter::Finalize() {
  ConsoleReporter::Finalize();
  std::printf("\n%-28s %-8s %-14s %12s %25s %8s %19s\n", "group", "arg", "variant",
              counter_.c_str(), "[min, max]", "ratio", "ratio [min, max]");
  for (const auto& [key, variants] : samples_) {
    auto lim = variants.find(limit_);
    for (const auto& [variant, values] : variants) {
      const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
      std::printf("%-28s %-8s %-14s %12.4g   [%10.4g, %10.4g]", key.group.c_str(), key.arg.c_str(),
                  variant.c_str(), median(values), *mn, *mx);
      if (lim != variants.end() && variant != limit_) {
        const std::vector<double> r = ratios(values, lim->second);
        const auto [rmn, rmx] = std::minmax_element(r.begin(), r.end());
        if (!r.empty()) std::printf(" %8.3f   [%6.3f, %6.3f]", median(r), *rmn, *rmx);
      } else if (variant == limit_) {
        std::printf(" %8s", "limit");
      }
      std::printf("  (n=%zu)\n", values.size());
    }
  }
}

}  // namespace mercury::bench
