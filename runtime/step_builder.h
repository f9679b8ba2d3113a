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

#include "model/deepseek_v3.h"

namespace moeserve::runtime {

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

// One replica's part of one micro-batch.
struct ReplicaBatch {
  ForwardBatch batch;
  std::vector<size_t> sequences;  // engine sequence index of each batch sequence
  std::vector<int64_t> first_row;  // its first logit row
  std::vector<int64_t> num_rows;   // its logit rows (1, or the whole prompt when asked)
};

struct MicroBatch {
  std::vector<ReplicaBatch> replicas;  // [attn_dp]
};

struct StepPlan {
  std::vector<MicroBatch> micro_batches;
};

struct StepOptions {
  int64_t page_size = 64;
  int64_t max_pages_per_seq = 0;
  int attn_dp = 1;
  int pp = 1;
  int64_t max_micro_batch_size = 0;  // sequences per micro-batch; 0: automatic (see above)
  bool logits_for_every_token = false;  // prompt logits: a row per uncached token
};

// Sequences per micro-batch for `live` sequences.
int64_t micro_batch_size(int64_t live, const StepOptions& options);

// Which logit rows a sequence's tokens in a batch ask for.
enum class LogitRows {
  kNone,   // a prefill chunk before the last: no logits
  kLast,   // the last token's (the next token is sampled from it)
  kEvery,  // every token's (prompt logits)
};

// Appends tokens [begin, end) of a sequence (all its tokens `tokens`, its block table
// `pages`, which must cover position end - 1) to `rb` as engine sequence `sequence`; tokens
// before `begin` must already be in the cache. rb.batch.max_pages_per_seq must be set and at
// least pages.size().
void append_sequence(ReplicaBatch& rb, size_t sequence, std::span<const int32_t> tokens, int64_t begin, int64_t end,
                     std::span<const int32_t> pages, int64_t page_size, LogitRows logits);

// The token count a batch of `tokens` is padded to, so that a server sees few distinct step
// shapes (each shape keeps a workspace, and on GPUs a captured graph): exact up to 8, then
// four steps per power of two (10, 12, 14, 16, 20, 24, 28, 32, 40, ...), at most 25% extra.
int64_t padded_token_count(int64_t tokens);

// Pads rb.batch to `tokens` tokens with one extra sequence at position 0 of `scratch_page`, a
// page no real sequence uses (the padding attends only to itself, so real rows are unchanged).
// When every real token asks for logits (a decode step), so does the padding, so that the
// batch keeps the decode shape; its rows follow the real ones and belong to no sequence.
void pad_batch(ReplicaBatch& rb, int64_t tokens, int32_t scratch_page, int64_t page_size);

// Builds the step for `live` (indices into `seqs`, in order): allocates pages for their
// uncached tokens and marks those tokens cached.
StepPlan build_step(std::vector<SequenceState>& seqs, const std::vector<size_t>& live, std::vector<PagePool>& pools,
                    const StepOptions& options);

}  // namespace moeserve::runtime
