// What changes a row's logits before it is drawn (vLLM's logits processors): logit_bias,
// min_tokens masks, and the repetition / frequency / presence penalties. The request states
// them (LogitAdjustOptions); each step the host turns them into a sparse list of (row, token)
// entries (LogitAdjustEntry), the batch carries it, and the device applies it to the fp32
// logits in place (ops::LogitAdjustParams) before the sampler reduces them. Only the tokens a
// row's options touch are listed: never a vocabulary-sized array.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

// adjusted_logit runs on the host and in CUDA kernels.
#if defined(__CUDACC__)
#define MOESERVE_LOGIT_ADJUST_FN __host__ __device__ inline
#else
#define MOESERVE_LOGIT_ADJUST_FN inline
#endif

namespace moeserve::ops {

// A request's logit adjustments (the defaults change nothing).
struct LogitAdjustOptions {
  float repetition_penalty = 1.0f;                    // vLLM/HF: over prompt and output tokens; > 1 discourages
  float frequency_penalty = 0.0f;                     // OpenAI: minus penalty * the token's count in the output
  float presence_penalty = 0.0f;                      // OpenAI: minus penalty once the token is in the output
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias added to its logit)
  int64_t min_tokens = 0;                             // until then, min_tokens_mask is -inf
  std::vector<int32_t> min_tokens_mask;               // EOS and stop_token_ids
  bool active() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f || !logit_bias.empty() ||
           (min_tokens > 0 && !min_tokens_mask.empty());
  }
};

// One logit changed: x = logits[row, token] + bias; then, when repetition != 1, x > 0 ? x /
// repetition : x * repetition; then x -= subtract (vLLM's order: bias and min_tokens, then
// the penalties). One entry per (row, token): the host merges a token's reasons.
struct LogitAdjustEntry {
  int32_t row = 0;          // the batch's logit row
  int32_t token = 0;        // id in the whole vocabulary
  float bias = 0.0f;        // logit_bias, -inf for a min_tokens mask
  float repetition = 1.0f;  // the row's repetition_penalty if the token is in its prompt or output
  float subtract = 0.0f;    // frequency * output count + presence * (count > 0)
};

// One entry's logit after the adjustment: the formula every backend applies (vLLM divides
// positive logits by the repetition penalty and multiplies the others).
MOESERVE_LOGIT_ADJUST_FN float adjusted_logit(float logit, const LogitAdjustEntry& e) {
  float x = logit + e.bias;
  if (e.repetition != 1.0f) x = x > 0.0f ? x / e.repetition : x * e.repetition;
  return x - e.subtract;
}

}  // namespace moeserve::ops
