// A load of requests arriving over time through one StepLoop, for the speculative-decoding
// tests (NGRAM: speculative_test.cc, NEXTN: nextn_test.cc): each request ends at its
// max_new_tokens; afterwards every KV page must be free or only cached, and a prefix-cache
// flush must free them all.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/step_loop.h"
#include "spec/speculative_options.h"

namespace moeserve::runtime::testing_load {

using Tokens = std::vector<int32_t>;

struct Arrival {
  int64_t step;  // the loop step it arrives at
  Tokens prompt;
  int64_t max_new_tokens;
  bool speculative = true;
  ops::SamplingOptions sampling = {};
};

inline EngineOptions engine_options(const std::string& plan, int64_t num_pages = 96) {
  EngineOptions o;
  o.plan = parallel::parse_plan(plan);
  o.page_size = 4;  // drafts cross pages
  o.num_pages = num_pages;
  return o;
}

inline StepLoopOptions loop_options(const Engine& engine, const spec::SpeculativeOptions& speculative) {
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

// Adds the arrivals due at `step` (ids: their index in `load`, plus `first_id`).
inline void add_arrivals(StepLoop& loop, const std::vector<Arrival>& load, int64_t step, size_t& next,
                         sched::RequestId first_id = 0) {
  for (; next < load.size() && load[next].step <= step; ++next)
    loop.add(first_id + next, {.prompt = load[next].prompt,
                               .sampling = load[next].sampling,
                               .speculative = load[next].speculative,
                               .max_new_tokens = load[next].max_new_tokens});
}

// Runs the arrivals through `loop` until it is idle.
inline LoadResult run_arrivals(StepLoop& loop, const std::vector<Arrival>& load, sched::RequestId first_id = 0) {
  LoadResult out;
  std::set<sched::RequestId> done;
  size_t next = 0;
  for (int64_t step = 0; next < load.size() || !loop.idle(); ++step) {
    add_arrivals(loop, load, step, next, first_id);
    if (loop.idle()) continue;
    const StepResult result = loop.step();
    EXPECT_FALSE(result.stalled);
    for (const VerifiedDrafts& v : result.verified) {
      out.drafted += v.drafted;
      out.accepted += v.accepted;
    }
    for (const DrawnToken& t : result.tokens) {
      if (done.count(t.id)) continue;  // past its end within a speculative step
      out.tokens[t.id - first_id].push_back(t.token);
      if (static_cast<int64_t>(out.tokens[t.id - first_id].size()) == load[t.id - first_id].max_new_tokens) {
        done.insert(t.id);
        loop.finish(t.id);
      }
    }
  }
  return out;
}

// Every page is back: none held by a sequence, and the prefix cache holds only whole pages of
// committed tokens, which a flush frees.
inline void expect_no_leak(StepLoop& loop) {
  for (int d = 0; d < loop.scheduler().num_replicas(); ++d) {
    kv::KvCache& kv = loop.scheduler().kv(d);
    kv.check_consistency();
    EXPECT_EQ(kv.used_pages(), 0) << "replica " << d;
  }
  loop.scheduler().flush_prefix_cache();
  for (int d = 0; d < loop.scheduler().num_replicas(); ++d)
    EXPECT_EQ(loop.scheduler().kv(d).free_pages(), loop.scheduler().kv(d).num_pages());
}

// Runs the arrivals through one loop of its own and checks that nothing leaked.
inline LoadResult run_load(Engine& engine, const spec::SpeculativeOptions& speculative,
                           const std::vector<Arrival>& load) {
  StepLoop loop(engine, loop_options(engine, speculative));
  LoadResult out = run_arrivals(loop, load);
  expect_no_leak(loop);
  return out;
}

}  // namespace moeserve::runtime::testing_load
