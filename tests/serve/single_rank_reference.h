// Greedy tokens of `prompts` from runtime::generate on one CPU rank of synthetic:tiny: the
// reference every serving-loop test compares its outputs with.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_source.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace moeserve::serve {

inline std::vector<std::vector<int32_t>> single_rank_reference(const std::vector<std::vector<int32_t>>& prompts,
                                                               int64_t new_tokens, int64_t num_pages) {
  runtime::EngineOptions o;
  o.plan = parallel::parse_plan("single");
  o.page_size = 8;
  o.num_pages = num_pages;
  runtime::Engine engine(open_model("synthetic:tiny"), o);
  std::vector<runtime::GenerateRequest> requests;
  for (const auto& p : prompts) {
    runtime::GenerateRequest r;
    r.prompt = p;
    r.max_new_tokens = new_tokens;
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : runtime::generate(engine, requests)) out.push_back(r.tokens);
  return out;
}

}  // namespace moeserve::serve
