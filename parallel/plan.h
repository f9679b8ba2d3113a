// ParallelPlan: how `world` ranks split the model. world = pp * attn_tp * attn_dp; inside a
// pipeline stage the MoE layers use moe_ep * moe_tp = attn_tp * attn_dp ranks. The rank
// layout formula lives in rank_coord() and nowhere else.
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::parallel {

struct ParallelPlan {
  std::string name = "single";
  int pp = 1;
  int attn_tp = 1;
  int attn_dp = 1;
  int moe_ep = 1;
  int moe_tp = 1;

  int world() const { return pp * attn_tp * attn_dp; }
  int ranks_per_stage() const { return attn_tp * attn_dp; }
};

// Where one rank sits in the plan.
struct RankCoord {
  int rank = 0;
  int stage = 0;         // pipeline stage
  int dp_index = 0;      // attention data-parallel replica within the stage
  int tp_index = 0;      // attention tensor-parallel index within the replica
  int moe_index = 0;     // index within the stage's MoE group = dp_index * attn_tp + tp_index
  int ep_index = 0;      // expert-parallel group = moe_index / moe_tp
  int moe_tp_index = 0;  // index within the expert's TP split = moe_index % moe_tp
};

// rank = stage * (attn_tp * attn_dp) + dp_index * attn_tp + tp_index
RankCoord rank_coord(const ParallelPlan& plan, int rank);
int rank_of(const ParallelPlan& plan, int stage, int dp_index, int tp_index);

// Half-open index range.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return begin <= i && i < end; }
  bool operator==(const Range&) const = default;
};

// Part `index` of `parts` equal parts of [0, total) (the first `total % parts` parts are one
// larger when it does not divide).
Range split_range(int64_t total, int parts, int index);

// The model dimensions that sharding needs (numbers only: parallel/ does not know ModelConfig).
struct ShardDims {
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t vocab = 0;
  int64_t dense_intermediate = 0;
  int64_t shared_intermediate = 0;
  int64_t experts = 0;
  int64_t expert_intermediate = 0;
};

// What one rank owns.
struct RankShard {
  RankCoord coord;
  Range layers;               // this stage's layers
  Range heads;                // attention heads (attention TP)
  Range dense_intermediate;   // dense MLP columns (follows attention TP)
  Range shared_intermediate;  // shared-expert columns (follows attention TP)
  Range experts;              // routed experts owned (EP)
  Range expert_intermediate;  // columns of each owned expert (MoE TP)
  Range vocab;                // embedding and LM-head rows (vocab parallel over attention TP)
  bool first_stage = true;
  bool last_stage = true;
};

RankShard shard_of(const ParallelPlan& plan, const ShardDims& dims, int rank);

}  // namespace moeserve::parallel
