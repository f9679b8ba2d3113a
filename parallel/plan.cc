#include "parallel/plan.h"

namespace moeserve::parallel {

RankCoord rank_coord(const ParallelPlan& plan, int rank) {
  RankCoord c;
  c.rank = rank;
  c.stage = rank / plan.ranks_per_stage();
  const int in_stage = rank % plan.ranks_per_stage();
  c.dp_index = in_stage / plan.attn_tp;
  c.tp_index = in_stage % plan.attn_tp;
  c.moe_index = in_stage;
  c.ep_index = c.moe_index / plan.moe_tp;
  c.moe_tp_index = c.moe_index % plan.moe_tp;
  return c;
}

int rank_of(const ParallelPlan& plan, int stage, int dp_index, int tp_index) {
  return stage * plan.ranks_per_stage() + dp_index * plan.attn_tp + tp_index;
}

Range split_range(int64_t total, int parts, int index) {
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  const int64_t begin = index * base + (index < extra ? index : extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

RankShard shard_of(const ParallelPlan& plan, const ShardDims& dims, int rank) {
  RankShard s;
  s.coord = rank_coord(plan, rank);
  const RankCoord& c = s.coord;
  s.layers = split_range(dims.layers, plan.pp, c.stage);
  s.heads = split_range(dims.heads, plan.attn_tp, c.tp_index);
  s.dense_intermediate = split_range(dims.dense_intermediate, plan.attn_tp, c.tp_index);
  s.shared_intermediate = split_range(dims.shared_intermediate, plan.attn_tp, c.tp_index);
  s.experts = split_range(dims.experts, plan.moe_ep, c.ep_index);
  s.expert_intermediate = split_range(dims.expert_intermediate, plan.moe_tp, c.moe_tp_index);
  s.vocab = split_range(dims.vocab, plan.attn_tp, c.tp_index);
  s.first_stage = c.stage == 0;
  s.last_stage = c.stage == plan.pp - 1;
  return s;
}

}  // namespace moeserve::parallel
