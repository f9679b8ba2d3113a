// Decode-step benchmark (`moeserve bench-step`): runs a decode step of `batch` sequences at
// `context` cached tokens each on an engine, many times, and reports the step time, what the
// step must read and compute (perf/step_cost.h, with the experts the step actually routed
// to), and, on GPUs, the per-op breakdown and the time spent in each collective beside the
// same collective's latency measured alone through the same communicators.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "perf/step_cost.h"
#include "runtime/engine.h"

namespace moeserve::runtime {

// A synthetic decode step (benchmarks, tests): `batch` sequences, sequence i on replica
// i % attn_dp with `context` cached tokens, decoding position `context` with token
// token_of(i, context); each replica's sequences hold consecutive pages of its pool from page 0.
// tokens_per_seq > 1: a speculative verify step, positions p = context .. context +
// tokens_per_seq - 1 of each sequence (tokens token_of(i, p): drafts differ, and so does their
// routing), every one with its logits.
struct DecodeStepShape {
  int64_t batch = 1;
  int64_t context = 0;
  int64_t tokens_per_seq = 1;
  int64_t page_size = 64;
  int64_t num_pages = 0;  // per replica
  int attn_dp = 1;
  step::MicroBatching micro_batching = {};
  std::function<int32_t(int64_t sequence, int64_t position)> token_of = [](int64_t, int64_t) { return 0; };
};
StepPlan synthetic_decode_step(const DecodeStepShape& shape);

// Asynchronous pipelining across steps, the way serving runs it (Engine::submit / wait): the
// step's micro-batches are independent groups of sequences, each decoding `rounds` steps, one
// step of every group in flight at once. A group's step n + 1 is submitted once its step n has
// been waited for (its outputs are on the host), so with as many groups as stages every stage
// keeps working: while the last stage runs group A's step, the first runs group B's. The
// step's inputs are reused each round (a benchmark: the tokens do not feed back).
void run_pipelined(Engine& engine, const StepPlan& step, int rounds);

struct StepBenchOptions {
  int64_t context = 1024;
  int64_t tokens_per_seq = 1;  // > 1: verify steps (DecodeStepShape::tokens_per_seq)
  int iterations = 20;
  int warmup = 3;
  bool breakdown = false;  // per-op times (GPU backends)
  bool comm = true;        // communication time and NCCL-alone latency (multi-GPU)
  bool pipelined = true;   // pipeline plans: also time groups in flight (PipelinedResult)
};

// A pipeline plan with one group of `batch` sequences per stage in flight (asynchronous
// pipelining, run_pipelined): every stage runs one group's step while the next
// stage runs another's.
struct PipelinedResult {
  int groups = 0;                                   // = stages
  double round_ms = 0;                              // steady state: every group one step
  double tokens_per_s = 0;                          // groups * batch per round
  std::vector<perf::StepCost> group_cost_per_rank;  // one group's step
  std::vector<std::vector<int64_t>> experts_hit_per_rank;
  // Each stage runs `groups` group steps per round: its bytes per group step over this time.
  double group_step_ms() const { return groups > 0 ? round_ms / groups : 0; }
  double max_rank_bytes() const;
};

struct CommTiming {
  std::string group;  // attn_tp | moe | pipeline
  std::string collective;
  int64_t calls_per_step = 0;
  double bytes_per_call = 0;
  double ms_per_step = 0;        // inside the step (CUDA events around each call, rank 0)
  double ms_alone_per_step = 0;  // the same calls and sizes, run alone (all ranks), per step
};

struct StepBenchResult {
  int64_t batch = 0;
  int64_t tokens_per_seq = 1;
  double step_ms = 0;       // median wall-clock time of one step
  double tokens_per_s = 0;  // tokens the step computes (a verify step's drafts included)
  std::vector<perf::StepCost> cost_per_rank;
  std::vector<std::vector<int64_t>> experts_hit_per_rank;            // [rank][moe layer]
  std::map<std::string, std::pair<int64_t, double>> op_ms_per_step;  // rank 0: op -> (calls, ms)
  std::vector<CommTiming> comm;                                      // rank 0
  std::optional<PipelinedResult> pipelined;                          // pipeline plans
  double max_rank_bytes() const;
  double total_flops() const;
};

// KV caches of every rank are filled with random latents once (the values do not change
// the work). The engine needs num_pages >= batch * ceil((context + tokens_per_seq) / page_size)
// per replica.
std::vector<StepBenchResult> benchmark_decode_steps(Engine& engine, const std::vector<int64_t>& batches,
                                                    const StepBenchOptions& options);

}  // namespace moeserve::runtime
