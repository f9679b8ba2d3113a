// Speculative decoding (NGRAM) is lossless: under single, tp2, ep2, pp2 (two pipeline groups in
// flight), ep2-dp and ep2tp2 on CPU ranks, requests arriving over time -- speculative and not,
// of different lengths, prompts with repetition so that drafts are accepted, chunked prefill
// and the prefix cache on -- get token for token the greedy outputs of the plain single-rank
// loop. Sampled speculative requests are reproducible from their seed. After the load every
// KV page is free or only cached, and flushing the prefix cache frees them all.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/step_loop.h"
#include "spec/speculative_options.h"

namespace moeserve::runtime {
namespace {

using Tokens = std::vector<int32_t>;

struct Arrival {
  int64_t step;  // the loop step it arrives at
  Tokens prompt;
  int64_t max_new_tokens;
  bool speculative = true;
  ops::SamplingOptions sampling = {};
};

const std::vector<Arrival>& arrivals() {
  static const std::vector<Arrival> a = {
      {0, {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7}, 24},
      {0, {1, 2, 1, 2, 1, 2, 1}, 16, false},
      {1, {100, 200, 300, 400, 100, 200, 300, 400, 100, 200}, 20},
      {3, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28}, 12},
      {4, {42}, 18},
      {6, {5, 6, 7, 8, 5, 6, 7, 8, 9, 9, 9, 9}, 22, false},
      {9, {9, 9, 9, 9, 9, 9}, 14},
      {9, {300, 301, 300, 301, 300}, 9},
  };
  return a;
}

EngineOptions engine_options(const std::string& plan) {
  EngineOptions o;
  o.plan = parallel::parse_plan(plan);
  o.page_size = 4;  // drafts cross pages
  o.num_pages = 96;
  return o;
}

StepLoopOptions loop_options(const Engine& engine, const spec::SpeculativeOptions& speculative) {
  const EngineOptions& e = engine.options();
  return {.scheduler = {.page_size = e.page_size,
                        .pages_per_replica = e.num_pages,
                        .attn_dp = e.plan.attn_dp,
                        .pp = e.plan.pp,
                        .pipeline_groups = e.plan.pp,
                        .max_running_requests = 8,
                        .chunked_prefill_size = 16},
          .speculative = speculative};
}

struct LoadResult {
  std::map<sched::RequestId, Tokens> tokens;
  int64_t drafted = 0, accepted = 0;
};

// Runs the arrivals through one loop; each request ends at its max_new_tokens.
LoadResult run_load(Engine& engine, const spec::SpeculativeOptions& speculative, const std::vector<Arrival>& load) {
  StepLoop loop(engine, loop_options(engine, speculative));
  LoadResult out;
  std::set<sched::RequestId> done;
  size_t next = 0;
  for (int64_t step = 0; next < load.size() || !loop.idle(); ++step) {
    for (; next < load.size() && load[next].step <= step; ++next)
      loop.add(next, {.prompt = load[next].prompt,
                      .sampling = load[next].sampling,
                      .speculative = load[next].speculative,
                      .max_new_tokens = load[next].max_new_tokens});
    if (loop.idle()) continue;
    const StepResult result = loop.step();
    EXPECT_FALSE(result.stalled);
    for (const VerifiedDrafts& v : result.verified) {
      out.drafted += v.drafted;
      out.accepted += v.accepted;
    }
    for (const DrawnToken& t : result.tokens) {
      if (done.count(t.id)) continue;  // past its end within a speculative step
      out.tokens[t.id].push_back(t.token);
      if (static_cast<int64_t>(out.tokens[t.id].size()) == load[t.id].max_new_tokens) {
        done.insert(t.id);
        loop.finish(t.id);
      }
    }
  }
  // Every page is back: none held by a sequence, and the prefix cache holds only whole pages
  // of committed tokens, which a flush frees.
  for (int d = 0; d < loop.scheduler().num_replicas(); ++d) {
    kv::KvCache& kv = loop.scheduler().kv(d);
    kv.check_consistency();
    EXPECT_EQ(kv.used_pages(), 0) << "replica " << d;
  }
  loop.scheduler().flush_prefix_cache();
  for (int d = 0; d < loop.scheduler().num_replicas(); ++d)
    EXPECT_EQ(loop.scheduler().kv(d).free_pages(), loop.scheduler().kv(d).num_pages());
  return out;
}

spec::SpeculativeOptions ngram(int64_t draft_tokens) {
  return spec::speculative_options({.algorithm = "NGRAM", .num_draft_tokens = draft_tokens});
}

const LoadResult& reference() {
  static const LoadResult r = [] {
    Engine engine(open_model("synthetic:tiny"), engine_options("single"));
    return run_load(engine, {}, arrivals());
  }();
  return r;
}

class SpeculativePlans : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativePlans, GreedyOutputsEqualThePlainLoop) {
  Engine engine(open_model("synthetic:tiny"), engine_options(GetParam()));
  const LoadResult spec = run_load(engine, ngram(5), arrivals());
  ASSERT_EQ(spec.tokens.size(), arrivals().size());
  for (const auto& [id, tokens] : reference().tokens)
    EXPECT_EQ(spec.tokens.at(id), tokens) << GetParam() << ": request " << id;
  EXPECT_GT(spec.accepted, 0) << "no draft was accepted: the test would not exercise verification";
  EXPECT_LT(spec.accepted, spec.drafted);  // and rejections happened too
}

INSTANTIATE_TEST_SUITE_P(CpuRanks, SpeculativePlans,
                         ::testing::Values("single", "tp2", "ep2", "pp2", "ep2-dp", "ep2tp2"), [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(SpeculativeSampling, ReproducibleFromTheSeedBesidePlainRequests) {
  std::vector<Arrival> load = arrivals();
  for (size_t i = 0; i < load.size(); i += 2) load[i].sampling = {.temperature = 0.7f, .top_p = 0.95f, .seed = 11 + i};
  Engine engine(open_model("synthetic:tiny"), engine_options("single"));
  const LoadResult a = run_load(engine, ngram(4), load), b = run_load(engine, ngram(4), load);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.drafted, 0);
  // Greedy requests beside sampled ones are unchanged.
  for (size_t i = 1; i < load.size(); i += 2) EXPECT_EQ(a.tokens.at(i), reference().tokens.at(i)) << "request " << i;
}

}  // namespace
}  // namespace moeserve::runtime
