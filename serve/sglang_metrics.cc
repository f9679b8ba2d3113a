#include "serve/sglang_metrics.h"

#include <fmt/format.h>

namespace moeserve::serve {

namespace {

// SGLang's buckets for token counts (prompt and generation lengths).
std::vector<double> length_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
}

// TPOT and inter-token latency: finer than the request-latency buckets at the low end.
std::vector<double> per_token_buckets() {
  return {0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5};
}

std::string label_of(const std::string& model_name) {
  std::string escaped;  // Prometheus label values escape backslash, quote and newline
  for (char c : model_name) {
    if (c == '\\' || c == '"') escaped += '\\';
    escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return fmt::format("model_name=\"{}\"", escaped);
}

void gauge(const std::string& name, const std::string& help, const std::string& labels, double value,
           std::string& out) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{{{}}} {}\n", name, help, name, name, labels, value);
}

void counter(const std::string& name, const std::string& help, const std::string& labels, int64_t value,
             std::string& out) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{}{{{}}} {}\n", name, help, name, name, labels, value);
}

}  // namespace

SglangMetrics::SglangMetrics()
    : e2e_(latency_buckets_seconds()),
      ttft_(latency_buckets_seconds()),
      tpot_(per_token_buckets()),
      itl_(per_token_buckets()),
      queue_(latency_buckets_seconds()),
      prompt_len_(length_buckets()),
      output_len_(length_buckets()) {}

void SglangMetrics::observe_first_token(double ttft_s) { ttft_.observe(ttft_s); }
void SglangMetrics::observe_inter_token(double seconds) { itl_.observe(seconds); }
void SglangMetrics::observe_queue_time(double seconds) { queue_.observe(seconds); }
void SglangMetrics::count_prompt_tokens(int64_t tokens) { prompt_tokens_ += tokens; }

void SglangMetrics::observe_generated(int64_t tokens, Clock::time_point when) {
  generation_tokens_ += tokens;
  std::lock_guard<std::mutex> lock(window_mutex_);
  window_.emplace_back(when, tokens);
  while (!window_.empty() && when - window_.front().first > kWindow) window_.pop_front();
}

void SglangMetrics::observe_finished(const FinishedRequest& r) {
  ++requests_;
  cached_tokens_ += r.cached_tokens;
  e2e_.observe(r.e2e_s);
  prompt_len_.observe(static_cast<double>(r.prompt_tokens));
  output_len_.observe(static_cast<double>(r.output_tokens));
  // SGLang's (and bench_serving's) TPOT: the decode time over the tokens after the first.
  if (r.output_tokens > 1) tpot_.observe((r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1));
}

double SglangMetrics::gen_throughput(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(window_mutex_);
  int64_t tokens = 0;
  for (const auto& [when, n] : window_)
    if (now - when <= kWindow) tokens += n;
  return static_cast<double>(tokens) / std::chrono::duration<double>(kWindow).count();
}

void SglangMetrics::render(const std::string& model_name, const SglangGaugeInputs& g, std::string& out) const {
  const std::string labels = label_of(model_name);
  gauge("sglang:num_running_reqs", "Requests being computed.", labels, static_cast<double>(g.running), out);
  gauge("sglang:num_queue_reqs", "Requests waiting for admission.", labels, static_cast<double>(g.waiting), out);
  gauge("sglang:token_usage", "Fraction of KV cache pages held by requests.", labels,
        g.kv_pages_total ? static_cast<double>(g.kv_pages_used) / static_cast<double>(g.kv_pages_total) : 0.0, out);
  gauge("sglang:cache_hit_rate", "Prefix cache hit tokens / queried prompt tokens, since start.", labels,
        g.prefix_query_tokens ? static_cast<double>(g.prefix_hit_tokens) / static_cast<double>(g.prefix_query_tokens)
                              : 0.0,
        out);
  gauge("sglang:gen_throughput", "Generated tokens per second over the last 5 s.", labels, gen_throughput(), out);
  gauge("sglang:spec_accept_length", "Tokens per speculative verify step, since start.", labels, g.spec_accept_length,
        out);
  counter("sglang:prompt_tokens_total", "Prompt tokens of accepted requests.", labels, prompt_tokens_.load(), out);
  counter("sglang:generation_tokens_total", "Generated tokens.", labels, generation_tokens_.load(), out);
  counter("sglang:cached_tokens_total", "Prompt tokens served from the prefix cache.", labels, cached_tokens_.load(),
          out);
  counter("sglang:num_requests_total", "Requests finished.", labels, requests_.load(), out);
  e2e_.render("sglang:e2e_request_latency_seconds", "Arrival to the last token.", out, labels);
  ttft_.render("sglang:time_to_first_token_seconds", "Arrival to the first token.", out, labels);
  tpot_.render("sglang:time_per_output_token_seconds", "Decode time per output token after the first.", out, labels);
  itl_.render("sglang:inter_token_latency_seconds", "Time between consecutive tokens of a request.", out, labels);
  queue_.render("sglang:queue_time_seconds", "Arrival to first scheduled.", out, labels);
  prompt_len_.render("sglang:prompt_tokens_histogram", "Prompt length of finished requests, in tokens.", out, labels);
  output_len_.render("sglang:generation_tokens_histogram", "Output length of finished requests, in tokens.", out,
                     labels);
}

}  // namespace moeserve::serve
