#include "perf/step_cost.h"

#include <algorithm>

namespace moeserve::perf {

StepCost decode_step_cost(const ModelConfig& c, const parallel::RankShard& s, const StepShape& shape,
                          double weight_elem, double kv_elem) {
  StepCost cost;
  const double T = static_cast<double>(shape.tokens);
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(s.heads.size());
  const double qk = static_cast<double>(c.qk_head_dim());
  const double latent = static_cast<double>(c.kv_lora_rank), rope = static_cast<double>(c.qk_rope_head_dim);
  const double nope = static_cast<double>(c.qk_nope_head_dim), v = static_cast<double>(c.v_head_dim);

  // Parameters of one layer's attention on this rank (heads split; kv_a replicated).
  double attention = 2 * h + c.kv_lora_rank + h * (latent + rope) + heads * (nope + v) * latent + h * heads * v;
  attention += c.q_lora_rank > 0 ? h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * heads * qk : h * heads * qk;
  const double dense = 3 * h * static_cast<double>(s.dense_intermediate.size());
  const double shared = 3 * h * static_cast<double>(s.shared_intermediate.size());
  const double expert = 3 * h * static_cast<double>(s.expert_intermediate.size());
  const double router = static_cast<double>(c.n_routed_experts) * h;  // fp32

  const int64_t local_experts = s.experts.size();
  int64_t moe_index = 0;
  for (int64_t layer = s.layers.begin; layer < s.layers.end; ++layer) {
    cost.weight_bytes += attention * weight_elem;
    cost.flops += 2 * T * attention;
    // Absorbed attention over the context: scores (latent + rope) and output (latent) per head.
    cost.kv_bytes += T * static_cast<double>(shape.context) * (latent + rope) * kv_elem;
    cost.flops += 2 * T * heads * static_cast<double>(shape.context) * (2 * latent + rope);
    if (!c.is_moe_layer(layer)) {
      cost.weight_bytes += dense * weight_elem;
      cost.flops += 2 * T * dense;
      continue;
    }
    int64_t hit = std::min<int64_t>(local_experts, shape.tokens * c.num_experts_per_tok);
    if (moe_index < static_cast<int64_t>(shape.experts_hit.size())) hit = shape.experts_hit[moe_index];
    ++moe_index;
    cost.expert_bytes += static_cast<double>(hit) * expert * weight_elem;
    cost.weight_bytes += static_cast<double>(hit) * expert * weight_elem + shared * weight_elem + router * 4;
    // Each token runs top_k experts; on this rank, the share its experts cover.
    const double local_share = static_cast<double>(local_experts) / static_cast<double>(c.n_routed_experts);
    cost.flops += 2 * T * (static_cast<double>(c.num_experts_per_tok) * local_share * expert + shared + router);
  }
  if (s.last_stage) {
    const double head = static_cast<double>(s.vocab.size()) * h;
    cost.weight_bytes += head * weight_elem;
    cost.flops += 2 * T * head;
  }
  if (s.first_stage) cost.weight_bytes += T * h * weight_elem;  // embedding rows gathered
  cost.activation_bytes = T * h * weight_elem * 4 * static_cast<double>(s.layers.size());
  return cost;
}

}  // namespace moeserve::perf
