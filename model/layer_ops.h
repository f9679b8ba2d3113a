// The ops' Params of a layer's weights: a linear with its layout, the router and the routed
// experts of a part.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/deepseek_v3_loader.h"
#include "model/workspace.h"
#include "ops/ops.h"

namespace moeserve {

// y [rows, out] = x [rows, in] @ w^T (dense strides), with w's layout (packed or not).
ops::LinearParams linear_params(const void* x, const LinearWeight& w, void* y, int64_t rows, int64_t in, int64_t out);

// Routes x [tokens, hidden] (DeepSeek-V3's grouped top-k) into a.topk_ids / a.topk_weights
// [tokens, top_k].
ops::MoeRouteParams route_params(const ModelConfig& c, const LayerWeights& layer, const void* x, int64_t tokens,
                                 Activations& a);

// Rows routed to experts: x [tokens, hidden], ids / weights [tokens, top_k], out [tokens, hidden].
struct RoutedRows {
  const void* x;
  const int32_t* ids;
  const float* weights;
  void* out;
  int64_t tokens, top_k;
};

// The routed experts of `part` (its experts, its columns) on `rows`.
ops::MoeExpertsParams experts_params(const LayerPart& part, const RoutedRows& rows, int64_t hidden);

}  // namespace moeserve
