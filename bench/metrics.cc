#include "bench/metrics.h"

#include <algorithm>
#include <cmath>

namespace moeserve::bench {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q / 100.0 * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (rank - static_cast<double>(low));
}

Distribution distribution_ms(const std::vector<double>& seconds) {
  Distribution d;
  if (seconds.empty()) return d;
  std::vector<double> ms;
  ms.reserve(seconds.size());
  for (double s : seconds) ms.push_back(s * 1000.0);
  double sum = 0;
  for (double v : ms) sum += v;
  d.mean = sum / static_cast<double>(ms.size());
  double var = 0;
  for (double v : ms) var += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(var / static_cast<double>(ms.size()));
  d.median = percentile(ms, 50);
  d.p90 = percentile(ms, 90);
  d.p95 = percentile(ms, 95);
  d.p99 = percentile(ms, 99);
  return d;
}

namespace {

// Per whole second from the first send: tokens that arrived (the first at its TTFT, the others
// after their gaps) and requests in flight at some point of it; the peaks of both.
void add_peaks(const std::vector<RequestOutcome>& outcomes, BenchMetrics& m) {
  double first = 0, last = 0;
  bool any = false;
  for (const RequestOutcome& r : outcomes) {
    if (!r.success) continue;
    first = any ? std::min(first, r.start_s) : r.start_s;
    last = any ? std::max(last, r.start_s + r.latency_s) : r.start_s + r.latency_s;
    any = true;
  }
  if (!any) return;
  const size_t seconds = static_cast<size_t>(std::ceil(last - first)) + 1;
  std::vector<double> tokens(seconds, 0);
  std::vector<int64_t> in_flight(seconds, 0);
  for (const RequestOutcome& r : outcomes) {
    if (!r.success) continue;
    double t = r.start_s + r.ttft_s;
    auto count = [&](double at) {
      const auto bucket = static_cast<size_t>(at - first);
      if (at >= first && bucket < seconds) tokens[bucket] += 1;
    };
    count(t);
    for (double gap : r.itl_s) count(t += gap);
    const auto begin = static_cast<size_t>(r.start_s - first),
               end = static_cast<size_t>(r.start_s + r.latency_s - first);
    for (size_t s = begin; s <= end && s < seconds; ++s) ++in_flight[s];
  }
  m.max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  m.max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
}

}  // namespace

BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  double accepted_tokens = 0, verify_steps = 0;
  for (const RequestOutcome& r : outcomes) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    accepted_tokens += r.spec_accept_length * static_cast<double>(r.spec_verify_ct);
    verify_steps += static_cast<double>(r.spec_verify_ct);
    m.total_input_tokens += r.prompt_len;
    m.total_output_tokens += r.output_len;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.latency_s);
    if (r.output_len > 1) tpot.push_back((r.latency_s - r.ttft_s) / static_cast<double>(r.output_len - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.input_throughput = static_cast<double>(m.total_input_tokens) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
    double sum = 0;
    for (double v : e2e) sum += v;
    m.concurrency = sum / duration_s;
  }
  if (verify_steps > 0) m.accept_length = accepted_tokens / verify_steps;
  add_peaks(outcomes, m);
  m.ttft_ms = distribution_ms(ttft);
  m.tpot_ms = distribution_ms(tpot);
  m.itl_ms = distribution_ms(itl);
  m.e2e_latency_ms = distribution_ms(e2e);
  return m;
}

namespace {
struct NamedDistribution {
  const char* name;
  Distribution BenchMetrics::*field;
};
constexpr NamedDistribution kDistributions[] = {{"ttft_ms", &BenchMetrics::ttft_ms},
                                                {"tpot_ms", &BenchMetrics::tpot_ms},
                                                {"itl_ms", &BenchMetrics::itl_ms},
                                                {"e2e_latency_ms", &BenchMetrics::e2e_latency_ms}};
struct NamedStat {
  const char* prefix;
  double Distribution::*field;
};
constexpr NamedStat kStats[] = {{"mean_", &Distribution::mean}, {"median_", &Distribution::median},
                                {"std_", &Distribution::std},   {"p90_", &Distribution::p90},
                                {"p95_", &Distribution::p95},   {"p99_", &Distribution::p99}};
}  // namespace

void add_metrics_json(const BenchMetrics& m, nlohmann::ordered_json& out) {
  out["duration"] = m.duration_s;
  out["completed"] = m.completed;
  out["failed"] = m.failed;
  out["total_input_tokens"] = m.total_input_tokens;
  out["total_output_tokens"] = m.total_output_tokens;
  out["request_throughput"] = m.request_throughput;
  out["input_throughput"] = m.input_throughput;
  out["output_throughput"] = m.output_throughput;
  out["total_throughput"] = m.total_throughput;
  for (const auto& d : kDistributions)
    for (const auto& s : kStats) out[std::string(s.prefix) + d.name] = (m.*d.field).*s.field;
  out["concurrency"] = m.concurrency;
  // As sglang.bench_serving: null without speculative decoding.
  out["accept_length"] = m.accept_length > 0 ? nlohmann::ordered_json(m.accept_length) : nullptr;
  out["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  out["max_concurrent_requests"] = m.max_concurrent_requests;
}

BenchMetrics metrics_from_json(const nlohmann::ordered_json& in) {
  BenchMetrics m;
  m.duration_s = in.at("duration").get<double>();
  m.completed = in.at("completed").get<int64_t>();
  m.failed = in.at("failed").get<int64_t>();
  m.total_input_tokens = in.at("total_input_tokens").get<int64_t>();
  m.total_output_tokens = in.at("total_output_tokens").get<int64_t>();
  m.request_throughput = in.at("request_throughput").get<double>();
  m.input_throughput = in.at("input_throughput").get<double>();
  m.output_throughput = in.at("output_throughput").get<double>();
  m.total_throughput = in.at("total_throughput").get<double>();
  for (const auto& d : kDistributions)
    for (const auto& s : kStats) (m.*d.field).*s.field = in.at(std::string(s.prefix) + d.name).get<double>();
  m.concurrency = in.at("concurrency").get<double>();
  if (in.contains("accept_length") && in["accept_length"].is_number())
    m.accept_length = in["accept_length"].get<double>();
  m.max_output_tokens_per_s = in.value("max_output_tokens_per_s", 0.0);
  m.max_concurrent_requests = in.value("max_concurrent_requests", int64_t{0});
  return m;
}

}  // namespace moeserve::bench
