// Reduction plans over every preset at 1-8 ranks on synthetic:tiny: check_reduction_plan
// accepts a plan exactly when each of its ranks holds a contiguous run of the reduction
// plan's parts (worked out here from the ranks' shards, independently of the check's
// formula), and every accepted plan gives the single rank's prompt logits under the same
// reduction plan to the bit, and its greedy tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <utility>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace moeserve::runtime {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33}, {200, 4}, {8, 9, 10}};

// The reduction plans among the presets: more than one rank, one stage, no attention DP.
std::vector<parallel::ParallelPlan> reduction_plans() {
  std::vector<parallel::ParallelPlan> out;
  for (const std::string& name : parallel::preset_names(8)) {
    const parallel::ParallelPlan p = parallel::parse_plan(name);
    if (p.world() > 1 && p.pp == 1 && p.attn_dp == 1) out.push_back(p);
  }
  return out;
}

// Whether every rank of `plan` holds a contiguous run of `reduction`'s parts: its heads as a
// run of the C head parts, and its routed (expert group, column part) pairs as a run of the
// parts in group-major order, the same run.
bool nests(const ModelConfig& config, const parallel::ParallelPlan& plan, const parallel::ParallelPlan& reduction) {
  const int parts = reduction.world();
  if (plan.attn_dp != 1 || parts % plan.attn_tp != 0) return false;
  const parallel::ShardDims dims = shard_dims(config);
  for (int rank = 0; rank < plan.ranks_per_stage(); ++rank) {
    const parallel::RankShard shard = parallel::shard_of(plan, dims, rank);
    std::set<int> routed;  // canonical indices of the parts whose experts and columns the rank holds whole
    for (int g = 0; g < reduction.moe_ep; ++g)
      for (int j = 0; j < reduction.moe_tp; ++j) {
        const parallel::Range experts = parallel::split_range(dims.experts, reduction.moe_ep, g);
        const parallel::Range cols = parallel::split_range(dims.expert_intermediate, reduction.moe_tp, j);
        const bool inside = experts.begin >= shard.experts.begin && experts.end <= shard.experts.end &&
                            cols.begin >= shard.expert_intermediate.begin && cols.end <= shard.expert_intermediate.end;
        if (inside) routed.insert(g * reduction.moe_tp + j);
      }
    const int per_rank = parts / plan.attn_tp;
    std::set<int> run;
    for (int p = rank * per_rank; p < (rank + 1) * per_rank; ++p) run.insert(p);
    if (routed != run) return false;
  }
  return true;
}

EngineOptions options_for(const parallel::ParallelPlan& plan, const parallel::ParallelPlan& reduction) {
  EngineOptions o;
  o.plan = plan;
  o.run.reduction_plan = reduction;
  o.page_size = 8;
  o.num_pages = 24;
  return o;
}

std::vector<GenerateResult> generate(const ModelSource& model, const EngineOptions& options) {
  std::vector<GenerateRequest> requests;
  for (const auto& p : kPrompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_new_tokens = 8;
    requests.push_back(r);
  }
  Engine engine(model, options);
  return runtime::generate(engine, requests, {.prompt_logits = true});
}

TEST(ReductionPlans, EveryNestingPresetGivesTheSingleRanksBits) {
  const ModelSource model = open_model("synthetic:tiny");
  const parallel::ParallelPlan single = parallel::parse_plan("single");
  int accepted = 0, refused = 0;
  for (const parallel::ParallelPlan& reduction : reduction_plans()) {
    const auto reference = generate(model, options_for(single, reduction));
    for (const std::string& name : parallel::preset_names(8)) {
      const parallel::ParallelPlan plan = parallel::parse_plan(name);
      bool ok = true;
      try {
        check_reduction_plan(model.config, plan, ModelRunOptions{reduction});
      } catch (const Error& e) {
        ok = false;
        EXPECT_NE(std::string(e.what()).find("--reduction-plan " + reduction.name), std::string::npos) << e.what();
      }
      ASSERT_EQ(ok, nests(model.config, plan, reduction)) << name << " under " << reduction.name;
      if (!ok) {
        ++refused;
        continue;
      }
      ++accepted;
      const auto results = generate(model, options_for(plan, reduction));
      ASSERT_EQ(results.size(), reference.size());
      for (size_t i = 0; i < results.size(); ++i) {
        EXPECT_EQ(results[i].tokens, reference[i].tokens) << name << " under " << reduction.name << ", prompt " << i;
        const Tensor& got = results[i].prompt_logits;
        const Tensor& want = reference[i].prompt_logits;
        ASSERT_EQ(got.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0)
            << name << " under " << reduction.name << ": prompt " << i << "'s logits differ";
      }
    }
  }
  // tp plans nest in tp reduction plans, ep plans in ep ones, pipelines in both; attention DP
  // in none: both outcomes occur many times over.
  EXPECT_GT(accepted, 40);
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace moeserve::runtime
