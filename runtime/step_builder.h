// Step building, pure bookkeeping (no tensors): which sequences run this step, on which DP
// replica, in which pipeline micro-batch, with which KV pages, and which logit rows each
// sequence gets back.
//
//   * A sequence stays on one attention-DP replica for its life (its KV cache lives there);
//     the engine assigns request i to replica i % attn_dp.
//   * Each replica has its own page pool (its ranks' caches are separate).
//   * The step's live sequences, in request order, are cut into micro-batches of at most
//     max_micro_batch_size sequences (0: one micro-batch without PP; with PP, ceil(live / pp)
//     so that every stage has work). Every rank runs every micro-batch in order; a replica
//     with no sequence in a micro-batch runs it with 0 tokens (it must still join the MoE
//     collectives of its stage).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "step/step_plan.h"

namespace moeserve::runtime {

using step::LogitRows;
using step::MicroBatch;
using step::ReplicaBatch;
using step::StepPlan;

// Free-list of KV pages of one replica.
class PagePool {
 public:
  explicit PagePool(int64_t num_pages);
  int32_t take();  // throws when empty
  void give_back(const std::vector<int32_t>& pages);
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }

 private:
  std::vector<int32_t> free_;
};

struct SequenceState {
  std::vector<int32_t> tokens;  // prompt then generated
  std::vector<int32_t> pages;   // in its replica's pool
  int64_t prompt_len = 0;
  int64_t cached = 0;  // tokens whose latents are in the cache
  int replica = 0;
  bool finished = false;
};

struct StepOptions {
  int64_t page_size = 64;
  int64_t max_pages_per_seq = 0;
  int attn_dp = 1;
  int pp = 1;
  int64_t max_micro_batch_size = 0;  // sequences per micro-batch; 0: automatic (step::MicroBatching)
  bool logits_for_every_token = false;  // prompt logits: a row per uncached token
};

// Builds the step for `live` (indices into `seqs`, in order): allocates pages for their
// uncached tokens and marks those tokens cached.
StepPlan build_step(std::vector<SequenceState>& seqs, const std::vector<size_t>& live, std::vector<PagePool>& pools,
                    const StepOptions& options);

}  // namespace moeserve::runtime
