#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace moeserve::serve {

namespace {
std::string number(double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15)
    return std::to_string(static_cast<int64_t>(v));
  return fmt::format("{:.9g}", v);
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++total_;
}

int64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out,
                       const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mutex_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string bucket_prefix = labels.empty() ? "" : labels + ",";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, bucket_prefix, number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n", name, bucket_prefix, total_);
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, plain, number(sum_), name, plain, total_);
}

std::vector<double> latency_buckets_seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60};
}

void render_metric(const std::string& name, const std::string& type, const std::string& help, double value,
                   std::string& out) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, number(value));
}

void render_labeled(const std::string& name, const std::string& type, const std::string& help,
                    const std::map<std::string, double>& values_by_label, const std::string& label, std::string& out) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  for (const auto& [value_label, value] : values_by_label)
    out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, value_label, number(value));
}

}  // namespace moeserve::serve
