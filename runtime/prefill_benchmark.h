// Prefill benchmark (`moeserve bench-step --prefill N,...`): one sequence's prompt of N tokens
// in one forward pass (positions 0 .. N - 1, the last token's logits), timed over repeated
// passes, with the FLOPs it computes (perf/step_cost.h): the projections and dense layers, the
// routed experts each token was routed to (top_k rows per token), and causal attention in
// the absorbed form the kernels run (token i against i + 1 cached rows).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"

namespace moeserve::runtime {

struct PrefillBenchOptions {
  int iterations = 5;
  int warmup = 1;
};

struct PrefillBenchResult {
  int64_t tokens = 0;
  double ms = 0;  // median wall-clock time of one pass
  double tokens_per_s = 0;
  double flops = 0;            // all ranks
  double attention_flops = 0;  // of which attention over the context
};

// KV pages per rank and layer that benchmark_prefill needs for prompts of `tokens`.
int64_t prefill_pages(int64_t tokens, int64_t page_size);

std::vector<PrefillBenchResult> benchmark_prefill(Engine& engine, const std::vector<int64_t>& lengths,
                                                  const PrefillBenchOptions& options);

}  // namespace moeserve::runtime
