// Server metrics in Prometheus' text format: counters, gauges and histograms. Thread-safe:
// the engine thread observes, the /metrics handler renders.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moeserve::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // The _bucket, _sum and _count lines of metric `name`; `labels` ("k=\"v\"", already escaped)
  // go on every line.
  void render(const std::string& name, const std::string& help, std::string& out, const std::string& labels = "") const;
  int64_t count() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1] (the last is +Inf)
  double sum_ = 0;
  int64_t total_ = 0;
};

// Buckets in seconds for latencies from 1 ms to 60 s.
std::vector<double> latency_buckets_seconds();

// One line per value: "# HELP", "# TYPE", then `name{labels} value`.
void render_metric(const std::string& name, const std::string& type, const std::string& help, double value,
                   std::string& out);
void render_labeled(const std::string& name, const std::string& type, const std::string& help,
                    const std::map<std::string, double>& values_by_label, const std::string& label, std::string& out);

}  // namespace moeserve::serve
