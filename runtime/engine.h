// Engine: runs steps (step/step_plan.h) of a model under a parallel plan on its ranks: one
// thread per rank (runtime/rank_workers.h), each with its own shard of the model, its own
// weight source and its own communicators (an in-process world on CPU ranks, NCCL on GPUs).
// The last stage's attention-TP rank 0 of each replica hands the step's outputs over (logits
// gathered over the vocab split, or what the head reduced them to on the devices). What runs
// and what is drawn from the outputs is the caller's: runtime/step_loop.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/deepseek_v3.h"
#include "model/model_source.h"
#include "ops/ops.h"
#include "parallel/plan.h"
#include "runtime/rank_comms.h"
#include "step/step_plan.h"

namespace moeserve::runtime {

using step::StepPlan;

struct EngineOptions {
  parallel::ParallelPlan plan;
  int64_t page_size = 64;
  int64_t num_pages = 256;  // per rank and layer (each DP replica has its own pool)
  std::string backend = "cpu";  // "cpu" or "cuda" (rank r on GPU r)
  bool graphs = true;           // replay decode steps as captured graphs where the backend can
  // Pipeline: sequences per micro-batch (0: ceil(live / pp), so that every stage has work)
  // and how far a stage may run ahead of the next: it blocks on sending a micro-batch while
  // pp_async_batch_depth + 1 earlier ones wait unreceived.
  int64_t pp_max_micro_batch_size = 0;
  int64_t pp_async_batch_depth = 0;
  ModelRunOptions run;  // reduction_plan: the same logits under every plan that nests in it
  bool batch_invariant = false;  // every row's logits independent of its batch (rank_devices.h)
};

// What a step gives back: per (micro-batch, DP replica), the logit rows [rows, vocab] (fp32),
// or each row's argmax id (I32 [rows]) for a greedy step, and for a sampling step each row's
// top candidates (rows then empty).
struct StepOutputs {
  std::vector<std::vector<Tensor>> rows;
  std::vector<std::vector<SampleCandidates>> candidates;
};
using StepTicket = uint64_t;

class Engine {
 public:
  Engine(const ModelSource& model, EngineOptions options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }

  // Runs one step built by the caller (a scheduler) on every rank: micro-batches in order,
  // hidden states passed stage to stage. Returns the fp32 logits [rows, vocab] of each
  // (micro-batch, DP replica), rows as the step's ReplicaBatch describes. A failed step
  // stops the engine: later calls throw.
  std::vector<std::vector<Tensor>> execute(const StepPlan& step);
  // The same for a step whose every logit row is decoded greedily: returns each row's argmax
  // id (Tensor I32 [rows]) instead of its logits, reduced on the devices (no logits leave them).
  std::vector<std::vector<Tensor>> execute_greedy(const StepPlan& step);
  // The same for a sampling step: each logit row's top candidates and softmax normaliser at
  // the temperatures of its ForwardBatch::temperatures, reduced on the devices (cpu::
  // sample_candidates finishes the draw). Until the next step, sample_logits_rows() draws
  // the rows the candidates do not cover over their whole logits (of the step's last
  // micro-batch), on the devices.
  std::vector<std::vector<SampleCandidates>> execute_candidates(const StepPlan& step);
  // The same for a step whose every logit row is drawn on the devices under its
  // ForwardBatch::sampling options, right after its micro-batch (HeadMode::kSampled): returns
  // each row's token (Tensor I32 [rows]); only tokens leave the devices.
  std::vector<std::vector<Tensor>> execute_sampled(const StepPlan& step);
  // Replica `replica`'s logit rows `rows` of the last step, each drawn under its `options`
  // exactly as cpu::sample_row draws it (ops::SampleParams); returns the tokens.
  std::vector<int32_t> sample_logits_rows(int replica, const std::vector<int64_t>& rows,
                                          const std::vector<ops::SamplingOptions>& options);

  // Asynchronous steps (pipeline plans while serving): submit() queues a step and returns at
  // once; the rank threads run the queued steps in submission order, each stage as soon as its
  // input has arrived, so while the last stage runs one group of sequences' step the first can
  // run another's. wait() blocks until the step has left every rank and returns its outputs.
  // The caller orders dependent steps itself (a sequence's next step is submitted after its
  // previous one was waited for and sampled). Every other call first lets the queue run empty
  // and needs every submitted step waited for; sample_logits_rows() then reads the last step.
  StepTicket submit(StepPlan step, HeadMode head);
  StepOutputs wait(StepTicket ticket);
  // Asynchronous pipelining across steps, the way serving runs it (submit / wait): the step's
  // micro-batches are independent groups of sequences, each decoding `rounds` steps, one step
  // of every group in flight at once. A group's step n + 1 is submitted once its step n has
  // been waited for (its outputs are on the host), so with as many groups as stages every
  // stage keeps working: while the last stage runs group A's step, the first runs group B's.
  // The step's inputs are reused each round (a benchmark: the tokens do not feed back).
  void execute_pipelined(const StepPlan& step, int rounds);

  // What one rank holds, for tools that drive the ranks directly (benchmarks).
  struct RankView {
    int rank;
    DeepseekV3& model;
    ops::Backend& backend;
    RankComms& comms;
  };
  // Runs fn on every rank's own thread, all ranks at once (collective calls inside are fine).
  void for_each_rank(const std::function<void(RankView&)>& fn);

  // Communication counted on each rank since construction (all its groups merged).
  std::vector<comm::CommStats> comm_stats() const;
  // Weight bytes held by each rank (in the backend's dtypes: fp32 on CPU).
  std::vector<int64_t> weight_bytes_per_rank() const;
  // Forward passes (one per micro-batch) each rank ran since construction.
  std::vector<int64_t> forward_passes_per_rank() const;
  // What each rank owns.
  std::vector<parallel::RankShard> shards() const;

 private:
  StepOutputs run(const StepPlan& step, HeadMode head);
  struct Impl;
  ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::runtime
