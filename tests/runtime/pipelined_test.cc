// Engine::execute_pipelined (asynchronous pipelining across steps) on CPU ranks: every rank
// runs every group's step once per round, the groups' results are those of the synchronous
// step (the same KV entries are rewritten each round), and bad arguments fail with a message.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/step_builder.h"

namespace moeserve::runtime {
namespace {

constexpr int64_t kContext = 20;

EngineOptions options_for(const std::string& plan_name) {
  EngineOptions o;
  o.plan = parallel::parse_plan(plan_name);
  o.page_size = 8;
  o.num_pages = 64;
  o.pp_async_batch_depth = 1;
  return o;
}

// `groups` micro-batches of `per_group` sequences decoding position kContext.
StepPlan grouped_decode_step(const Engine& engine, int64_t groups, int64_t per_group) {
  const EngineOptions& o = engine.options();
  std::vector<PagePool> pools;
  for (int d = 0; d < o.plan.attn_dp; ++d) pools.emplace_back(o.num_pages);
  std::vector<SequenceState> seqs(static_cast<size_t>(groups * per_group));
  std::vector<size_t> live;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SequenceState& s = seqs[i];
    for (int64_t t = 0; t <= kContext; ++t) s.tokens.push_back(static_cast<int32_t>((i * 31 + t * 7) % 200 + 1));
    s.prompt_len = kContext + 1;
    s.cached = kContext;
    s.replica = static_cast<int>(i % o.plan.attn_dp);
    live.push_back(i);
  }
  StepOptions so;
  so.page_size = o.page_size;
  so.max_pages_per_seq = (kContext + 1 + o.page_size - 1) / o.page_size;
  so.attn_dp = o.plan.attn_dp;
  so.pp = o.plan.pp;
  so.max_micro_batch_size = per_group;
  return build_step(seqs, live, pools, so);
}

class Pipelined : public ::testing::TestWithParam<std::string> {};

TEST_P(Pipelined, EveryRankRunsEveryGroupEveryRoundAndResultsMatchTheSynchronousStep) {
  Engine engine(open_model("synthetic:tiny"), options_for(GetParam()));
  const int stages = engine.options().plan.pp;
  const StepPlan step = grouped_decode_step(engine, stages, 2);
  ASSERT_EQ(static_cast<int>(step.micro_batches.size()), stages);
  // Fill the cache rows the step reads (positions < kContext hold zeros otherwise: still a
  // deterministic input), then the reference logits of the synchronous step.
  const auto before = engine.execute(step);
  const auto passes_before = engine.forward_passes_per_rank();
  constexpr int kRounds = 3;
  engine.execute_pipelined(step, kRounds);
  const auto passes_after = engine.forward_passes_per_rank();
  for (size_t r = 0; r < passes_after.size(); ++r)
    EXPECT_EQ(passes_after[r] - passes_before[r], kRounds * stages) << "rank " << r;
  const auto after = engine.execute(step);
  ASSERT_EQ(after.size(), before.size());
  for (size_t m = 0; m < after.size(); ++m)
    for (size_t d = 0; d < after[m].size(); ++d) {
      ASSERT_EQ(after[m][d].numel(), before[m][d].numel());
      for (int64_t i = 0; i < after[m][d].numel(); ++i)
        ASSERT_EQ(after[m][d].f32()[i], before[m][d].f32()[i]) << "group " << m << ", element " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(PipelinePlans, Pipelined, ::testing::Values("pp2", "pp4", "tp2pp2"),
                         [](const auto& info) { return info.param; });

TEST(PipelinedArguments, RoundsMustBePositive) {
  Engine engine(open_model("synthetic:tiny"), options_for("pp2"));
  const StepPlan step = grouped_decode_step(engine, 2, 1);
  try {
    engine.execute_pipelined(step, 0);
    FAIL() << "rounds = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rounds must be positive"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::runtime
