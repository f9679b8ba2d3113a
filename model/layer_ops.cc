#include "model/layer_ops.h"

namespace moeserve {

ops::LinearParams linear_params(const void* x, const LinearWeight& w, void* y, int64_t rows, int64_t in, int64_t out) {
  ops::LinearParams p{x, ptr(w), y, rows, in, out, in, out};
  p.weight_quant = w.quant;
  return p;
}

ops::MoeRouteParams route_params(const ModelConfig& c, const LayerWeights& layer, const void* x, int64_t tokens,
                                 Activations& a) {
  return {x,
          static_cast<const float*>(ptr(layer.router)),
          static_cast<const float*>(ptr(layer.router_bias)),
          static_cast<int32_t*>(ptr(a.topk_ids)),
          static_cast<float*>(ptr(a.topk_weights)),
          tokens,
          c.hidden_size,
          c.n_routed_experts,
          c.n_group,
          c.topk_group,
          c.num_experts_per_tok,
          c.norm_topk_prob,
          static_cast<float>(c.routed_scaling_factor)};
}

ops::MoeExpertsParams experts_params(const LayerPart& part, const RoutedRows& rows, int64_t hidden) {
  return {.x = rows.x,
          .topk_ids = rows.ids,
          .topk_weights = rows.weights,
          .w13 = static_cast<const void* const*>(ptr(part.expert_w13_table)),
          .w2 = static_cast<const void* const*>(ptr(part.expert_w2_table)),
          .out = rows.out,
          .tokens = rows.tokens,
          .top_k = rows.top_k,
          .hidden = hidden,
          .inter = part.expert_cols.size(),
          .expert_begin = part.experts.begin,
          .expert_end = part.experts.end,
          .w13_host = part.expert_w13_ptrs.data(),
          .w2_host = part.expert_w2_ptrs.data(),
          .expert_quant = part.expert_quant};
}

}  // namespace moeserve
