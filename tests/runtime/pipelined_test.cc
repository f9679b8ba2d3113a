// Asynchronous steps on CPU ranks. run_pipelined (runtime/step_benchmark.h): every rank runs every group's
// step once per round, the groups' results are those of the synchronous step (the same KV
// entries are rewritten each round). Engine::submit / wait: each group's outputs, in every
// draw kind, equal the synchronous step's, whatever the order of the waits; misuse fails with
// a message and leaves the engine usable.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/step_benchmark.h"

namespace moeserve::runtime {
namespace {

// `step` with every batch drawing `draw`.
StepPlan drawing(StepPlan step, DrawKind draw) {
  step::set_draw(step, draw);
  return step;
}

// A synchronous step: submit, then wait.
StepOutputs run_step(Engine& engine, const StepPlan& step, DrawKind draw = DrawKind::kLogits) {
  return engine.wait(engine.submit(drawing(step, draw)));
}

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
  return synthetic_decode_step(
      {.batch = groups * per_group,
       .context = kContext,
       .page_size = o.page_size,
       .num_pages = o.num_pages,
       .attn_dp = o.plan.attn_dp,
       .micro_batching = {.pp = o.plan.pp, .max_micro_batch_size = per_group},
       .token_of = [](int64_t i, int64_t pos) { return static_cast<int32_t>((i * 31 + pos * 7) % 200 + 1); }});
}

class Pipelined : public ::testing::TestWithParam<std::string> {};

TEST_P(Pipelined, EveryRankRunsEveryGroupEveryRoundAndResultsMatchTheSynchronousStep) {
  Engine engine(open_model("synthetic:tiny"), options_for(GetParam()));
  const int stages = engine.options().plan.pp;
  const StepPlan step = grouped_decode_step(engine, stages, 2);
  ASSERT_EQ(static_cast<int>(step.micro_batches.size()), stages);
  // Fill the cache rows the step reads (positions < kContext hold zeros otherwise: still a
  // deterministic input), then the reference logits of the synchronous step.
  const auto before = run_step(engine, step).rows;
  const auto passes_before = engine.stats().forward_passes;
  constexpr int kRounds = 3;
  run_pipelined(engine, step, kRounds);
  const auto passes_after = engine.stats().forward_passes;
  for (size_t r = 0; r < passes_after.size(); ++r)
    EXPECT_EQ(passes_after[r] - passes_before[r], kRounds * stages) << "rank " << r;
  const auto after = run_step(engine, step).rows;
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

// One micro-batch of `step` as a step of its own.
StepPlan group_of(const StepPlan& step, size_t m) {
  StepPlan group;
  group.micro_batches.push_back(step.micro_batches[m]);
  return group;
}

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what;
}

TEST_P(Pipelined, SubmittedStepsGiveTheSynchronousOutputsInEveryDrawKind) {
  Engine engine(open_model("synthetic:tiny"), options_for(GetParam()));
  const int stages = engine.options().plan.pp;
  StepPlan step = grouped_decode_step(engine, stages, 2);
  for (auto& micro_batch : step.micro_batches)  // a candidates draw samples each row at its temperature
    for (auto& replica : micro_batch.replicas) replica.batch.temperatures.assign(replica.batch.logit_rows.size(), 0.7f);
  run_step(engine, step);  // the cache rows the groups read
  for (DrawKind draw : {DrawKind::kLogits, DrawKind::kGreedy, DrawKind::kCandidates}) {
    SCOPED_TRACE(testing::Message() << "draw " << static_cast<int>(draw));
    std::vector<StepOutputs> expected;
    for (int m = 0; m < stages; ++m) {
      const StepPlan group = group_of(step, static_cast<size_t>(m));
      expected.push_back(run_step(engine, group, draw));
    }
    // Every group twice in flight; waited newest first in the first round, oldest first after.
    std::vector<StepTicket> tickets;
    for (int m = 0; m < stages; ++m)
      tickets.push_back(engine.submit(drawing(group_of(step, static_cast<size_t>(m)), draw)));
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < stages; ++i) {
        const int m = round == 0 ? stages - 1 - i : i;
        const StepOutputs got = engine.wait(tickets[static_cast<size_t>(m)]);
        if (round == 0)
          tickets[static_cast<size_t>(m)] = engine.submit(drawing(group_of(step, static_cast<size_t>(m)), draw));
        const std::string what = "group " + std::to_string(m) + ", round " + std::to_string(round);
        if (draw == DrawKind::kCandidates) {
          ASSERT_EQ(got.candidates.size(), 1u) << what;
          const sample::SampleCandidates& a = got.candidates[0][0];
          const sample::SampleCandidates& b = expected[static_cast<size_t>(m)].candidates[0][0];
          EXPECT_EQ(a.ids, b.ids) << what;
          EXPECT_EQ(a.values, b.values) << what;
          EXPECT_EQ(a.normaliser, b.normaliser) << what;
        } else {
          ASSERT_EQ(got.rows.size(), 1u) << what;
          expect_same_tensor(got.rows[0][0], expected[static_cast<size_t>(m)].rows[0][0], what);
        }
      }
  }
}

TEST(PipelinedArguments, WaitsMustMatchSubmittedStepsAndRankCallsNeedThemWaitedFor) {
  Engine engine(open_model("synthetic:tiny"), options_for("pp2"));
  const StepPlan step = grouped_decode_step(engine, 2, 1);
  const StepTicket ticket = engine.submit(drawing(group_of(step, 0), DrawKind::kGreedy));
  try {
    engine.sample_logits_rows(0, {}, {});
    FAIL() << "a synchronous call ran while a submitted step was not waited for";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 submitted steps were not waited for"), std::string::npos) << e.what();
  }
  engine.wait(ticket);
  try {
    engine.wait(ticket);
    FAIL() << "a step was waited for twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was not submitted or was already waited for"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(run_step(engine, step));  // the engine is still usable
}

// A rank that fails inside a submitted step (here the last stage: a candidates draw without the
// rows' temperatures) fails its wait with the rank's error, and the engine refuses later steps.
TEST(PipelinedArguments, ARankFailingInASubmittedStepFailsItsWaitAndStopsTheEngine) {
  Engine engine(open_model("synthetic:tiny"), options_for("pp2"));
  const StepPlan step = grouped_decode_step(engine, 2, 1);
  const StepTicket good = engine.submit(drawing(group_of(step, 0), DrawKind::kGreedy));
  const StepTicket bad = engine.submit(drawing(group_of(step, 1), DrawKind::kCandidates));
  EXPECT_NO_THROW(engine.wait(good));
  try {
    engine.wait(bad);
    FAIL() << "the failed step's wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperatures"), std::string::npos) << e.what();
  }
  try {
    engine.submit(step);
    FAIL() << "a step was accepted after a failed one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped after a failed step"), std::string::npos) << e.what();
  }
}

TEST(PipelinedArguments, RoundsMustBePositive) {
  Engine engine(open_model("synthetic:tiny"), options_for("pp2"));
  const StepPlan step = grouped_decode_step(engine, 2, 1);
  try {
    run_pipelined(engine, step, 0);
    FAIL() << "rounds = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rounds must be positive"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::runtime
