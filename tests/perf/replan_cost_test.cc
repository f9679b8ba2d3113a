// The advisor's re-plan prediction (perf/replan_cost.h) for the real K2.6 config (INT4 routed
// experts) on eight H200s and eight RTX PRO 6000s: every byte of the new shards is either
// already on its rank or received; tp8 -> ep8 keeps attention and the dense / shared MLPs in
// place and receives 7/8 of each rank's experts; the time is the busiest rank's bytes over the
// profile's link and memory figures.
#include "perf/replan_cost.h"

#include <gtest/gtest.h>

#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"

namespace moeserve::perf {
namespace {

double held(const ModelConfig& c, const parallel::ParallelPlan& plan, int rank) {
  return static_cast<double>(rank_weights(c, plan, rank, 2).held_bytes);
}

TEST(ReplanCost, Tp8ToEp8OnK26MovesExpertsAndPredictsFromTheLinks) {
  const ModelConfig c = synthetic_config("kimi-k2.6");
  const parallel::ParallelPlan tp8 = parallel::parse_plan("tp8"), ep8 = parallel::parse_plan("ep8");
  for (const char* name : {"h200-sxm-x8", "rtx-pro-6000-x8-pcie"}) {
    SCOPED_TRACE(name);
    const HardwareProfile hw = load_profile(std::string("perf/profiles/") + name + ".json");
    const ReplanPrediction p = predict_replan(c, tp8, ep8, hw);
    ASSERT_EQ(p.local_bytes.size(), 8u);
    double slowest = 0;
    for (int r = 0; r < 8; ++r) {
      EXPECT_DOUBLE_EQ(p.local_bytes[r] + p.peer_bytes[r], held(c, ep8, r)) << "rank " << r;
      // Experts are most of the bytes: far more arrives than stays.
      EXPECT_GT(p.peer_bytes[r], 3 * p.local_bytes[r]) << "rank " << r;
      slowest =
          std::max(slowest, 2 * p.local_bytes[r] / (hw.memory_gbs * 1e9) + p.peer_bytes[r] / (hw.link.link_gbs * 1e9));
    }
    EXPECT_DOUBLE_EQ(p.move_s, slowest);
    EXPECT_NE(replan_markdown(p, hw).find("tp8 -> ep8"), std::string::npos);
  }
}

TEST(ReplanCost, TheSamePlanMovesNothingOverTheLinks) {
  const ModelConfig c = synthetic_config("kimi-k2.6");
  const parallel::ParallelPlan ep8 = parallel::parse_plan("ep8");
  const ReplanPrediction p = predict_replan(c, ep8, ep8, load_profile("perf/profiles/h200-sxm-x8.json"));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.peer_bytes[r], 0) << "rank " << r;
    EXPECT_DOUBLE_EQ(p.local_bytes[r], held(c, ep8, r));
  }
}

}  // namespace
}  // namespace moeserve::perf
