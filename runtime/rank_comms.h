// The communicators of one rank under a plan, split out of an in-process world:
//   attn_tp   the ranks of its stage and DP replica   (attention, dense MLP, vocab)
//   moe       every rank of its stage                 (routed experts)
//   pipeline  the ranks with its (dp, tp) index in every stage, group rank = stage
// Members come from parallel::rank_of, the one rank-layout formula.
#pragma once

#include <memory>
#include <vector>

#include "comm/world.h"
#include "model/deepseek_v3.h"
#include "parallel/plan.h"

namespace moeserve::runtime {

struct RankComms {
  std::unique_ptr<comm::Communicator> attn_tp, moe, pipeline;
  RankGroups groups() const { return {attn_tp.get(), moe.get()}; }
  // Everything this rank's communicators counted.
  comm::CommStats stats() const;
};

// Group members (world ranks in group-rank order) of `rank`'s groups.
std::vector<int> attn_tp_members(const parallel::ParallelPlan& plan, int rank);
std::vector<int> moe_members(const parallel::ParallelPlan& plan, int rank);
std::vector<int> pipeline_members(const parallel::ParallelPlan& plan, int rank);

RankComms make_rank_comms(comm::World& world, const parallel::ParallelPlan& plan, int rank);

}  // namespace moeserve::runtime
