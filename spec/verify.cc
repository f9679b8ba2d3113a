#include "spec/verify.h"

#include "core/error.h"
#include "core/random.h"

namespace moeserve::spec {

namespace {
// Streams of the acceptance test and of the draw after a rejection: independent of each
// other and of the plain draw at (seed, step).
constexpr uint64_t kAcceptStream = 0x5bd1e9955bd1e995ull;
constexpr uint64_t kResidualStream = 0x27d4eb2f165667c5ull;
}  // namespace

Verdict verify_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target_ids) {
  MS_CHECK(target_ids.size() == drafts.size() + 1, "verify: {} target rows for {} drafts (need drafts + 1)",
           target_ids.size(), drafts.size());
  Verdict v;
  while (v.accepted < static_cast<int64_t>(drafts.size()) && drafts[v.accepted] == target_ids[v.accepted])
    v.tokens.push_back(drafts[v.accepted++]);
  v.tokens.push_back(target_ids[v.accepted]);
  return v;
}

int32_t accept_or_resample(const cpu::TokenDistribution& p, int32_t draft, uint64_t seed, uint64_t step) {
  double p_draft = 0.0;
  for (size_t i = 0; i < p.ids.size(); ++i)
    if (p.ids[i] == draft) p_draft = p.probs[i];
  if (static_cast<double>(uniform01(seed ^ kAcceptStream, step)) < p_draft) return draft;
  // The residual max(p - q, 0) with q the point mass at the draft: p without it.
  const double u = static_cast<double>(uniform01(seed ^ kResidualStream, step)) * (1.0 - p_draft);
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    if (p.ids[i] == draft || p.probs[i] <= 0.0) continue;
    last = p.ids[i];
    cumulative += p.probs[i];
    if (u < cumulative) return last;
  }
  MS_CHECK(last >= 0, "verify: a rejected draft {} held all of the distribution's mass", draft);
  return last;  // rounding left u past the sum
}

Verdict verify_sampled(std::span<const int32_t> drafts, const float* rows, int64_t vocab,
                       const ops::SamplingOptions& options) {
  Verdict v;
  const int64_t k = static_cast<int64_t>(drafts.size());
  for (int64_t i = 0; i <= k; ++i) {
    ops::SamplingOptions at = options;
    at.step = options.step + static_cast<uint64_t>(i);
    const float* row = rows + i * vocab;
    if (i == k) {  // every draft accepted: the bonus token, drawn as a plain step draws
      v.tokens.push_back(cpu::sample_row(row, vocab, at));
      break;
    }
    const int32_t token = accept_or_resample(cpu::row_distribution(row, vocab, at), drafts[i], at.seed, at.step);
    v.tokens.push_back(token);
    if (token != drafts[i]) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace moeserve::spec
