// Engine: runs batched generation on a model under a parallel plan. It owns the KV page
// pool bookkeeping for its sequences, builds each step's ForwardBatch (prefill of every
// prompt in one step, then one decode token per live sequence per step), samples, and
// stops sequences on max_new_tokens or a stop id.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/deepseek_v3.h"
#include "model/model_source.h"
#include "ops/ops.h"
#include "parallel/plan.h"

namespace moeserve::runtime {

struct EngineOptions {
  parallel::ParallelPlan plan;
  int64_t page_size = 64;
  int64_t num_pages = 256;  // per rank and layer
  std::string backend = "cpu";
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  ops::SamplingOptions sampling;
  std::vector<int32_t> stop_ids;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the stop id included when hit)
  Tensor prompt_logits;         // [prompt_len, vocab] fp32, when asked for
  std::string finish_reason;    // "length" | "stop"
};

class Engine {
 public:
  Engine(const ModelSource& model, EngineOptions options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }

  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests, bool return_prompt_logits);

  // Communication counted on each rank since construction.
  std::vector<comm::CommStats> comm_stats() const;
  // Weight bytes held by each rank.
  std::vector<int64_t> weight_bytes_per_rank() const;

 private:
  struct Impl;
  ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::runtime
