// Live re-plan in the engine loop (EngineLoop::replan) on synthetic:tiny: requests in flight
// and requests arriving during the switch all finish with the greedy tokens runtime::generate
// gives them; a new engine that fails to build brings the old plan back; a loop without an
// engine factory refuses. The switch carries running requests over (it waits for none), its
// weights resharded from the resident ones or, refused in place, loaded from the source.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>

#include "parallel/plan_parse.h"
#include "serve/api_error.h"
#include "serve/engine_loop.h"
#include "tests/serve/single_rank_reference.h"
#include "tests/serve/streamed_tokens.h"

namespace moeserve::serve {
namespace {

constexpr int64_t kNewTokens = 12;

std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p;
    for (int k = 0; k < 5 + 3 * i; ++k) p.push_back((i * 37 + k * 11) % 250);
    out.push_back(p);
  }
  return out;
}

const std::vector<std::vector<int32_t>>& reference() {
  static const auto tokens = single_rank_reference(prompts(), kNewTokens, 128);
  return tokens;
}

struct Fixture {
  ModelSource model = open_model("synthetic:tiny");
  std::unique_ptr<tokenizer::Tokenizer> tokenizer = tokenizer::make_builtin_tokenizer(model.config.vocab_size);

  ReplanTarget target(const std::string& plan_name) {
    ReplanTarget t;
    const parallel::ParallelPlan plan = parallel::parse_plan(plan_name);
    t.plan_name = plan.name;
    t.scheduler.page_size = 8;
    t.scheduler.pages_per_replica = 128;
    t.scheduler.attn_dp = plan.attn_dp;
    t.scheduler.pp = plan.pp;
    t.scheduler.pipeline_groups = plan.pp;  // serve's default: one group per stage
    t.scheduler.chunked_prefill_size = 16;
    t.scheduler.max_running_requests = 4;
    runtime::EngineOptions eo;
    eo.plan = plan;
    eo.page_size = 8;
    eo.num_pages = 128;
    t.build_engine = [this, eo] { return std::make_unique<runtime::Engine>(model, eo); };
    t.reshard_engine = [this, eo](runtime::Engine& from) { return std::make_unique<runtime::Engine>(model, eo, from); };
    return t;
  }

  std::unique_ptr<EngineLoop> loop(const std::string& plan_name, bool can_replan = true) {
    ReplanTarget start = target(plan_name);
    EngineLoopOptions lo;
    lo.scheduler = start.scheduler;
    lo.plan_name = start.plan_name;
    if (can_replan) lo.rebuild_engine = start.build_engine;
    lo.warmup = false;
    return std::make_unique<EngineLoop>(start.build_engine(), *tokenizer, lo);
  }
};

std::vector<std::shared_ptr<RequestStream>> submit_all(EngineLoop& loop, size_t first, size_t count) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = first; i < first + count; ++i) {
    EngineRequest r;
    r.prompt = prompts()[i];
    r.limits.max_tokens = kNewTokens;
    streams.push_back(loop.submit(r));
  }
  return streams;
}

void expect_reference(const std::vector<std::shared_ptr<RequestStream>>& streams, size_t first) {
  for (size_t i = 0; i < streams.size(); ++i)
    EXPECT_EQ(streamed_tokens(*streams[i]), reference()[first + i]) << "request " << first + i;
}

TEST(Replan, RequestsInFlightAndArrivingDuringTheSwitchAllFinishExactly) {
  Fixture f;
  auto loop = f.loop("single");
  EXPECT_EQ(loop->plan_name(), "single");
  // max_running_requests 4: most of the first six wait in the scheduler when the switch asks.
  auto before = submit_all(*loop, 0, 6);
  auto switched = std::async(std::launch::async, [&] { return loop->replan(f.target("tp2")); });
  auto during = submit_all(*loop, 6, 3);
  const ReplanReport report = switched.get();
  EXPECT_EQ(report.previous_plan, "single");
  EXPECT_EQ(report.plan, "tp2");
  EXPECT_GE(report.ready_s, report.drain_s);
  EXPECT_EQ(loop->plan_name(), "tp2");
  EXPECT_EQ(loop->replans(), 1);
  expect_reference(before, 0);
  expect_reference(during, 6);

  auto again = submit_all(*loop, 9, 3);
  const ReplanReport second = loop->replan(f.target("ep2-dp"));
  EXPECT_EQ(second.previous_plan, "tp2");
  EXPECT_EQ(loop->plan_name(), "ep2-dp");
  EXPECT_EQ(loop->replans(), 2);
  expect_reference(again, 9);
  expect_reference(submit_all(*loop, 0, 12), 0);
  EXPECT_NE(loop->render_metrics().find("moeserve_plan_info{plan=\"ep2-dp\"} 1"), std::string::npos);
}

// Out of and into pipeline groups (a step of each group in flight): the switch waits for the
// steps in flight as for the requests, and every token stays exact.
TEST(Replan, IntoAndOutOfPipelineGroupsWithRequestsInFlight) {
  Fixture f;
  auto loop = f.loop("pp2");
  auto before = submit_all(*loop, 0, 6);
  auto switched = std::async(std::launch::async, [&] { return loop->replan(f.target("single")); });
  auto during = submit_all(*loop, 6, 3);
  EXPECT_EQ(switched.get().previous_plan, "pp2");
  expect_reference(before, 0);
  expect_reference(during, 6);
  auto again = submit_all(*loop, 0, 6);
  auto back = std::async(std::launch::async, [&] { return loop->replan(f.target("tp2pp2")); });
  auto later = submit_all(*loop, 6, 6);
  EXPECT_EQ(back.get().plan, "tp2pp2");
  expect_reference(again, 0);
  expect_reference(later, 6);
  EXPECT_EQ(loop->replans(), 2);
  EXPECT_EQ(loop->current_snapshot().kv_pages_used, 0);
}

TEST(Replan, ACancelDuringTheSwitchEndsTheRequestAndNothingLeaks) {
  Fixture f;
  auto loop = f.loop("single");
  auto before = submit_all(*loop, 0, 6);
  auto switched = std::async(std::launch::async, [&] { return loop->replan(f.target("pp2")); });
  auto during = submit_all(*loop, 6, 3);
  loop->cancel(during[1]->id());  // waiting out the switch in the queue, or already admitted
  switched.get();
  expect_reference(before, 0);
  expect_reference({during[0]}, 6);
  expect_reference({during[2]}, 8);
  bool ended = false;
  for (int i = 0; i < 100 && !ended; ++i) {
    std::vector<OutputEvent> events;
    during[1]->wait(events, std::chrono::milliseconds(100));
    for (const auto& e : events) ended = ended || e.last();
  }
  EXPECT_TRUE(ended) << "the cancelled request never ended";
  const EngineSnapshot s = loop->current_snapshot();
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_TRUE(loop->drain(std::chrono::milliseconds(5000))) << "a request was left in the system";
}

TEST(Replan, AFailedBuildBringsTheOldPlanBack) {
  Fixture f;
  auto loop = f.loop("pp2");
  auto before = submit_all(*loop, 0, 4);
  ReplanTarget broken = f.target("ep2");
  broken.build_engine = []() -> std::unique_ptr<runtime::Engine> { throw std::runtime_error("out of device memory"); };
  // Resharding fails too, so the source is tried (and fails) after it.
  broken.reshard_engine = [](runtime::Engine&) -> std::unique_ptr<runtime::Engine> {
    throw std::runtime_error("peer copy failed");
  };
  try {
    loop->replan(broken);
    FAIL() << "the re-plan should have failed";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("back on plan 'pp2'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(loop->plan_name(), "pp2");
  EXPECT_EQ(loop->replans(), 0);
  EXPECT_TRUE(loop->failure().empty());
  expect_reference(before, 0);
  expect_reference(submit_all(*loop, 4, 8), 4);
}

TEST(Replan, TheSwitchDoesNotWaitForARunningRequest) {
  Fixture f;
  auto loop = f.loop("single");
  EngineRequest long_request;
  long_request.prompt = prompts()[0];
  long_request.limits.max_tokens = 1000;  // (fits the 1024-token pool) ~0.5 s of decoding
  auto stream = loop->submit(long_request);
  std::vector<OutputEvent> first;  // running, not still queued
  while (first.empty()) stream->wait(first, std::chrono::milliseconds(1000));
  ASSERT_FALSE(first.back().last());
  const ReplanReport report = loop->replan(f.target("tp2"));
  EXPECT_EQ(report.requests_carried, 1);
  EXPECT_EQ(report.weights_from, "resident") << report.fallback_reason;
  std::vector<OutputEvent> after;
  stream->wait(after, std::chrono::milliseconds(0));
  for (const auto& e : after) EXPECT_FALSE(e.last()) << "the switch waited for the request to finish";
  EXPECT_EQ(loop->plan_name(), "tp2");
  loop->stop();
}

// A plan whose shards cannot be copied in place (in_place_refusal, found before the switch)
// is built from the model's source, and the report says why.
TEST(Replan, APlanThatDoesNotFitInPlaceIsLoadedFromTheSource) {
  Fixture f;
  auto loop = f.loop("single");
  auto before = submit_all(*loop, 0, 4);
  ReplanTarget t = f.target("ep2");
  t.in_place_refusal = "rank 0 would hold too much";
  const ReplanReport report = loop->replan(t);
  EXPECT_EQ(report.weights_from, "source");
  EXPECT_EQ(report.fallback_reason, "rank 0 would hold too much");
  expect_reference(before, 0);
}

TEST(Replan, RefusedWithoutAnEngineFactory) {
  Fixture f;
  auto loop = f.loop("single", /*can_replan=*/false);
  try {
    loop->replan(f.target("tp2"));
    FAIL() << "expected a refusal";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
  EXPECT_EQ(loop->plan_name(), "single");
  expect_reference(submit_all(*loop, 0, 2), 0);
}

}  // namespace
}  // namespace moeserve::serve
