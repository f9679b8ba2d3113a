// What one benchmark run measured, with sglang.bench_serving's metric names and JSON fields
// (request_throughput, output_throughput, mean_ttft_ms, p99_itl_ms, concurrency, ...), so
// that dashboards reading sglang's output files read ours.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moeserve::bench {

// One request as the client saw it.
struct RequestOutcome {
  bool success = false;
  std::string error;          // when !success
  int64_t prompt_len = 0;     // usage.prompt_tokens
  int64_t output_len = 0;     // usage.completion_tokens
  double ttft_s = 0;          // send to first token
  double latency_s = 0;       // send to last byte
  std::vector<double> itl_s;  // gaps between chunks carrying tokens
  std::vector<int32_t> output_ids;
  std::string text;
  // Speculative decoding, when the server reports it (usage.spec_verify_ct, spec_accept_length).
  int64_t spec_verify_ct = 0;
  double spec_accept_length = 0;
  double start_s = 0;  // sent, seconds after the run started
};

// Mean, median, standard deviation and percentiles of one quantity, in milliseconds.
struct Distribution {
  double mean = 0, median = 0, std = 0, p90 = 0, p95 = 0, p99 = 0;
};
// numpy.percentile's linear interpolation; q in [0, 100]. 0 for an empty set.
double percentile(std::vector<double> values, double q);
Distribution distribution_ms(const std::vector<double>& seconds);

struct BenchMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_latency_ms;
  double concurrency = 0;  // achieved: sum of request latencies / duration
  // Tokens per speculative verify step over the requests that report it (0: none did).
  double accept_length = 0;
  // sglang.bench_serving's peaks over whole seconds of the run: tokens streamed in one second,
  // and requests in flight during one second.
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
};

// Over the successful requests of a run that took `duration_s` from first send to last reply.
BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s);

// sglang's field names: "duration", "completed", "mean_ttft_ms", "p99_e2e_latency_ms", ...
void add_metrics_json(const BenchMetrics& m, nlohmann::ordered_json& out);
// The metrics back from such an object (what sweep reads of a recorded run).
BenchMetrics metrics_from_json(const nlohmann::ordered_json& in);

}  // namespace moeserve::bench
