#include "runtime/prefill_benchmark.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "perf/step_cost.h"

namespace moeserve::runtime {

namespace {

// One sequence of `tokens` prompt tokens on replica 0, pages 0 .. from its pool.
StepPlan prefill_step(const Engine& engine, int64_t tokens) {
  const EngineOptions& o = engine.options();
  const int64_t pages_needed = prefill_pages(tokens, o.page_size);
  MS_CHECK(pages_needed <= o.num_pages, "bench-step --prefill {}: needs {} KV pages, the engine has {}", tokens,
           pages_needed, o.num_pages);
  const int64_t vocab = engine.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  std::vector<int32_t> pages(static_cast<size_t>(pages_needed));
  for (int64_t p = 0; p < pages_needed; ++p) pages[p] = static_cast<int32_t>(p);
  step::MicroBatch mb;
  mb.replicas.resize(static_cast<size_t>(o.plan.attn_dp));
  mb.replicas[0].batch.max_pages_per_seq = pages_needed;
  step::append_sequence(mb.replicas[0], 0, ids, 0, tokens, pages, o.page_size, step::LogitRows::kLast);
  StepPlan plan;
  plan.micro_batches.push_back(std::move(mb));
  return plan;
}

// FLOPs of the pass on every rank: the step cost of `tokens` tokens each attending to (tokens +
// 1) / 2 rows (the causal mean; exact for odd counts, 0.01% over at 8192), and the same with no
// context (so the difference is attention's).
void count_flops(const Engine& engine, int64_t tokens, PrefillBenchResult& r) {
  const ModelConfig& config = engine.config();
  const parallel::ParallelPlan& plan = engine.options().plan;
  const parallel::ShardDims dims = shard_dims(config);
  for (int rank = 0; rank < plan.world(); ++rank) {
    const parallel::RankShard shard = parallel::shard_of(plan, dims, rank);
    if (shard.coord.dp_index != 0) continue;  // the prompt runs on replica 0
    perf::StepShape shape;
    shape.tokens = tokens;
    shape.context = (tokens + 1) / 2;
    const double with_context = perf::decode_step_cost(config, shard, shape).flops;
    shape.context = 0;
    const double without = perf::decode_step_cost(config, shard, shape).flops;
    r.flops += with_context;
    r.attention_flops += with_context - without;
  }
}

}  // namespace

int64_t prefill_pages(int64_t tokens, int64_t page_size) { return (tokens + page_size - 1) / page_size; }

std::vector<PrefillBenchResult> benchmark_prefill(Engine& engine, const std::vector<int64_t>& lengths,
                                                  const PrefillBenchOptions& options) {
  std::vector<PrefillBenchResult> results;
  for (int64_t tokens : lengths) {
    MS_CHECK(tokens > 0, "bench-step --prefill: prompt lengths must be positive, got {}", tokens);
    const StepPlan step = prefill_step(engine, tokens);
    for (int i = 0; i < options.warmup; ++i) engine.wait(engine.submit(step));
    std::vector<double> ms;
    for (int i = 0; i < std::max(1, options.iterations); ++i) {
      const auto start = std::chrono::steady_clock::now();
      engine.wait(engine.submit(step));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    PrefillBenchResult r;
    r.tokens = tokens;
    r.ms = ms[ms.size() / 2];
    r.tokens_per_s = static_cast<double>(tokens) / (r.ms * 1e-3);
    count_flops(engine, tokens, r);
    results.push_back(r);
  }
  return results;
}

}  // namespace moeserve::runtime
