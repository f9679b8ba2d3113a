// The activation workspace of a rank: per step size T, a step's metadata buffers and views of
// one activation arena shared by every T, plus the head's buffers in a second arena sized by
// the most logit rows asked. Growing either arena moves buffers that captured graphs point
// at, so the workspace drops those graphs (GraphCache).
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "model/config.h"
#include "model/graph_cache.h"
#include "ops/ops.h"
#include "parallel/plan.h"
#include "sample/sampler.h"

namespace moeserve {

struct ForwardBatch;

// A step's buffers for T tokens. The metadata buffers are kept per T and filled by the host
// before each run; the activations are views of one arena shared by every T (steps run one
// at a time on a rank), so a captured graph replays with the same pointers and memory does
// not grow with the number of step sizes.
struct Activations {
  using BufferPtr = ops::BufferPtr;
  int64_t tokens = 0;
  int64_t block_table_capacity = 0;  // int32 entries of block_tables
  bool logit_adjust = false;         // the last prepared batch of this size has logit adjustments
  BufferPtr ids, positions, seq_of_token, slots, block_tables, logit_rows;  // int32 metadata
  BufferPtr mtp_ids;                                                        // [T] int32 (an MTP layer)
  BufferPtr mtp_rows;  // [T] int32: an MTP draft step's hidden store rows (ForwardBatch::mtp_hidden_rows)
  BufferPtr hidden;    // [T, hidden] residual stream
  BufferPtr normed;    // [T, hidden]
  // [T, hidden] fp32: output of attention / MLP before the residual add. Partial sums over
  // heads, columns and experts are added across ranks in fp32 and rounded to the activation
  // dtype once, in the residual add: every plan rounds where one GPU does.
  BufferPtr branch;
  // A reduction plan: [parts, T, hidden] fp32, one partial branch per part (a.branch views
  // part 0, where their tree sum lands), and with more than 2 ranks per stage the ranks'
  // sums gathered [ranks, T, hidden] fp32 to be added in the same tree.
  BufferPtr branch_parts, branch_gather;
  BufferPtr q_a;           // [T, q_lora]
  BufferPtr q_a_normed;    // [T, q_lora]
  BufferPtr q;             // [T, heads_local, qk_head_dim]
  BufferPtr kv;            // [T, latent + rope]: normalised latent + roped key, as cached
  BufferPtr q_latent;      // [T, heads_local, latent]
  BufferPtr attn_latent;   // [T, heads_local, latent]
  BufferPtr attn_v;        // [T, heads_local * v]
  BufferPtr gate_up;       // [T, 2 * max inter]
  BufferPtr act;           // [T, max inter]
  BufferPtr topk_ids;      // [T, top_k] int32
  BufferPtr topk_weights;  // [T, top_k] fp32
  BufferPtr mtp_in;        // [T, 2 * hidden]: the MTP layer's eh_proj input (an MTP layer)
  // The head's buffers, last stage only, for R rows (views of the head arena, grown on demand).
  BufferPtr selected;         // [R, hidden] rows that get logits, normalised
  BufferPtr local_logits;     // [R, vocab_local] fp32
  BufferPtr gathered_logits;  // [attn_tp, R, vocab_local] fp32
  // Greedy draws: this rank's slice maxima, values [R] then ids [R] in one buffer, so that a
  // single all-gather moves both: gathered [attn_tp, 2R].
  BufferPtr greedy_pairs;
  BufferPtr gathered_pairs;
  // Candidate draws: C = candidates_per_slice per row of this rank's vocab slice.
  BufferPtr temperatures;                             // [R] fp32, uploaded with the step
  BufferPtr token_bitmask;                            // [R, ceil(vocab / 32)] int32, upload_token_bitmask()
  BufferPtr cand_values, cand_ids;                    // [R, C]: a row's first value is its slice's maximum
  BufferPtr cand_normaliser;                          // [R] fp64
  BufferPtr gathered_cand_values, gathered_cand_ids;  // [attn_tp, R, C]
  BufferPtr gathered_cand_normaliser;                 // [attn_tp, R] fp64
};

// The data of an optional buffer (null when absent), as bytes for offsets into it.
inline void* ptr(const ops::BufferPtr& b) { return b ? b->data() : nullptr; }
inline std::byte* bytes(const ops::BufferPtr& b) { return static_cast<std::byte*>(ptr(b)); }

// What sizes the buffers.
struct WorkspaceDims {
  const ModelConfig& config;
  const parallel::RankShard& shard;
  int parts;                     // of each split this rank computes
  int attn_tp;                   // the plan's attention TP
  int head_tp;                   // ranks of the attention-TP group (1 without one)
  bool reduction_plan;           // a reduction plan of more than one rank
  int64_t candidates_per_slice;  // DrawKind::kCandidates, per row and vocab part
  bool mtp = false;              // the rank runs an MTP layer
};

class Workspace {
 public:
  Workspace(const WorkspaceDims& dims, ops::Backend& backend, GraphCache& graphs)
      : dims_(dims), backend_(backend), graphs_(graphs) {}

  Activations& of(int64_t tokens);
  // The workspace of `batch`'s token count with its metadata (ids, positions, slots, block
  // tables, logit rows; on the last stage a kCandidates batch's temperatures) uploaded.
  Activations& prepare(const ForwardBatch& batch);
  // A constrained batch's token bitmask into `a`, once the step loop has filled it (waits for
  // it: the forward to the logits is enqueued first); never waits for the device.
  void upload_token_bitmask(Activations& a, const TokenBitmask& mask);
  // Grow a's block table to `entries` (dropping the graphs of a's size that point at the old one).
  void reserve_block_tables(Activations& a, int64_t entries);
  void reserve_logit_rows(int64_t rows);  // last stage: the head arena, for `rows` rows
  int64_t head_rows() const { return head_rows_; }
  // a's head buffers as the sampler reads and writes them.
  sample::SamplerBuffers sampler_buffers(const Activations& a) const;

 private:
  // Points a's activation (head) buffers into `arena` for T tokens (rows); returns the bytes
  // the layout needs. With a == nullptr, only measures.
  size_t lay_out_activations(Activations* a, int64_t T, ops::Buffer* arena) const;
  size_t lay_out_head(Activations* a, int64_t rows, ops::Buffer* arena) const;

  WorkspaceDims dims_;
  ops::Backend& backend_;
  GraphCache& graphs_;
  std::map<int64_t, std::unique_ptr<Activations>> workspaces_;  // by token count
  ops::BufferPtr arena_;  // activations of every step size, laid out for arena_tokens_
  int64_t arena_tokens_ = 0;
  ops::BufferPtr head_arena_;  // the head's buffers, for head_rows_ rows
  int64_t head_rows_ = 0;
  // Last stage: a batch's logit adjustments (ops::LogitAdjustEntry [adjust_capacity_]) and
  // their count, uploaded with it; grown on demand (dropping the graphs that point at them).
  ops::BufferPtr adjust_entries_, adjust_count_;
  int64_t adjust_capacity_ = 0;
  double mask_wait_ms_ = 0, mask_upload_ms_ = 0;  // upload_token_bitmask's timing (MOESERVE_GRAMMAR_TIMING)
  int64_t masks_uploaded_ = 0;
  void upload_logit_adjust(Activations& a, const ForwardBatch& batch);
};

}  // namespace moeserve
