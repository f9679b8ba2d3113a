#include "runtime/rank_comms.h"

#include <fmt/format.h>

namespace moeserve::runtime {

comm::CommStats RankComms::stats() const {
  comm::CommStats total;
  for (const auto* c : {attn_tp.get(), moe.get(), pipeline.get()})
    if (c) total.merge(c->stats());
  return total;
}

std::vector<int> attn_tp_members(const parallel::ParallelPlan& plan, int rank) {
  const parallel::RankCoord c = parallel::rank_coord(plan, rank);
  std::vector<int> members;
  for (int tp = 0; tp < plan.attn_tp; ++tp) members.push_back(parallel::rank_of(plan, c.stage, c.dp_index, tp));
  return members;
}

std::vector<int> moe_members(const parallel::ParallelPlan& plan, int rank) {
  const parallel::RankCoord c = parallel::rank_coord(plan, rank);
  std::vector<int> members;
  for (int dp = 0; dp < plan.attn_dp; ++dp)
    for (int tp = 0; tp < plan.attn_tp; ++tp) members.push_back(parallel::rank_of(plan, c.stage, dp, tp));
  return members;
}

std::vector<int> pipeline_members(const parallel::ParallelPlan& plan, int rank) {
  const parallel::RankCoord c = parallel::rank_coord(plan, rank);
  std::vector<int> members;
  for (int stage = 0; stage < plan.pp; ++stage)
    members.push_back(parallel::rank_of(plan, stage, c.dp_index, c.tp_index));
  return members;
}

RankComms make_rank_comms(comm::World& world, const parallel::ParallelPlan& plan, int rank) {
  const parallel::RankCoord c = parallel::rank_coord(plan, rank);
  RankComms comms;
  comms.attn_tp =
      world.communicator(rank, fmt::format("attn_tp.s{}.d{}", c.stage, c.dp_index), attn_tp_members(plan, rank));
  comms.moe = world.communicator(rank, fmt::format("moe.s{}", c.stage), moe_members(plan, rank));
  comms.pipeline =
      world.communicator(rank, fmt::format("pipeline.d{}.t{}", c.dp_index, c.tp_index), pipeline_members(plan, rank));
  return comms;
}

}  // namespace moeserve::runtime
