// Whether a re-plan can assemble the new plan's shards from the resident ones in place: while
// it copies, device r holds old rank r's shard and new rank r's (the old one is freed once
// the new engine is built), so both must fit its memory together. Checked before anything
// stops; a plan that does not fit is re-planned from the model's source instead.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "parallel/plan.h"

namespace moeserve::runtime {

struct ReshardFitParams {
  const ModelConfig& config;
  const parallel::ParallelPlan& from;
  const parallel::ParallelPlan& to;
  int64_t element_bytes = 2;   // the backend's unquantized weights (fp32 on CPU ranks)
  int64_t bytes_per_rank = 0;  // each device's memory for weights; 0: unbounded
};

// "" when every device fits both shards, else why not (the rank and its bytes).
std::string reshard_fit(const ReshardFitParams& p);

}  // namespace moeserve::runtime
