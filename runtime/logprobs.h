// Log-probabilities of a sampled token and the most likely alternatives, from the raw fp32
// logits of its row (log-softmax at temperature 1, as OpenAI reports them).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace moeserve::runtime {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `top_n` most likely tokens, best first
};

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n);

}  // namespace moeserve::runtime
