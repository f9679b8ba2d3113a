// The plan sweep's results and its three reports: sweep.json (every point with sglang's
// metric fields), sweep.md (plan x concurrency tables, the best plan per concurrency, and
// how many greedy outputs equal the first plan's) and a self-contained sweep.html (inline
// SVG line charts, one line per plan).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/metrics.h"

namespace moeserve::bench {

struct SweepPoint {
  std::string plan;
  int64_t concurrency = 0;
  BenchMetrics metrics;
  // Requests (of `compared`) whose greedy output ids equal the reference plan's at this
  // concurrency (the same prompts); compared = 0 for the reference plan itself.
  int64_t same_outputs = 0, compared = 0;
  // The plan advisor's prediction of output_throughput at this point (`sweep --hardware`); < 0: none.
  double predicted_output_throughput = -1;
  // Runs measured at this point (`sweep --repeats`; the point is the median run) and the
  // range of their output throughput.
  int64_t runs = 1;
  double output_throughput_min = 0, output_throughput_max = 0;
};

// (measured - predicted) / predicted output throughput; 0 without a prediction.
double prediction_error(const SweepPoint& point);

struct SweepSkip {
  std::string plan, reason;
};

struct SweepResult {
  std::string model, backend;
  std::string reduction_plan = "single";  // the servers' --reduction-plan
  bool batch_invariant = false;           // the servers' --batch-invariant
  std::string reference_plan;             // the first plan measured: outputs are compared with its
  std::vector<std::string> plans;         // as asked
  std::vector<int64_t> concurrency;       // as asked
  nlohmann::ordered_json workload;        // dataset settings of every run
  std::vector<SweepPoint> points;         // measured, plan by plan
  std::vector<SweepSkip> skipped;
  nlohmann::ordered_json switches = nlohmann::ordered_json::array();  // start and each re-plan
};

// Decode speed one request sees: 1000 / mean TPOT (ms); 0 without TPOT samples.
double per_request_tok_s(const BenchMetrics& m);
// Each plan's line colour: chosen by its name, so a plan has the same colour in every sweep
// (unless two plans of one sweep pick the same, when the later one takes the next free).
std::map<std::string, std::string> plan_colors(const std::vector<std::string>& plans);
// The plan with the highest output throughput at each measured concurrency.
std::map<int64_t, std::string> best_plan_by_concurrency(const SweepResult& result);

nlohmann::ordered_json sweep_json(const SweepResult& result);
SweepResult sweep_from_json(const nlohmann::ordered_json& json);
std::string sweep_markdown(const SweepResult& result);
std::string sweep_html(const SweepResult& result);

}  // namespace moeserve::bench
