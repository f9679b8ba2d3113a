// A step's layout, pure bookkeeping (no tensors): which sequences run, on which attention-DP
// replica, in which pipeline micro-batch, with which KV pages, and which logit rows each gets
// back. The scheduler (sched/) fills StepPlans and the engine (runtime/) runs them: this leaf
// is all the two share.
//
//   * A sequence stays on one attention-DP replica for its life (its KV cache lives there).
//   * Every rank runs every micro-batch in order; a replica with no sequence in a micro-batch
//     runs it with 0 tokens (it must still join the MoE collectives of its stage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "step/forward_batch.h"

namespace moeserve::step {

// One replica's part of one micro-batch.
struct ReplicaBatch {
  ForwardBatch batch;
  std::vector<size_t> sequences;   // the caller's index of each batch sequence
  std::vector<int64_t> first_row;  // its first logit row
  std::vector<int64_t> num_rows;   // its logit rows (0, 1, or every token when asked)
};

struct MicroBatch {
  std::vector<ReplicaBatch> replicas;  // [attn_dp]
};

struct StepPlan {
  std::vector<MicroBatch> micro_batches;
};

// Every batch of `step` draws `draw` (ForwardBatch::draw).
void set_draw(StepPlan& step, DrawKind draw);

// How a step's sequences are cut into pipeline micro-batches.
struct MicroBatching {
  int pp = 1;
  int64_t max_micro_batch_size = 0;  // 0: one micro-batch without PP; with PP ceil(live / pp),
                                     // so that every stage has work
};

// Sequences per micro-batch for `live` sequences.
int64_t micro_batch_size(int64_t live, const MicroBatching& options);

// Which logit rows a sequence's tokens in a batch ask for.
enum class LogitRows {
  kNone,   // a prefill chunk before the last: no logits
  kLast,   // the last token's (the next token is sampled from it)
  kEvery,  // every token's (prompt logits)
};

// Appends tokens [begin, end) of a sequence (all its tokens `tokens`, its block table
// `pages`, which must cover position end - 1) to `rb` as sequence `sequence`; tokens before
// `begin` must already be in the cache. rb.batch.max_pages_per_seq must be set and at least
// pages.size().
void append_sequence(ReplicaBatch& rb, size_t sequence, std::span<const int32_t> tokens, int64_t begin, int64_t end,
                     std::span<const int32_t> pages, int64_t page_size, LogitRows logits);

// Appends `count` sequences of `length` tokens each (token 0 at positions 0.. of
// `scratch_page`, the last with its logit row) to `rb`: a step's shape of `count` sequences,
// of padding only, for running that shape before serving (length 1: a decode step's).
// rb.batch.max_pages_per_seq must be set; length at most page_size.
void append_scratch_sequences(ReplicaBatch& rb, int64_t count, int64_t length, int32_t scratch_page, int64_t page_size);

// The block-table width of a batch whose longest sequence holds `pages` pages: the next power
// of two (few step shapes).
int64_t block_table_width(int64_t pages);
// Every width block_table_width gives for sequences of up to `max_pages` pages, widest first.
std::vector<int64_t> block_table_widths(int64_t max_pages);

// The token count a batch of `tokens` is padded to, so that a server sees few distinct step
// shapes (each shape keeps a workspace, and on GPUs a captured graph): exact up to 8, then
// four steps per power of two (10, 12, 14, 16, 20, 24, 28, 32, 40, ...), at most 25% extra.
int64_t padded_token_count(int64_t tokens);

// Pads rb.batch to `tokens` tokens with one extra sequence at position 0 of `scratch_page`, a
// page no real sequence uses (the padding attends only to itself, so real rows are unchanged).
// When every real token asks for logits (a decode step), so does the padding, so that the
// batch keeps the decode shape; its rows follow the real ones and belong to no sequence.
void pad_batch(ReplicaBatch& rb, int64_t tokens, int32_t scratch_page, int64_t page_size);

}  // namespace moeserve::step
