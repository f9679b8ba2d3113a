#include "spec/verify.h"

#include "core/error.h"

namespace moeserve::spec {

Verdict verify_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target_ids) {
  MS_CHECK(target_ids.size() == drafts.size() + 1, "verify: {} target rows for {} drafts (need drafts + 1)",
           target_ids.size(), drafts.size());
  Verdict v;
  while (v.accepted < static_cast<int64_t>(drafts.size()) && drafts[v.accepted] == target_ids[v.accepted])
    v.tokens.push_back(drafts[v.accepted++]);
  v.tokens.push_back(target_ids[v.accepted]);
  return v;
}

Verdict verify_sampled(std::span<const int32_t> drafts, const float* rows, int64_t vocab,
                       const ops::SamplingOptions& options) {
  Verdict v;
  const int64_t k = static_cast<int64_t>(drafts.size());
  for (int64_t i = 0; i <= k; ++i) {
    ops::SamplingOptions at = options;
    at.step = options.step + static_cast<uint64_t>(i);
    // The plain draw at this step; a draft is accepted when it is that token (see verify.h).
    // After the last draft, the draw is the bonus token.
    v.tokens.push_back(cpu::sample_row(rows + i * vocab, vocab, at));
    if (i == k || v.tokens.back() != drafts[i]) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace moeserve::spec
