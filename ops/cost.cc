#include "ops/ops.h"

namespace moeserve::ops {

OpCost cost_of(const LinearParams& p, size_t elem) {
  OpCost c;
  c.flops = 2.0 * p.rows * p.in_features * p.out_features;
  c.bytes = static_cast<double>(elem) *
            (p.out_features * p.in_features + p.rows * p.in_features + p.rows * p.out_features);
  return c;
}

OpCost cost_of(const MlaAttentionParams& p, size_t elem) {
  // Each token reads its context once per head group; positions are only known on the
  // host side of the step, so this counts the query and output terms only.
  OpCost c;
  c.bytes = static_cast<double>(elem) * p.tokens * p.heads * (2 * p.latent + p.rope);
  return c;
}

OpCost cost_of(const MoeExpertsParams& p, size_t elem, int64_t experts_hit) {
  OpCost c;
  c.flops = 2.0 * p.tokens * p.top_k * 3 * p.hidden * p.inter;
  c.bytes = static_cast<double>(elem) * (experts_hit * 3 * p.hidden * p.inter + 2 * p.tokens * p.hidden);
  return c;
}

}  // namespace moeserve::ops
