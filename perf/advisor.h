// The plan advisor: predicts, for every plan preset a model and a GPU count admit, whether it
// fits and how fast it decodes on a machine described by a hardware profile
// (perf/hardware_profile.h), from the bytes and FLOPs each rank's step moves
// (perf/step_cost.h, the accounting bench-step reports against). Pieces, each its own function:
//   - per rank: a roofline per op kind (weight-streaming projections and experts; attention over
//     the KV cache) with the profile's efficiency by tokens, plus a fixed cost per layer;
//   - routing: the experts a rank's tokens hit and the rows it computes, for uniform routing or
//     measured expert loads, at the busiest expert-parallel group (expected maximum);
//   - collectives: the calls each plan makes per layer and step (docs/plans.md, "Communication
//     per layer"), each by the alpha-beta model (perf/collective_model.h);
//   - pipeline: micro-batches of the step in flight over the stages, the bubble when fewer;
//   - serving: continuous batching in its steady state (one prefill of the input per
//     output_len tokens of each sequence, interleaved), speculative decoding as accept length
//     tokens per verify step of verify_tokens per sequence.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "parallel/plan.h"
#include "perf/hardware_profile.h"

namespace moeserve::perf {

struct AdviseWorkload {
  std::vector<int64_t> concurrency = {1, 8, 32, 64};
  int64_t input_len = 1024;
  int64_t output_len = 256;
  std::string speculative_algorithm;  // "": none
  double accept_length = 1;           // tokens a sequence emits per verify step
  int64_t verify_tokens = 1;          // tokens each sequence runs per verify step
  std::vector<double> expert_load;    // share of routed rows per expert (empty: uniform)
  int64_t context_length = 0;         // KV tokens per sequence for the fit (0: input + output)
  int64_t max_running_requests = 0;   // sequences whose KV the fit holds (0: the largest concurrency)
  bool kv_cache_fp8 = false;          // --kv-cache-dtype fp8_e4m3: one byte per cached element
};

// Where a step's time goes (microseconds). weights / kv: streaming at the profile's
// efficiency; flops: what compute adds beyond the bytes where an op is compute bound;
// bubble: pipeline stages idle (on a shared executor it is negative: the per-layer latency and
// collectives that groups in flight hide behind one another).
struct StepSplit {
  double weights_us = 0, kv_us = 0, flops_us = 0, overhead_us = 0, bubble_us = 0, host_us = 0;
  std::map<std::string, double> collectives_us;  // by site: attn_all_reduce, moe_all_to_all, pp_send, ...
  double total_us() const;
  std::string dominant() const;  // the largest term's name
  void add(const StepSplit& other, double times = 1);
};

// The routed work of one MoE layer on a rank of an expert-parallel group.
struct RoutedWork {
  double experts_hit = 0;  // distinct local experts with at least one row
  double rows = 0;         // (token, expert) rows computed
};

// Expected maximum of n independent standard normal samples (order-statistics tables).
double expected_normal_max(int n);

// Routed work of the busiest of `groups` expert groups (`busiest`) or of the mean group, for
// `tokens` tokens each choosing top_k of the experts (expert_load: share per expert, empty: uniform).
RoutedWork routed_work(const ModelConfig& config, int groups, double tokens, const std::vector<double>& expert_load,
                       bool busiest);

// How the step's tokens meet the ranks.
struct ForwardShape {
  double replica_tokens = 1;    // tokens of the busiest attention replica (each TP rank runs them)
  double stage_tokens = 1;      // tokens the stage's MoE layers route (every replica's)
  double context = 0;           // tokens each attends to
  double kv_element_bytes = 0;  // bytes per cached element (0: the profile's element bytes)
  // Shared executor: ranks running layers side by side (this stage's with work, times the
  // pipeline groups in flight); 0: the stage's ranks.
  double active_ranks = 0;
  double busy_replicas = 0;  // attention-DP replicas with sequences (0: all)
};

// One stage's forward of one micro-batch (compute on its busiest rank, or every rank's when
// they share an executor, then its collectives).
StepSplit stage_time(const ModelConfig& config, const parallel::ParallelPlan& plan, const HardwareProfile& profile,
                     int stage, const ForwardShape& shape, const std::vector<double>& expert_load);

// All `batch` sequences one verify step (one token each without speculation): the pipeline's
// micro-batches, its bubble, host time.
StepSplit decode_round(const ModelConfig& config, const parallel::ParallelPlan& plan, const HardwareProfile& profile,
                       int64_t batch, double context, const AdviseWorkload& workload);

struct PointPrediction {
  int64_t concurrency = 0;
  StepSplit round;        // one decode round of the running batch
  double prefill_us = 0;  // one request's input
  double tpot_ms = 0;     // with prefills interleaved
  double per_request_tok_s = 0;
  double aggregate_tok_s = 0;
  double ttft_ms = 0;
};

struct PlanPrediction {
  parallel::ParallelPlan plan;
  bool fits = false;
  std::string fit_note;  // the fit, or why not
  std::vector<PointPrediction> points;
};

PointPrediction predict_point(const ModelConfig& config, const parallel::ParallelPlan& plan,
                              const HardwareProfile& profile, const AdviseWorkload& workload, int64_t concurrency);

// Fit (weights as stored + KV at the profile's element bytes) and every concurrency's point.
PlanPrediction predict_plan(const ModelConfig& config, const parallel::ParallelPlan& plan,
                            const HardwareProfile& profile, const AdviseWorkload& workload);

struct Advice {
  std::string model, hardware;
  int gpus = 0;
  AdviseWorkload workload;
  std::vector<PlanPrediction> plans;
  std::vector<std::pair<std::string, std::string>> skipped;  // preset, why the model does not admit it
  // Plans that fit, best aggregate tok/s first, per concurrency.
  std::map<int64_t, std::vector<std::string>> ranking;
};

// `plans` empty: every preset of `gpus` ranks the model admits.
Advice advise(const ModelConfig& config, const std::string& model_name, const HardwareProfile& profile, int gpus,
              const std::vector<std::string>& plans, const AdviseWorkload& workload);

}  // namespace moeserve::perf
