// The serving loop on synthetic:tiny under several plans: whatever the scheduler does
// (continuous batching, chunked prefill, padding, preemption, prefix reuse, DP replicas,
// PP micro-batches, pipeline groups with steps in flight), every request's greedy tokens equal
// runtime::generate's for it, and every KV page comes back, also when requests are cancelled
// while their step is in flight.
#include "serve/engine_loop.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "parallel/plan_parse.h"
#include "serve/api_error.h"
#include "tests/serve/single_rank_reference.h"
#include "tests/serve/streamed_tokens.h"

namespace moeserve::serve {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 14, 15, 16, 17, 18, 19, 20},
    {200, 4},
    {5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 14, 15, 16, 17, 300, 301},  // shares 17 tokens with [0]
    {300},
    {8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18},
    {5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 14, 15, 16, 17, 18, 19, 20},  // same as [0]
};
constexpr int64_t kNewTokens = 10;

const std::vector<std::vector<int32_t>>& reference() {
  static const auto tokens = single_rank_reference(kPrompts, kNewTokens, 64);
  return tokens;
}

struct Case {
  std::string plan;
  int64_t page_size;
  int64_t pages;  // per replica
  int64_t chunk;
  bool prefix_cache;
  int64_t max_running;
  int groups = 1;  // pipeline groups with a step in flight at once
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.plan << ", page " << c.page_size << ", " << c.pages << " pages, chunk " << c.chunk
      << (c.prefix_cache ? ", radix" : ", no radix") << ", max running " << c.max_running << ", " << c.groups
      << " groups";
}

std::string name_of(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = c.plan + "_p" + std::to_string(c.pages) + "_c" + std::to_string(c.chunk) +
                     (c.prefix_cache ? "_radix" : "_noradix") + "_r" + std::to_string(c.max_running) +
                     (c.groups > 1 ? "_g" + std::to_string(c.groups) : "");
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

// An engine of synthetic:tiny under `plan` and a serving loop on it whose scheduler has the
// engine's pages, replicas and stages; `configure` sets the rest of the loop's options.
struct TinyServer {
  TinyServer(const std::string& plan, int64_t page_size, int64_t pages,
             const std::function<void(EngineLoopOptions&)>& configure, const std::string& reduction_plan = "single")
      : engine(model, engine_options(plan, page_size, pages, reduction_plan)),
        tokenizer(tokenizer::make_builtin_tokenizer(model.config.vocab_size)),
        loop(engine, *tokenizer, loop_options(engine.options(), configure)) {}

  static runtime::EngineOptions engine_options(const std::string& plan, int64_t page_size, int64_t pages,
                                               const std::string& reduction_plan) {
    runtime::EngineOptions eo;
    eo.plan = parallel::parse_plan(plan);
    eo.run.reduction_plan = parallel::parse_plan(reduction_plan);
    eo.page_size = page_size;
    eo.num_pages = pages;
    return eo;
  }
  static EngineLoopOptions loop_options(const runtime::EngineOptions& eo,
                                        const std::function<void(EngineLoopOptions&)>& configure) {
    EngineLoopOptions lo;
    lo.scheduler.page_size = eo.page_size;
    lo.scheduler.pages_per_replica = eo.num_pages;
    lo.scheduler.attn_dp = eo.plan.attn_dp;
    lo.scheduler.pp = eo.plan.pp;
    configure(lo);
    return lo;
  }

  const ModelSource model = open_model("synthetic:tiny");
  runtime::Engine engine;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  EngineLoop loop;
};

// Submits every prompt of kPrompts for kNewTokens tokens, `sample(i, request)` choosing
// request i's sampling, and returns the tokens each one streamed.
std::vector<std::vector<int32_t>> sampled_tokens(EngineLoop& loop,
                                                 const std::function<void(size_t, EngineRequest&)>& sample) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EngineRequest r;
    r.prompt = kPrompts[i];
    r.limits.max_tokens = kNewTokens;
    sample(i, r);
    streams.push_back(loop.submit(r));
  }
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& stream : streams) tokens.push_back(streamed_tokens(*stream));
  return tokens;
}

// A counter of /metrics (-1 when absent).
double metric(const EngineLoop& loop, const std::string& counter) {
  const std::string text = loop.render_metrics();
  const std::string name = counter + " ";
  const size_t at = text.find("\n" + name);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + 1 + name.size()));
}
// Rows drawn past their device candidates.
double sampling_fallbacks(const EngineLoop& loop) { return metric(loop, "moeserve_sampling_fallbacks_total"); }
// Rows of pipeline steps drawn whole on the device after their micro-batch.
double device_drawn_rows(const EngineLoop& loop) { return metric(loop, "moeserve_device_drawn_rows_total"); }

class ServeLoop : public ::testing::TestWithParam<Case> {};

TEST_P(ServeLoop, GreedyTokensEqualGenerateAndPagesComeBack) {
  const Case& c = GetParam();
  TinyServer server(c.plan, c.page_size, c.pages, [&](EngineLoopOptions& lo) {
    lo.scheduler.chunked_prefill_size = c.chunk;
    lo.scheduler.prefix_cache = c.prefix_cache;
    lo.scheduler.max_running_requests = c.max_running;
    lo.scheduler.pipeline_groups = c.groups;
  });
  EngineLoop& loop = server.loop;

  // Two waves, so that the second finds the first's prefixes cached.
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : kPrompts) {
      EngineRequest r;
      r.prompt = p;
      r.limits.max_tokens = kNewTokens;
      streams.push_back(loop.submit(r));
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      std::vector<int32_t> tokens;
      bool done = false;
      while (!done) {
        std::vector<OutputEvent> events;
        streams[i]->wait(events, std::chrono::milliseconds(1000));
        for (const auto& e : events) {
          ASSERT_EQ(e.error_status, 0) << e.error;
          tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
          if (e.last()) {
            done = true;
            EXPECT_EQ(e.finish_reason, "length");
            EXPECT_EQ(e.completion_tokens, kNewTokens);
            EXPECT_EQ(e.prompt_tokens, static_cast<int64_t>(kPrompts[i].size()));
          }
        }
      }
      EXPECT_EQ(tokens, reference()[i]) << "wave " << wave << " request " << i;
    }
  }
  const EngineSnapshot s = loop.current_snapshot();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
  if (c.pages <= 12) {
    EXPECT_GT(s.preemptions, 0) << "the small pool should force preemption";
  }
  if (c.prefix_cache) {
    EXPECT_GT(s.prefix_hit_tokens, 0);
  } else {
    EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
  }
  loop.flush_prefix_cache();
  const EngineSnapshot flushed = loop.current_snapshot();
  EXPECT_EQ(flushed.kv_pages_free, flushed.kv_pages_total);
}

INSTANTIATE_TEST_SUITE_P(Plans, ServeLoop,
                         ::testing::Values(Case{"single", 8, 64, 512, true, 64},   // one batch, prefix reuse
                                           Case{"single", 4, 64, 3, true, 64},     // chunked prefill
                                           Case{"single", 4, 12, 512, false, 64},  // few pages: preemption, recompute
                                           Case{"single", 4, 12, 5, true, 2},      // everything at once
                                           Case{"tp2", 8, 64, 7, true, 64}, Case{"ep2", 8, 64, 7, true, 64},
                                           Case{"pp2", 8, 64, 7, true, 64},
                                           Case{"ep2-dp", 4, 16, 6, true, 64},  // DP replicas with their own pools
                                           Case{"tp2pp2", 4, 64, 5, false, 3},
                                           // Pipeline groups: steps of different groups in flight at once.
                                           Case{"pp2", 8, 64, 7, true, 64, 2},
                                           Case{"pp2", 4, 12, 5, true, 64, 2},  // preemption beside a step in flight
                                           Case{"pp4", 4, 64, 3, true, 64, 4}, Case{"tp2pp2", 4, 64, 5, false, 3, 2},
                                           Case{"single", 4, 16, 5, true, 64, 2}),  // groups need no stages to be exact
                         name_of);

// Requests cancelled at random points, some while their group's step is in flight: the others'
// tokens stay exact and every page comes back.
TEST(ServeLoopPipelineGroups, CancelsWhileStepsAreInFlightLoseNothing) {
  TinyServer server("pp2", 4, 64, [](EngineLoopOptions& lo) {
    lo.scheduler.pipeline_groups = 2;
    lo.scheduler.chunked_prefill_size = 5;
    lo.scheduler.prefix_cache = false;
  });
  EngineLoop& loop = server.loop;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : kPrompts) {
      EngineRequest r;
      r.prompt = p;
      r.limits.max_tokens = kNewTokens;
      streams.push_back(loop.submit(r));
    }
    // Odd requests are cancelled once they have `round` tokens (round 0: at once).
    for (size_t i = 1; i < streams.size(); i += 2) {
      for (int64_t seen = 0; seen < round;) {
        std::vector<OutputEvent> events;
        streams[i]->wait(events, std::chrono::milliseconds(1000));
        for (const auto& e : events) seen += static_cast<int64_t>(e.token_ids.size());
      }
      loop.cancel(streams[i]->id());
    }
    for (size_t i = 0; i < streams.size(); i += 2)
      EXPECT_EQ(streamed_tokens(*streams[i]), reference()[i]) << "round " << round << " request " << i;
    EngineSnapshot s = loop.current_snapshot();  // the cancels may still be on their way
    for (int tries = 0; tries < 1000 && s.running + s.waiting > 0; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      s = loop.current_snapshot();
    }
    EXPECT_EQ(s.kv_pages_used, 0) << "round " << round;
    EXPECT_EQ(s.kv_pages_free, s.kv_pages_total) << "round " << round;
    EXPECT_EQ(s.running + s.waiting, 0) << "round " << round;
  }
}

// Seeded sampled requests (each draw a pure function of its seed and step) and logprobs
// draw the same tokens with pipeline groups in flight as one step at a time on one rank: the
// groups' steps take the full-logits head, the same draws as the candidates' path.
// Steps in flight draw their sampled rows on the devices right after their micro-batch
// (DrawKind::kSampled; a row asking for logprobs draws from host logits): the tokens of one
// step at a time on one rank.
TEST(ServeLoopPipelineGroups, SampledRequestsDrawTheTokensOfOneStepAtATime) {
  auto run = [&](const std::string& plan, int groups) {
    TinyServer server(plan, 8, 64, [&](EngineLoopOptions& lo) {
      lo.scheduler.pipeline_groups = groups;
      lo.scheduler.chunked_prefill_size = 7;
    });
    auto tokens = sampled_tokens(server.loop, [](size_t i, EngineRequest& r) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = i % 2 == 0 ? 0.8f : 1.0f;
      r.sampling.top_k = i % 3 == 0 ? 20 : 0;
      r.sampling.seed = 100 + i;
      if (i == 4) r.top_logprobs = 2;
    });
    if (groups > 1) {
      EXPECT_GT(device_drawn_rows(server.loop), 0.0) << plan;
    }
    return tokens;
  };
  const auto one_rank = run("single", 1);
  EXPECT_EQ(run("pp2", 2), one_rank);
  EXPECT_EQ(run("tp2pp2", 2), one_rank);
}

// Draws that reach past a row's device candidates (pure temperature over synthetic:tiny's
// flat 512-entry rows; the candidates hold 256) run over the rows' whole logits where they
// are (Engine::sample_logits_rows): with the vocabulary split (tp2: the rows are gathered
// first) and over DP replicas, the same tokens as one rank, and the fallback counter moves.
TEST(ServeLoopSampling, DrawsPastTheCandidatesAreTheSameUnderEveryPlan) {
  auto run = [&](const std::string& plan) {
    TinyServer server(plan, 8, 64, [](EngineLoopOptions&) {});
    auto tokens = sampled_tokens(server.loop, [](size_t i, EngineRequest& r) {
      r.sampling.temperature = 1.0f + 0.1f * static_cast<float>(i);
      r.sampling.top_p = i % 2 == 0 ? 0.95f : 1.0f;
      r.sampling.min_p = i == 3 ? 0.02f : 0.0f;
      r.sampling.seed = 300 + i;
    });
    EXPECT_GT(sampling_fallbacks(server.loop), 0.0) << plan;
    return tokens;
  };
  const auto one_rank = run("single");
  for (const std::string plan : {"tp2", "tp4", "ep2", "ep2-dp"}) EXPECT_EQ(run(plan), one_rank) << plan;
}

// Reduction plans tp4 and ep4: one rank computes 4 parts of every split, tp2 / ep2 ranks 2,
// tp4 / ep4 ranks 1, and the head runs as 4 vocab slices everywhere. Greedy requests (argmax
// over the slices), sampled ones (candidates merged over the slices) and draws past the
// candidates (over the slices' logits) stream the tokens of the plain single rank. (That the
// logits are the same bits under these plans is tests/python/plans/test_invariance.py's check.)
TEST(ServeLoopReductionPlan, EveryDrawKindStreamsTheSingleRanksTokens) {
  auto run = [&](const std::string& plan, const std::string& reduction_plan) {
    TinyServer server(
        plan, 8, 64, [](EngineLoopOptions& lo) { lo.scheduler.chunked_prefill_size = 7; }, reduction_plan);
    auto tokens = sampled_tokens(server.loop, [](size_t i, EngineRequest& r) {
      if (i % 3 == 0) return;                             // greedy
      r.sampling.temperature = i % 3 == 1 ? 0.7f : 1.3f;  // 1.3 over flat rows reaches past the candidates
      r.sampling.top_p = i % 2 == 0 ? 0.9f : 1.0f;
      r.sampling.seed = 500 + i;
      if (i == 4) r.top_logprobs = 3;
    });
    // (A pipeline's sampled rows are drawn whole on the device: no fallback.)
    if (parallel::parse_plan(plan).pp == 1) {
      EXPECT_GT(sampling_fallbacks(server.loop), 0.0) << plan;
    } else {
      EXPECT_GT(device_drawn_rows(server.loop), 0.0) << plan;
    }
    return tokens;
  };
  const auto one_rank = run("single", "single");
  for (const std::string plan : {"single", "tp2", "tp4", "tp2pp2"}) EXPECT_EQ(run(plan, "tp4"), one_rank) << plan;
  for (const std::string plan : {"single", "ep2", "ep4"}) EXPECT_EQ(run(plan, "ep4"), one_rank) << plan;
}

TEST(ServeLoopLimits, QueueFullIsA429AndCancelFreesPages) {
  TinyServer server("single", 4, 64, [](EngineLoopOptions& lo) {
    lo.scheduler.max_running_requests = 1;
    lo.max_queued_requests = 1;
  });
  EngineLoop& loop = server.loop;
  EngineRequest long_request;
  long_request.prompt = {1, 2, 3};
  long_request.limits.max_tokens = 200;
  auto a = loop.submit(long_request);
  auto b = loop.submit(long_request);
  try {
    loop.submit(long_request);
    FAIL() << "expected a 429";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 429);
  }
  loop.cancel(a->id());
  loop.cancel(b->id());
  EXPECT_TRUE(loop.drain(std::chrono::milliseconds(10000)));
  EXPECT_EQ(loop.current_snapshot().kv_pages_used, 0);
  try {
    loop.submit(long_request);
    FAIL() << "expected a 503 while draining";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 503);
  }
}

}  // namespace
}  // namespace moeserve::serve
