// Offline batched generation (`moeserve generate`, tests): every request added to a step loop
// (runtime/step_loop.h, the scheduler and draws that serve runs) at once, then steps until
// each has its tokens. Requests stop on max_new_tokens or a stop id.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "runtime/engine.h"
#include "runtime/logprobs.h"
#include "spec/speculative_options.h"

namespace moeserve::runtime {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  ops::SamplingOptions sampling;  // the same seed for every request draws the same way as serve
  std::vector<int32_t> stop_ids;
  int top_logprobs = -1;  // >= 0: each token's logprob and its top_logprobs alternatives
};

struct GenerateResult {
  std::vector<int32_t> tokens;         // generated ids (the stop id included when hit)
  std::vector<TokenLogprob> logprobs;  // one per token, with top_logprobs
  Tensor prompt_logits;                // [prompt_len, vocab] fp32, when asked for
  std::string finish_reason;           // "length" | "stop"
  // Speculative decoding: steps that verified drafts for it, drafts run and accepted.
  int64_t verify_steps = 0, drafted_tokens = 0, accepted_tokens = 0;
};

struct GenerateOptions {
  bool prompt_logits = false;  // every prompt token's logits (GenerateResult::prompt_logits)
  spec::SpeculativeOptions speculative = {};
};

// KV pages per replica that let every request run at once to its last token (plus the
// scheduler's padding page), with room for `max_drafts` drafts each: EngineOptions::num_pages
// for generate().
int64_t kv_pages_for(const std::vector<GenerateRequest>& requests, int64_t page_size, int64_t max_drafts = 0);

// Runs the requests as one batch: every prompt in the first step (no chunking), the pipeline
// micro-batches of the engine's options, no prefix reuse or padding (the batch's shapes are
// its own); request i on replica i % attn_dp.
std::vector<GenerateResult> generate(Engine& engine, const std::vector<GenerateRequest>& requests,
                                     const GenerateOptions& options = {});

}  // namespace moeserve::runtime
