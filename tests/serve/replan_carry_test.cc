// Re-plans that carry running requests over (EngineLoop::replan on synthetic:tiny, CPU ranks):
// the switch happens between two steps, the weights are resharded from the resident ones,
// every admitted request goes on from its tokens under the new plan. Under a reduction plan
// (tp4: single, tp2, tp4, pp2 and tp2pp2 give the same logits to the bit) a stream of
// requests, some longer than the interval between re-plans, loses none and gets the greedy
// tokens of an undisturbed server; a long request is carried, not restarted.
#include <gtest/gtest.h>

#include <future>
#include <regex>
#include <thread>

#include "parallel/plan_parse.h"
#include "serve/engine_loop.h"
#include "tests/serve/streamed_tokens.h"

namespace moeserve::serve {
namespace {

struct Fixture {
  ModelSource model = open_model("synthetic:tiny");
  std::unique_ptr<tokenizer::Tokenizer> tokenizer = tokenizer::make_builtin_tokenizer(model.config.vocab_size);
  int64_t pages = 128;

  ReplanTarget target(const std::string& plan_name) {
    ReplanTarget t;
    const parallel::ParallelPlan plan = parallel::parse_plan(plan_name);
    t.plan_name = plan.name;
    t.scheduler.page_size = 8;
    t.scheduler.pages_per_replica = pages;
    t.scheduler.attn_dp = plan.attn_dp;
    t.scheduler.pp = plan.pp;
    t.scheduler.pipeline_groups = plan.pp;
    t.scheduler.chunked_prefill_size = 16;
    t.scheduler.max_running_requests = 4;
    runtime::EngineOptions eo;
    eo.plan = plan;
    eo.page_size = 8;
    eo.num_pages = pages;
    eo.run.reduction_plan = parallel::parse_plan("tp4");
    t.build_engine = [this, eo] { return std::make_unique<runtime::Engine>(model, eo); };
    t.reshard_engine = [this, eo](runtime::Engine& from) {
      return std::make_unique<runtime::Engine>(model, eo, from, /*take_caches=*/true);
    };
    return t;
  }

  std::unique_ptr<EngineLoop> loop(const std::string& plan_name) {
    ReplanTarget start = target(plan_name);
    EngineLoopOptions lo;
    lo.scheduler = start.scheduler;
    lo.plan_name = start.plan_name;
    lo.rebuild_engine = start.build_engine;
    lo.warmup = false;
    return std::make_unique<EngineLoop>(start.build_engine(), *tokenizer, lo);
  }
};

EngineRequest request(int i, int64_t max_tokens) {
  EngineRequest r;
  for (int k = 0; k < 5 + 3 * (i % 7); ++k) r.prompt.push_back((i * 37 + k * 11) % 250);
  r.limits.max_tokens = max_tokens;
  return r;
}

// Every 4th request is long: it runs through several re-plans.
int64_t length_of(int i) { return i % 4 == 0 ? 160 : 12; }

double metric(const std::string& text, const std::string& name) {
  const std::regex re("\n" + name + " ([0-9.e+-]+)");
  std::smatch m;
  return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
}

TEST(ReplanCarry, StreamingRequestsThroughReplansLoseNoneAndMatchAnUndisturbedServer) {
  constexpr int kRequests = 16;
  Fixture f;
  std::vector<std::vector<int32_t>> undisturbed;
  {
    auto loop = f.loop("single");
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < kRequests; ++i) streams.push_back(loop->submit(request(i, length_of(i))));
    for (auto& s : streams) undisturbed.push_back(streamed_tokens(*s));
  }
  auto loop = f.loop("single");
  std::vector<std::shared_ptr<RequestStream>> streams;
  const std::vector<std::string> plans = {"tp2", "tp4", "pp2", "tp2pp2", "single"};
  int64_t carried = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    for (int i = 0; i < kRequests / static_cast<int>(plans.size()) + 1 && streams.size() < kRequests; ++i)
      streams.push_back(
          loop->submit(request(static_cast<int>(streams.size()), length_of(static_cast<int>(streams.size())))));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the switch interval: some requests are mid-stream
    const ReplanReport report = loop->replan(f.target(plans[p]));
    EXPECT_EQ(report.weights_from, "resident") << report.fallback_reason;
    // Under one reduction plan every plan holds the same parts: views of the old shards, only
    // the vocabulary's split (embedding, LM head) is copied.
    EXPECT_GT(report.viewed_bytes, 10 * (report.moved_local_bytes + report.moved_peer_bytes));
    EXPECT_GT(report.reused_cache_bytes, 0) << "the old engine's KV caches were not taken over";
    EXPECT_NEAR(report.ready_s, report.pause_s + report.move_s + report.graphs_s + report.resume_s, 1e-3);
    carried += report.requests_carried;
  }
  ASSERT_EQ(streams.size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(streamed_tokens(*streams[i]), undisturbed[i]) << "request " << i;
  EXPECT_GT(carried, 0) << "no re-plan found a request running: the test did not test carrying";
  const std::string metrics = loop->render_metrics();
  EXPECT_EQ(metric(metrics, "moeserve_replans_from_resident_weights_total"), static_cast<double>(plans.size()));
  EXPECT_EQ(metric(metrics, "moeserve_replan_carried_requests_total"), static_cast<double>(carried));
  EXPECT_NE(metrics.find("moeserve_last_replan_phase_seconds{phase=\"move\"}"), std::string::npos);
  EXPECT_EQ(loop->current_snapshot().kv_pages_used, 0);
}

// Under AddressSanitizer (the sanitizer job: -O1, every load checked) tiny's CPU kernels run
// two orders of magnitude slower, and 4000 tokens took 14 minutes of the job's 19.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOESERVE_UNDER_ASAN 1
#endif
#endif
#ifdef MOESERVE_UNDER_ASAN
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif

// 4000 output tokens (issue 26's long request; the model's 4096 positions hold them with the
// prompt; ~2 s of tiny's decoding on one core, twice: undisturbed and through a re-plan). The
// sanitizer job checks the same carry path's memory safety with 400: the re-plan still comes
// after 200 streamed tokens, mid-decode.
TEST(ReplanCarry, ALongRequestGoesOnThroughAReplanWithoutRestarting) {
  constexpr int64_t kTokens = kUnderAsan ? 400 : 4000;
  Fixture f;
  f.pages = 512;  // 4096 tokens of 8-token pages
  std::vector<int32_t> undisturbed;
  {
    auto loop = f.loop("single");
    undisturbed = streamed_tokens(*loop->submit(request(1, kTokens)));
  }
  ASSERT_EQ(undisturbed.size(), static_cast<size_t>(kTokens));
  auto loop = f.loop("single");
  auto stream = loop->submit(request(1, kTokens));
  std::vector<OutputEvent> before;
  size_t streamed = 0;
  while (streamed < 200) {  // well into its decoding
    stream->wait(before, std::chrono::milliseconds(1000));
    streamed = 0;
    for (const auto& e : before) streamed += e.token_ids.size();
  }
  const ReplanReport report = loop->replan(f.target("tp2"));
  // It did not wait for the request: it was carried while running, its KV recomputed once from
  // its prompt and the tokens it had (not from the prompt alone: nothing was generated twice).
  EXPECT_EQ(report.requests_carried, 1);
  const int64_t prompt = static_cast<int64_t>(request(1, kTokens).prompt.size());
  EXPECT_GT(report.tokens_recomputed, prompt + static_cast<int64_t>(streamed) - 1);
  EXPECT_LT(report.tokens_recomputed, prompt + kTokens);
  std::vector<int32_t> tokens;
  for (const auto& e : before) tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
  for (int32_t t : streamed_tokens(*stream)) tokens.push_back(t);
  EXPECT_EQ(tokens, undisturbed);
  const std::string metrics = loop->render_metrics();
  // One first token for the one request: its time to first token was not repeated.
  EXPECT_EQ(metric(metrics, "moeserve_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(metric(metrics, "moeserve_replan_recomputed_tokens_total"), static_cast<double>(report.tokens_recomputed));
}

}  // namespace
}  // namespace moeserve::serve
