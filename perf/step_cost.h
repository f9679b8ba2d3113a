// What one decode step must move and compute on one rank: the accounting shared by
// `bench-step` (achieved GB/s and TFLOP/s) and the performance model. Counts are logical:
// every weight byte the step needs is read once, every KV byte of the context once.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "parallel/plan.h"

namespace moeserve::perf {

struct StepCost {
  double weight_bytes = 0;  // attention, dense MLP, shared experts, routed experts hit, router, LM head
  double expert_bytes = 0;  // of which routed experts
  double kv_bytes = 0;      // latent cache read by attention
  double activation_bytes = 0;
  double flops = 0;
  double total_bytes() const { return weight_bytes + kv_bytes + activation_bytes; }
};

struct StepShape {
  int64_t tokens = 1;   // tokens in the step on this rank (decode: one per sequence)
  int64_t context = 0;  // context length each token attends to
  // Sequences the tokens belong to (0: one each). A sequence's tokens (a speculative verify
  // step's) attend to the same cached context, which must be read once per sequence.
  int64_t sequences = 0;
  // Distinct local experts hit, per MoE layer of this rank's stage (empty: all tokens x
  // top_k hit distinct experts, capped at the local expert count).
  std::vector<int64_t> experts_hit;
};

// weight_elem: bytes per weight element (2 for bf16); kv_elem likewise.
StepCost decode_step_cost(const ModelConfig& config, const parallel::RankShard& shard, const StepShape& shape,
                          double weight_elem = 2, double kv_elem = 2);

}  // namespace moeserve::perf
