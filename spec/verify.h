// Verification of drafts against the target's logits of one forward: the sequence ran
// [last token, draft_1 .. draft_k] as k + 1 query tokens, and row i of its logits is the
// target's prediction after draft_i (row 0: after the last token).
//   - greedy: drafts are accepted while each equals the target's argmax before it; the next
//     token is the target's argmax at the first mismatch (or after the last draft: the bonus);
//   - sampled: rejection sampling (Leviathan et al. 2023) with the draft distribution a point
//     mass, which keeps the target distribution exactly: draft d is accepted with probability
//     p(d); rejected, the token is drawn from p without d, renormalised. p is the distribution
//     the plain sampler draws from (cpu::row_distribution: temperature, top_k, top_p, min_p).
// Every random number is a pure function of (seed, step): the i-th token of a step is drawn
// at step options.step + i, so a request's output is reproducible from its seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/sampling.h"
#include "step/sampling_options.h"

namespace moeserve::spec {

struct Verdict {
  int64_t accepted = 0;         // drafts accepted (a prefix of them)
  std::vector<int32_t> tokens;  // the accepted drafts, then the next token: accepted + 1 tokens
};

// target_ids[i]: the target's argmax of row i; drafts.size() + 1 of them.
Verdict verify_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target_ids);

// One draft position: `draft` when accepted, else a token drawn from p without it.
int32_t accept_or_resample(const cpu::TokenDistribution& p, int32_t draft, uint64_t seed, uint64_t step);

// rows: [drafts.size() + 1, vocab] fp32 target logits; options.step: the step of the first
// token (the request's generated count). A position without a draft (the last) is drawn by
// cpu::sample_row, as a plain step draws it.
Verdict verify_sampled(std::span<const int32_t> drafts, const float* rows, int64_t vocab,
                       const ops::SamplingOptions& options);

}  // namespace moeserve::spec
