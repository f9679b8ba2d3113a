// The series SGLang exports (prefix "sglang:", label model_name), so that SGLang's published
// Grafana dashboard and alerts work against moeserve unchanged: request latencies (e2e, TTFT,
// TPOT, inter-token, queue), prompt / generation lengths, token counters, running / queued
// requests, KV token usage, prefix cache hit rate, generation throughput and speculative
// accept length. The engine thread observes; /metrics renders (thread-safe).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "serve/metrics.h"

namespace moeserve::serve {

// The state the gauges read, as the engine loop publishes it.
struct SglangGaugeInputs {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_total = 0, kv_pages_used = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  double spec_accept_length = 0;  // tokens per verify step since start (0 without speculation)
};

// What one finished request measured, in seconds and tokens.
struct FinishedRequest {
  int64_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  double e2e_s = 0, ttft_s = 0;
};

class SglangMetrics {
 public:
  using Clock = std::chrono::steady_clock;
  SglangMetrics();

  void observe_first_token(double ttft_s);
  void observe_inter_token(double seconds);
  void observe_queue_time(double seconds);
  // Tokens a step streamed out at `when` (for gen_throughput over the recent window).
  void observe_generated(int64_t tokens, Clock::time_point when);
  void observe_finished(const FinishedRequest& request);
  void count_prompt_tokens(int64_t tokens);

  // Generated tokens per second over the last kWindow (0 when idle for that long).
  double gen_throughput(Clock::time_point now = Clock::now()) const;

  void render(const std::string& model_name, const SglangGaugeInputs& gauges, std::string& out) const;

 private:
  static constexpr std::chrono::seconds kWindow{5};
  Histogram e2e_, ttft_, tpot_, itl_, queue_;
  Histogram prompt_len_, output_len_;
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0}, cached_tokens_{0}, requests_{0};
  mutable std::mutex window_mutex_;
  std::deque<std::pair<Clock::time_point, int64_t>> window_;  // (step end, tokens) within kWindow
};

}  // namespace moeserve::serve
