#include "runtime/generate.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "runtime/step_loop.h"

namespace moeserve::runtime {

namespace {

void check_requests(const std::vector<GenerateRequest>& requests, const ModelConfig& config) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    MS_CHECK(!r.prompt.empty(), "request {}: empty prompt", i);
    MS_CHECK(r.max_new_tokens >= 0, "request {}: max_new_tokens must be >= 0", i);
    for (int32_t id : r.prompt)
      MS_CHECK(id >= 0 && id < config.vocab_size, "request {}: prompt token {} outside the vocabulary [0, {})", i, id,
               config.vocab_size);
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
    MS_CHECK(total <= config.max_position_embeddings,
             "request {}: prompt + max_new_tokens = {} exceeds the context length {}", i, total,
             config.max_position_embeddings);
  }
}

sched::SchedulerOptions scheduler_for(const Engine& engine, const std::vector<GenerateRequest>& requests) {
  const EngineOptions& o = engine.options();
  int64_t prompt_tokens = 0;
  for (const auto& r : requests) prompt_tokens += static_cast<int64_t>(r.prompt.size());
  return {.page_size = o.page_size,
          .pages_per_replica = o.num_pages,
          .attn_dp = o.plan.attn_dp,
          .pp = o.plan.pp,
          .max_micro_batch_size = o.pp_max_micro_batch_size,
          .max_running_requests = std::max<int64_t>(static_cast<int64_t>(requests.size()), 1),
          .chunked_prefill_size = std::max<int64_t>(prompt_tokens, 1),
          .prefix_cache = false,
          .pad_batches = false,
          .admission_headroom = 0};
}

// Whether `result` is done after its latest token: a stop id, or max_new_tokens.
bool finished(GenerateResult& result, const GenerateRequest& request) {
  const auto& stops = request.stop_ids;
  if (!result.tokens.empty() && std::find(stops.begin(), stops.end(), result.tokens.back()) != stops.end()) {
    result.finish_reason = "stop";
  } else if (static_cast<int64_t>(result.tokens.size()) >= request.max_new_tokens) {
    result.finish_reason = "length";
  }
  return !result.finish_reason.empty();
}

}  // namespace

int64_t kv_pages_for(const std::vector<GenerateRequest>& requests, int64_t page_size, int64_t max_drafts) {
  int64_t pages = 1;  // the padding page
  for (const auto& r : requests)
    pages += (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + max_drafts + page_size - 1) / page_size;
  return pages;
}

std::vector<GenerateResult> generate(Engine& engine, const std::vector<GenerateRequest>& requests,
                                     const GenerateOptions& options) {
  check_requests(requests, engine.config());
  const int64_t vocab = engine.config().vocab_size;
  StepLoop loop(engine, {.scheduler = scheduler_for(engine, requests), .speculative = options.speculative});
  std::vector<GenerateResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& r = requests[i];
    if (options.prompt_logits)
      results[i].prompt_logits = Tensor(DType::F32, {static_cast<int64_t>(r.prompt.size()), vocab});
    else if (finished(results[i], r))  // max_new_tokens 0: nothing to compute
      continue;
    loop.add(i, {.prompt = r.prompt,
                 .sampling = r.sampling,
                 .top_logprobs = r.top_logprobs,
                 .prompt_logits = options.prompt_logits,
                 .max_new_tokens = r.max_new_tokens});
  }
  while (!loop.idle()) {
    StepResult step = loop.step();
    MS_CHECK(!step.stalled, "generate: the scheduler could not place every request (raise --kv-pages)");
    for (const PromptLogitRows& rows : step.prompt_logits)
      std::memcpy(results[rows.id].prompt_logits.f32() + rows.begin * vocab, rows.rows.f32(), rows.rows.nbytes());
    for (const VerifiedDrafts& v : step.verified) {
      ++results[v.id].verify_steps;
      results[v.id].drafted_tokens += v.drafted;
      results[v.id].accepted_tokens += v.accepted;
    }
    for (DrawnToken& drawn : step.tokens) {
      const GenerateRequest& request = requests[drawn.id];
      GenerateResult& result = results[drawn.id];
      if (!result.finish_reason.empty()) continue;  // a speculative step's tokens past its end
      if (static_cast<int64_t>(result.tokens.size()) < request.max_new_tokens) {  // else only prompt logits
        result.tokens.push_back(drawn.token);
        result.logprobs.push_back(std::move(drawn.logprob));
      }
      if (finished(result, request)) loop.finish(drawn.id);
    }
  }
  return results;
}

}  // namespace moeserve::runtime
