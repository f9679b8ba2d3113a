#include "model/deepseek_v3_weights.h"

#include <fmt/format.h>

#include <algorithm>

#include "parallel/plan_parse.h"

namespace moeserve {

parallel::ShardDims shard_dims(const ModelConfig& c) {
  parallel::ShardDims d;
  d.layers = c.num_hidden_layers;
  d.heads = c.num_attention_heads;
  d.vocab = c.vocab_size;
  d.dense_intermediate = c.first_k_dense_replace > 0 ? c.intermediate_size : 0;
  d.shared_intermediate = c.shared_intermediate_size();
  d.experts = c.n_routed_experts;
  d.expert_intermediate = c.moe_intermediate_size;
  return d;
}

std::vector<WeightSlice> weight_slices_of_rank(const ModelConfig& c, const parallel::ParallelPlan& plan, int rank,
                                               int64_t element_bytes, ExpertSlices experts) {
  const parallel::RankShard s = parallel::shard_of(plan, shard_dims(c), rank);
  const int64_t hidden = c.hidden_size;
  const int64_t heads = s.heads.size();
  // Who else holds a slice: the same tp_index on every DP replica of the stage, or every rank
  // of the stage; routed-expert slices are held by one rank only.
  const bool owns_tp_slice = s.coord.dp_index == 0;
  const bool owns_stage_copy = s.coord.moe_index == 0;
  std::vector<WeightSlice> out;
  WeightFormats formats(c.quantization, element_bytes);
  // A 2-D weight [rows, cols]; `linear`: a projection the checkpoint may quantize.
  auto add2 = [&](std::string name, int64_t rows, int64_t cols, bool owned, bool linear = false, bool expert = false) {
    const WeightFormat format =
        linear ? formats.linear(name.substr(0, name.size() - std::string(".weight").size()), expert) : formats.plain();
    out.push_back({std::move(name), rows * cols, {rows, cols}, format, owned});
  };
  auto add = [&](std::string name, int64_t elements, bool owned) { add2(std::move(name), elements, 1, owned); };

  const std::string embed = c.tensor_prefix + "model.embed_tokens.weight";
  if (s.first_stage) add2(embed, s.vocab.size(), hidden, owns_tp_slice);
  if (s.last_stage) {
    add(c.tensor_prefix + "model.norm.weight", hidden, owns_stage_copy);
    // A tied head re-reads the first stage's embedding slices: always a replica.
    if (c.tie_word_embeddings)
      add2(embed, s.vocab.size(), hidden, false);
    else
      add2(c.tensor_prefix + "lm_head.weight", s.vocab.size(), hidden, owns_tp_slice, true);
  }
  const int64_t qk = c.qk_head_dim(), latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  for (int64_t l = s.layers.begin; l < s.layers.end; ++l) {
    const std::string p = fmt::format("{}model.layers.{}.", c.tensor_prefix, l);
    add(p + "input_layernorm.weight", hidden, owns_stage_copy);
    add(p + "post_attention_layernorm.weight", hidden, owns_stage_copy);
    if (c.q_lora_rank > 0) {
      add2(p + "self_attn.q_a_proj.weight", c.q_lora_rank, hidden, owns_stage_copy, true);
      add(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank, owns_stage_copy);
      add2(p + "self_attn.q_b_proj.weight", heads * qk, c.q_lora_rank, owns_tp_slice, true);
    } else {
      add2(p + "self_attn.q_proj.weight", heads * qk, hidden, owns_tp_slice, true);
    }
    add2(p + "self_attn.kv_a_proj_with_mqa.weight", latent + rope, hidden, owns_stage_copy, true);
    add(p + "self_attn.kv_a_layernorm.weight", latent, owns_stage_copy);
    add2(p + "self_attn.kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim), latent, owns_tp_slice, true);
    add2(p + "self_attn.o_proj.weight", hidden, heads * c.v_head_dim, owns_tp_slice, true);
    auto mlp = [&](const std::string& prefix, int64_t inter_local, bool owned, bool expert = false) {
      add2(prefix + "gate_proj.weight", inter_local, hidden, owned, true, expert);
      add2(prefix + "up_proj.weight", inter_local, hidden, owned, true, expert);
      add2(prefix + "down_proj.weight", hidden, inter_local, owned, true, expert);
    };
    if (!c.is_moe_layer(l)) {
      mlp(p + "mlp.", s.dense_intermediate.size(), owns_tp_slice);
      continue;
    }
    add2(p + "mlp.gate.weight", c.n_routed_experts, hidden, owns_stage_copy);
    add(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, owns_stage_copy);
    if (c.n_shared_experts > 0) mlp(p + "mlp.shared_experts.", s.shared_intermediate.size(), owns_tp_slice);
    // WeightFormats gives every routed expert of a layer the same format (the ignore list is
    // matched with the expert index taken out), so one slice can stand for all of them.
    const int64_t listed = experts == ExpertSlices::each ? s.experts.size() : std::min<int64_t>(s.experts.size(), 1);
    for (int64_t e = s.experts.begin; e < s.experts.begin + listed; ++e) {
      const size_t first = out.size();
      mlp(fmt::format("{}mlp.experts.{}.", p, e), s.expert_intermediate.size(), true, true);
      if (experts == ExpertSlices::one_per_layer)
        for (size_t i = first; i < out.size(); ++i) out[i].count = s.experts.size();
    }
  }
  return out;
}

bool dequantized_at_load(const std::string& module) {
  const std::string suffix = "self_attn.kv_b_proj";
  return module.size() >= suffix.size() && module.compare(module.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t loaded_bytes(const WeightSlice& slice, int64_t element_bytes) {
  const std::string module = slice.name.substr(0, slice.name.rfind('.'));
  if (slice.format.method != QuantMethod::none && dequantized_at_load(module)) return slice.elements * element_bytes;
  return slice.bytes();
}

RankWeights rank_weights(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                         int64_t element_bytes) {
  RankWeights w;
  for (const WeightSlice& slice :
       weight_slices_of_rank(config, plan, rank, element_bytes, ExpertSlices::one_per_layer)) {
    const int64_t elements = slice.elements * slice.count, bytes = slice.bytes() * slice.count;
    w.held_elements += elements;
    w.held_bytes += bytes;
    if (!slice.owned) continue;
    w.owned_elements += elements;
    w.owned_bytes += bytes;
  }
  return w;
}

int64_t stored_model_bytes(const ModelConfig& config, int64_t element_bytes) {
  return rank_weights(config, parallel::parse_plan("single"), 0, element_bytes).owned_bytes;
}

int64_t kv_bytes_per_token(const ModelConfig& c, const parallel::ParallelPlan& plan, int rank,
                           int64_t bytes_per_element) {
  const parallel::RankShard s = parallel::shard_of(plan, shard_dims(c), rank);
  return s.layers.size() * (c.kv_lora_rank + c.qk_rope_head_dim) * bytes_per_element;
}

}  // namespace moeserve
