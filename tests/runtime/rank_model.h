// Test helper: the shards of every rank of a plan, built the way the engine builds them
// (own backend, own weight source, communicators from one in-process world) but without
// running anything.
#pragma once

#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/in_process.h"
#include "model/deepseek_v3.h"
#include "model/model_source.h"
#include "runtime/rank_comms.h"

namespace moeserve::testing {

struct LoadedRank {
  std::unique_ptr<ops::Backend> backend;
  std::unique_ptr<WeightSource> weights;
  runtime::RankComms comms;
  std::unique_ptr<DeepseekV3> model;
};

struct LoadedPlan {
  std::unique_ptr<comm::InProcessWorld> world;
  std::vector<LoadedRank> ranks;
};

// `wrap` may replace each rank's weight source (e.g. by a recording one).
template <typename Wrap>
LoadedPlan load_plan(const ModelSource& model, const parallel::ParallelPlan& plan, Wrap wrap) {
  LoadedPlan out;
  out.world = std::make_unique<comm::InProcessWorld>(plan.world());
  out.ranks.resize(plan.world());
  for (int r = 0; r < plan.world(); ++r) {
    LoadedRank& rank = out.ranks[r];
    rank.backend = cpu::make_cpu_backend();
    rank.weights = wrap(model.weights());
    rank.comms = runtime::make_rank_comms(*out.world, plan, r);
    rank.model = std::make_unique<DeepseekV3>(model.config, plan, r, *rank.backend, *rank.weights, rank.comms.groups(),
                                              KvCacheShape{1, 16});
  }
  return out;
}

}  // namespace moeserve::testing
