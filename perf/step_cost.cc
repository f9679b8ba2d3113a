#include "perf/step_cost.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/deepseek_v3_weights.h"

namespace moeserve::perf {

namespace {

// Bytes one decode step reads of each weight: as the backend holds it (packed int4 / fp8
// values and their scales as the checkpoint stores them; kv_b_proj dequantized at load).
struct WeightBytes {
  WeightFormats formats;
  const ModelConfig& c;
  int64_t element_bytes;
  // [n, k] linear `module` (a tensor name without ".weight").
  double linear(const std::string& module, int64_t n, int64_t k, bool expert = false) {
    if (dequantized_at_load(module)) return static_cast<double>(n * k * element_bytes);
    return static_cast<double>(stored_bytes({n, k}, formats.linear(module, expert)));
  }
  // An MLP of `inter` columns: gate and up [inter, hidden], down [hidden, inter].
  double mlp(const std::string& prefix, int64_t inter, bool expert = false) {
    const int64_t h = c.hidden_size;
    return linear(prefix + "gate_proj", inter, h, expert) + linear(prefix + "up_proj", inter, h, expert) +
           linear(prefix + "down_proj", h, inter, expert);
  }
  double attention(const std::string& p, int64_t heads) {
    const int64_t h = c.hidden_size, latent = c.kv_lora_rank, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
    double bytes = static_cast<double>((2 * h + latent + c.q_lora_rank) * element_bytes);  // norms
    bytes += linear(p + "self_attn.kv_a_proj_with_mqa", latent + rope, h);
    bytes += linear(p + "self_attn.kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), latent);
    bytes += linear(p + "self_attn.o_proj", h, heads * c.v_head_dim);
    if (c.q_lora_rank > 0)
      return bytes + linear(p + "self_attn.q_a_proj", c.q_lora_rank, h) +
             linear(p + "self_attn.q_b_proj", heads * qk, c.q_lora_rank);
    return bytes + linear(p + "self_attn.q_proj", heads * qk, h);
  }
};

}  // namespace

StepCost decode_step_cost(const ModelConfig& c, const parallel::RankShard& s, const StepShape& shape,
                          double weight_elem, double kv_elem) {
  StepCost cost;
  const double T = static_cast<double>(shape.tokens);
  const double readers = static_cast<double>(shape.sequences > 0 ? shape.sequences : shape.tokens);  // of the cache
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(s.heads.size());
  const double qk = static_cast<double>(c.qk_head_dim());
  const double latent = static_cast<double>(c.kv_lora_rank), rope = static_cast<double>(c.qk_rope_head_dim);
  const double nope = static_cast<double>(c.qk_nope_head_dim), v = static_cast<double>(c.v_head_dim);
  WeightBytes bytes{WeightFormats(c.quantization, static_cast<int64_t>(weight_elem)), c,
                    static_cast<int64_t>(weight_elem)};

  // Parameters of one layer's attention on this rank (heads split; kv_a replicated): the FLOPs.
  double attention = 2 * h + c.kv_lora_rank + h * (latent + rope) + heads * (nope + v) * latent + h * heads * v;
  attention += c.q_lora_rank > 0 ? h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * heads * qk : h * heads * qk;
  const double dense = 3 * h * static_cast<double>(s.dense_intermediate.size());
  const double shared = 3 * h * static_cast<double>(s.shared_intermediate.size());
  const double expert = 3 * h * static_cast<double>(s.expert_intermediate.size());
  const double router = static_cast<double>(c.n_routed_experts) * h;  // fp32

  const int64_t local_experts = s.experts.size();
  int64_t moe_index = 0;
  for (int64_t layer = s.layers.begin; layer < s.layers.end; ++layer) {
    const std::string p = fmt::format("{}model.layers.{}.", c.tensor_prefix, layer);
    cost.weight_bytes += bytes.attention(p, s.heads.size());
    cost.flops += 2 * T * attention;
    // Absorbed attention over the context: scores (latent + rope) and output (latent) per head.
    cost.kv_bytes += readers * static_cast<double>(shape.context) * (latent + rope) * kv_elem;
    cost.flops += 2 * T * heads * static_cast<double>(shape.context) * (2 * latent + rope);
    if (!c.is_moe_layer(layer)) {
      cost.weight_bytes += bytes.mlp(p + "mlp.", s.dense_intermediate.size());
      cost.flops += 2 * T * dense;
      continue;
    }
    int64_t hit = std::min<int64_t>(local_experts, shape.tokens * c.num_experts_per_tok);
    if (moe_index < static_cast<int64_t>(shape.experts_hit.size())) hit = shape.experts_hit[moe_index];
    ++moe_index;
    // The routed experts of a layer share one format per projection (WeightFormats).
    const double expert_bytes = local_experts > 0 ? bytes.mlp(fmt::format("{}mlp.experts.{}.", p, s.experts.begin),
                                                              s.expert_intermediate.size(), true)
                                                  : 0.0;
    const double shared_bytes =
        c.n_shared_experts > 0 ? bytes.mlp(p + "mlp.shared_experts.", s.shared_intermediate.size()) : 0.0;
    cost.expert_bytes += static_cast<double>(hit) * expert_bytes;
    cost.weight_bytes += static_cast<double>(hit) * expert_bytes + shared_bytes + router * 4;
    // Each token runs top_k experts; on this rank, the share its experts cover.
    const double local_share = static_cast<double>(local_experts) / static_cast<double>(c.n_routed_experts);
    cost.flops += 2 * T * (static_cast<double>(c.num_experts_per_tok) * local_share * expert + shared + router);
  }
  if (s.last_stage) {
    const double head = static_cast<double>(s.vocab.size()) * h;
    cost.weight_bytes += c.tie_word_embeddings
                             ? head * weight_elem
                             : bytes.linear(c.tensor_prefix + "lm_head", s.vocab.size(), c.hidden_size);
    cost.flops += 2 * T * head;
  }
  if (s.first_stage) cost.weight_bytes += T * h * weight_elem;  // embedding rows gathered
  cost.activation_bytes = T * h * weight_elem * 4 * static_cast<double>(s.layers.size());
  return cost;
}

}  // namespace moeserve::perf
