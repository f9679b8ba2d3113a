// Loads one rank's shard of the DeepSeek-V3 weights under a ParallelPlan (and a reduction
// plan's parts) into backend memory. model/deepseek_v3_weights.h does the same accounting
// without loading; a test checks that the two agree on every rank of every plan.
#pragma once

#include <memory>
#include <vector>

#include "model/config.h"
#include "model/weight_index.h"
#include "model/weight_source.h"
#include "ops/ops.h"
#include "parallel/plan.h"

namespace moeserve {

// One part of a layer's split weights: everything the rank holds (no reduction plan, or one
// with no more ranks than the plan's), else the part a rank of the reduction plan holds:
// 1 / parts of the rank's heads and dense / shared-expert columns, and of its routed experts
// by expert group and column as the reduction plan splits them. Own buffers, so that every
// kernel sees the shapes and alignment that rank's would.
// A linear's weight in backend memory: in the activation dtype, or packed as the checkpoint
// quantizes it (`quant`, ops/quant_layout.h: values then scales in the one buffer).
struct LinearWeight {
  ops::BufferPtr buffer;
  ops::QuantLayout quant;
  explicit operator bool() const { return buffer != nullptr; }
};
inline void* ptr(const LinearWeight& w) { return w.buffer ? w.buffer->data() : nullptr; }

struct LayerPart {
  LinearWeight q_proj;       // [heads_part * qk_head_dim, hidden]        (no q LoRA)
  LinearWeight q_b_proj;     // [heads_part * qk_head_dim, q_lora_rank]   (q LoRA)
  ops::BufferPtr kv_b_proj;  // [heads_part * (nope + v), kv_lora_rank]   (dequantized: the MLA ops read it)
  LinearWeight o_proj;       // [hidden, heads_part * v]
  // Dense MLP (first_k_dense_replace layers) or the shared experts.
  LinearWeight mlp_w13;  // [2 * inter_part, hidden]: gate rows then up rows
  LinearWeight mlp_w2;   // [hidden, inter_part]
  // Routed experts [experts.begin, experts.end) of this part, its columns expert_cols; every
  // w13 and w2 packed as expert_quant says.
  parallel::Range experts, expert_cols;
  ops::QuantLayout expert_quant;
  std::vector<ops::BufferPtr> expert_w13;                    // each [2 * expert_inter_part, hidden]
  std::vector<ops::BufferPtr> expert_w2;                     // each [hidden, expert_inter_part]
  ops::BufferPtr expert_w13_table, expert_w2_table;          // [local experts] pointers, in backend memory
  std::vector<const void*> expert_w13_ptrs, expert_w2_ptrs;  // the same pointers on the host
};

struct LayerWeights {
  bool is_moe = false;
  ops::BufferPtr input_norm, post_attention_norm;  // [hidden]
  LinearWeight q_a_proj;                           // [q_lora_rank, hidden]                       (q LoRA)
  ops::BufferPtr q_a_norm;                         // [q_lora_rank]
  LinearWeight kv_a_proj;        // [kv_lora_rank + rope, hidden]  (replicated: the latent is shared by all heads)
  ops::BufferPtr kv_a_norm;      // [kv_lora_rank]
  int64_t mlp_inter = 0;         // columns of the dense MLP or the shared experts per part
  ops::BufferPtr router;         // [experts, hidden] fp32
  ops::BufferPtr router_bias;    // [experts] fp32
  std::vector<LayerPart> parts;  // [parts]
};

// DeepSeek-V3's MTP layer (checkpoint tensors model.layers.<num_hidden_layers>.*): its input
// eh_proj(concat(enorm(embed(next token)), hnorm(final hidden))), one decoder block, and
// shared_head.norm before the head. The head and the embedding are the main model's (DeepSeek-V3
// shares them; the checkpoint's shared_head.head is a copy of lm_head).
struct MtpWeights {
  ops::BufferPtr enorm, hnorm;  // [hidden]
  LinearWeight eh_proj;         // [hidden, 2 * hidden]: embedding columns, then hidden-state columns
  ops::BufferPtr head_norm;     // [hidden] shared_head.norm
  std::unique_ptr<LayerWeights> block;
};

struct ModelWeights {
  ops::BufferPtr embed;                               // [vocab slice, hidden]            (first stage)
  ops::BufferPtr final_norm;                          // [hidden]                         (last stage)
  std::vector<LinearWeight> lm_head;                  // per part: [vocab slice / parts, hidden] (last stage)
  ops::BufferPtr inv_freq;                            // [rope / 2] fp32
  std::vector<std::unique_ptr<LayerWeights>> layers;  // this stage's layers
  std::unique_ptr<MtpWeights> mtp;                    // last stage, with WeightLoadParams::mtp
  // In the backend's dtypes; packed weights by their values and scales (loaded_bytes() of
  // model/deepseek_v3_weights.h), not the padding between them.
  int64_t bytes = 0;
  // Where every weight lies (a later re-plan assembles its shards from it).
  WeightIndex index;
};

struct WeightLoadParams {
  const ModelConfig& config;
  const parallel::RankShard& shard;
  int parts;  // of each split this rank computes (check_reduction_plan)
  const parallel::ParallelPlan& reduction_plan;
  ops::Backend& backend;
  WeightSource& source;
  bool mtp = false;  // the last stage loads the MTP layer (and the embedding, if not also the first)
};

// Only the slices the shard owns; synthetic weights are generated directly in backend memory.
ModelWeights load_weights(const WeightLoadParams& params);

}  // namespace moeserve
