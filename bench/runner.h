// The load generator: sends every prompt as the streamed request of sglang.bench_serving's
// backend (bench/protocol.h: greedy, ignore_eos, the prompt's output length) with at most
// `max_concurrency` in flight and, for a finite request rate, Poisson arrivals; times each
// request's first token, the gaps between tokens and its end as sglang.bench_serving does.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/dataset.h"
#include "bench/http_client.h"
#include "bench/metrics.h"

namespace moeserve::bench {

struct RunOptions {
  HttpUrl url;
  std::string model;  // "" : the first of GET /v1/models
  std::string api_key;
  int64_t max_concurrency = 1;
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second
  uint64_t seed = 1;                                              // arrival times
  bool progress = true;                // a progress bar on a terminal (stderr), plain lines otherwise
  bool ignore_eos = true;              // false: --disable-ignore-eos
  std::string backend = "sglang-oai";  // sglang.bench_serving's --backend (bench/protocol.h)
  bool token_ids = false;              // completions: return_token_ids (the output ids, checked)
  nlohmann::ordered_json extra_body = nlohmann::ordered_json::object();  // --extra-request-body
};

// GET /get_server_info of the server (null when it has none), for the run's JSON.
nlohmann::ordered_json server_info(const HttpUrl& url, const std::string& api_key);

struct RunResult {
  BenchMetrics metrics;
  std::vector<RequestOutcome> outcomes;  // in prompt order
};

// The served model's id (GET /v1/models), for RunOptions::model.
std::string served_model(const HttpUrl& url, const std::string& api_key);

RunResult run_benchmark(const RunOptions& options, const std::vector<BenchPrompt>& prompts);

// One run as a JSON object: sglang's fields plus what was asked; with `details`, per request
// input_lens, output_lens, ttfts, itls, generated_texts, output_ids and errors.
nlohmann::ordered_json run_json(const RunOptions& options, const DatasetOptions& dataset, const RunResult& result,
                                bool details);

}  // namespace moeserve::bench
