// Verification of drafts against the target's logits of one forward: the sequence ran
// [last token, draft_1 .. draft_k] as k + 1 query tokens, and row i of its logits is the
// target's prediction after draft_i (row 0: after the last token).
//   - greedy: drafts are accepted while each equals the target's argmax before it; the next
//     token is the target's argmax at the first mismatch (or after the last draft: the bonus);
//   - sampled: the token at each position is the plain sampler's draw there (cpu::sample_row
//     at the same seed and step: the distribution p of temperature, top_k, top_p, min_p), and
//     a draft is accepted when it is that token. This is rejection sampling (Leviathan et al.
//     2023) with the draft distribution a point mass, in its maximal coupling: the draft d is
//     accepted with probability p(d), and a rejection's token follows p without d,
//     renormalised, as the residual max(p - q, 0) requires. The output is then the plain
//     sampler's token for token, whatever was drafted and however many drafts a step verified
//     (spec/draft_budget.h changes that from step to step), so a seeded request's output does
//     not depend on the drafts, the load or the timing.
// Every random number is a pure function of (seed, step): the i-th token of a step is drawn
// at step options.step + i.
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

// rows: [drafts.size() + 1, vocab] fp32 target logits; options.step: the step of the first
// token (the request's generated count). A position without a draft (the last) is drawn by
// cpu::sample_row, as a plain step draws it.
Verdict verify_sampled(std::span<const int32_t> drafts, const float* rows, int64_t vocab,
                       const ops::SamplingOptions& options);

}  // namespace moeserve::spec
