// Log-probabilities of a sampled token and the most likely alternatives, from the raw fp32
// logits of its row (log-softmax at temperature 1, as OpenAI reports them).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace moeserve::runtime {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `top_n` most likely tokens, best first
  int64_t rank = 1;                            // 1 + the number of tokens with a larger logit (vLLM's rank)
};

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n);

// The logprobs of prompt tokens from their predecessors' logit rows: rows [n, vocab] are the
// logits at prompt positions [begin, begin + n); row j scores prompt[begin + j + 1] (the last
// prompt position scores nothing). One entry per scored token, in order.
std::vector<TokenLogprob> prompt_token_logprobs(const float* rows, int64_t n, int64_t vocab, int64_t begin,
                                                std::span<const int32_t> prompt, int top_n);

}  // namespace moeserve::runtime
