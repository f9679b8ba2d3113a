// The advisor's prediction of a re-plan from resident weights (issue 26): the bytes each rank
// must receive to hold the new plan's shard (model/weight_index.h moves them: what the rank
// already holds is copied locally, the rest comes from its peers), and the time that takes on
// a hardware profile's links: peers at link_gbs per rank and direction (all ranks receive at
// once; a shared fabric caps their sum), local copies at memory_gbs (read and write).
// Bytes by tensor, from the plans' weight slices (model/deepseek_v3_weights.h), as stored
// (quantized weights move packed); a rank's local bytes of a tensor are the smaller of its
// old and new slices (exact when one slice lies inside the other, as between tp and ep plans
// of the same attention TP; an upper bound otherwise). Not modelled: the pause (one step), graph
// capture and the carried requests' recompute.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "parallel/plan.h"
#include "perf/hardware_profile.h"

namespace moeserve::perf {

struct ReplanPrediction {
  std::string from, to, hardware;
  std::vector<double> local_bytes, peer_bytes;  // by new rank
  double move_s = 0;                            // the busiest rank's local copies and receives
  int busiest_rank = 0;
};

ReplanPrediction predict_replan(const ModelConfig& config, const parallel::ParallelPlan& from,
                                const parallel::ParallelPlan& to, const HardwareProfile& profile);

// Markdown lines: bytes moved, by whom, and the predicted time, with the profile's link figures.
std::string replan_markdown(const ReplanPrediction& p, const HardwareProfile& profile);

}  // namespace moeserve::perf
