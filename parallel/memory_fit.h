// Does a plan fit the memory of its ranks? Each rank needs its weights plus the KV cache of
// the sequences it serves: with attention DP the requests are spread over the replicas, so a
// rank caches ceil(max_running_requests / attn_dp) sequences of context_tokens tokens each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/plan.h"

namespace moeserve::parallel {

struct MemoryBudget {
  int64_t bytes_per_rank = 0;        // --mem-per-rank
  int64_t context_tokens = 0;        // tokens cached per sequence (--context-length)
  int64_t max_running_requests = 1;  // sequences served at once (--max-running-requests)
};

// What one rank must hold, from the model's accounting.
struct RankMemory {
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;
};

// Sequences whose KV cache one rank holds.
int64_t sequences_per_rank(const ParallelPlan& plan, const MemoryBudget& budget);
// Bytes rank needs: weights + kv_bytes_per_token * context_tokens * sequences_per_rank.
int64_t rank_bytes_needed(const ParallelPlan& plan, const RankMemory& rank, const MemoryBudget& budget);

// How a plan that fits uses the budget: the rank needing the most, and the KV tokens the
// memory left after the weights holds on the rank with the least room.
struct MemoryFit {
  int tightest_rank = 0;
  int64_t needed_bytes = 0;   // that rank's weights + KV cache of the budget's sequences
  int64_t weight_bytes = 0;   // that rank's weights
  int64_t kv_token_room = 0;  // min over ranks of (budget - weights) / KV bytes per token
};

// Throws Error naming the plan, the first rank that does not fit and its sizes.
MemoryFit check_memory_fit(const ParallelPlan& plan, const std::vector<RankMemory>& ranks, const MemoryBudget& budget);

// "80GiB", "141 GB", "512MiB", "1073741824" -> bytes. `what` names the option in errors.
int64_t parse_byte_size(const std::string& text, const std::string& what);
// 1.50 GiB
std::string format_bytes(double bytes);

}  // namespace moeserve::parallel
