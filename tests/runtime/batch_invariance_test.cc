// Under every preset at 1-8 ranks on synthetic:tiny: a batch of requests with different
// prompt lengths gives each request the same greedy tokens as running it alone, and the same
// tokens as the single-rank engine. Pipeline plans run with one sequence per micro-batch so
// that several micro-batches are in flight.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace moeserve::runtime {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91}, {200, 4}, {11, 12, 13, 14, 15, 16, 17}, {300}, {8, 9, 10}};
constexpr int64_t kNewTokens = 12;

GenerateRequest request(const std::vector<int32_t>& prompt) {
  GenerateRequest r;
  r.prompt = prompt;
  r.max_new_tokens = kNewTokens;
  return r;
}

std::vector<GenerateRequest> all_requests() {
  std::vector<GenerateRequest> out;
  for (const auto& p : kPrompts) out.push_back(request(p));
  return out;
}

EngineOptions options_for(const std::string& plan_name) {
  EngineOptions o;
  o.plan = parallel::parse_plan(plan_name);
  o.page_size = 8;  // prompts + new tokens cross pages
  o.num_pages = 32;
  if (o.plan.pp > 1) {
    o.pp_max_micro_batch_size = 1;
    o.pp_async_batch_depth = 1;
  }
  return o;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<GenerateResult>& results) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : results) out.push_back(r.tokens);
  return out;
}

const std::vector<std::vector<int32_t>>& reference_tokens() {
  static const auto tokens = [] {
    Engine engine(open_model("synthetic:tiny"), options_for("single"));
    return tokens_of(runtime::generate(engine, all_requests()));
  }();
  return tokens;
}

class EveryPlan : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryPlan, BatchEqualsAloneAndSingleRank) {
  Engine engine(open_model("synthetic:tiny"), options_for(GetParam()));
  const auto batch = tokens_of(runtime::generate(engine, all_requests()));
  EXPECT_EQ(batch, reference_tokens());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const auto alone = tokens_of(runtime::generate(engine, {request(kPrompts[i])}));
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0], batch[i]) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EveryPlan, ::testing::ValuesIn(parallel::preset_names(8)), [](const auto& info) {
  std::string n = info.param;
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

TEST(Pipeline, MicroBatchSettingsDoNotChangeTokens) {
  for (int64_t size : {0, 1, 2, 5})
    for (int64_t depth : {0, 3}) {
      EngineOptions o = options_for("tp2pp4");
      o.pp_max_micro_batch_size = size;
      o.pp_async_batch_depth = depth;
      Engine engine(open_model("synthetic:tiny"), o);
      EXPECT_EQ(tokens_of(runtime::generate(engine, all_requests())), reference_tokens())
          << "micro-batch size " << size << " depth " << depth;
    }
}

TEST(Plans, HybridAttentionTpAndDp) {
  // Beyond the presets: attention TP 2 inside each of 2 DP replicas (tokens split across the
  // TP ranks for dispatch, re-assembled by all-reduce), and DP attention over MoE TP.
  for (parallel::PlanFlags flags : {parallel::PlanFlags{4, 2, 0, 2, true}, parallel::PlanFlags{4, 0, 0, 0, true},
                                    parallel::PlanFlags{8, 2, 0, 4, true}}) {
    EngineOptions o = options_for("single");
    o.plan = parallel::plan_from_flags(flags);
    Engine engine(open_model("synthetic:tiny"), o);
    EXPECT_EQ(tokens_of(runtime::generate(engine, all_requests())), reference_tokens()) << o.plan.name;
  }
}

TEST(Plans, PromptLogitsMatchSingleRank) {
  Engine single(open_model("synthetic:tiny"), options_for("single"));
  const auto ref = runtime::generate(single, all_requests(), {.prompt_logits = true});
  for (const char* name : {"tp8", "ep8-dp", "ep4tp2", "tp2pp4", "ep2pp2-dp"}) {
    Engine engine(open_model("synthetic:tiny"), options_for(name));
    const auto got = runtime::generate(engine, all_requests(), {.prompt_logits = true});
    for (size_t i = 0; i < ref.size(); ++i) {
      const Tensor& a = ref[i].prompt_logits;
      const Tensor& b = got[i].prompt_logits;
      ASSERT_EQ(a.shape(), b.shape()) << name;
      float max_diff = 0, max_abs = 0;
      for (int64_t j = 0; j < a.numel(); ++j) {
        max_diff = std::max(max_diff, std::abs(a.f32()[j] - b.f32()[j]));
        max_abs = std::max(max_abs, std::abs(a.f32()[j]));
      }
      // fp32: partial sums in a different order differ by a few ulps per layer.
      EXPECT_LE(max_diff / max_abs, 1e-5f) << name << " request " << i;
    }
  }
}

TEST(Plans, InvalidPlanIsRejectedBeforeLoading) {
  EngineOptions o = options_for("single");
  o.plan = parallel::parse_plan("tp16");
  try {
    Engine engine(open_model("synthetic:tiny"), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "plan 'tp16': model attention heads = 8 is not divisible by attention TP size = 16");
  }
}

}  // namespace
}  // namespace moeserve::runtime
