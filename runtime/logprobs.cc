#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moeserve::runtime {

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n) {
  const float max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const double log_norm = static_cast<double>(max) + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - log_norm);
  out.rank = 1 + std::count_if(logits, logits + vocab, [&](float x) { return x > logits[token]; });
  if (top_n > 0) {
    const int64_t n = std::min<int64_t>(top_n, vocab);
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int64_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - log_norm));
  }
  return out;
}

std::vector<TokenLogprob> prompt_token_logprobs(const float* rows, int64_t n, int64_t vocab, int64_t begin,
                                                std::span<const int32_t> prompt, int top_n) {
  std::vector<TokenLogprob> out;
  for (int64_t j = 0; j < n && begin + j + 1 < static_cast<int64_t>(prompt.size()); ++j)
    out.push_back(token_logprob(rows + j * vocab, vocab, prompt[begin + j + 1], top_n));
  return out;
}

}  // namespace moeserve::runtime
