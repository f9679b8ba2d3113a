// Token sampling on the host: the one definition of temperature / top-k / min-p / top-p draws
// (cpu::sample_row), run either over a row's full fp32 logits or over the candidates a device
// reduced the row to (ops::TopCandidatesParams), with the same result.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace moeserve::cpu {

// Draws one token from fp32 logits under `options` (greedy when temperature == 0).
int32_t sample_row(const float* logits, int64_t vocab, const ops::SamplingOptions& options);

// The distribution sample_row draws from under `options`: the kept tokens in the draw's
// order (descending logit, ties to the smaller id) and their probabilities (summing to 1;
// greedy: the argmax alone): the sampler's exact distribution, against which the tests of
// samplers and of speculative verification (spec/verify.h draws with sample_row) count draws.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};
TokenDistribution row_distribution(const float* logits, int64_t vocab, const ops::SamplingOptions& options);

// A row reduced to its `count` largest logits in descending order (ties: smaller id first)
// and the softmax normaliser at the sampling temperature over the whole vocabulary,
// sum_v exp((logit_v - values[0]) / temperature).
struct CandidateRow {
  const float* values;
  const int32_t* ids;
  int64_t count;
  double normaliser;
};
// The token sample_row draws from the full row, or -1 when the draw needs a candidate past
// `count` (a top-k above it, a min-p / top-p cut or a draw that reaches further): then the
// caller samples the row's full logits.
int32_t sample_candidates(const CandidateRow& row, int64_t vocab, const ops::SamplingOptions& options);

// The CPU reference of ops::TopCandidatesParams for one row: `count` <= vocab.
void top_candidates_row(const float* logits, int64_t vocab, int64_t count, float temperature, float* values,
                        int32_t* ids, double* normaliser);

}  // namespace moeserve::cpu
