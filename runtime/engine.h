// Engine: runs steps (step/step_plan.h) of a model under a parallel plan on its ranks: one
// thread per rank (runtime/rank_workers.h), each with its own shard of the model, its own
// weight source and its own communicators (an in-process world on CPU ranks, NCCL on GPUs).
// The last stage's attention-TP rank 0 of each replica hands the step's outputs over (logits
// gathered over the vocab split, or what the sampler reduced them to on the devices). What runs
// and what is drawn from the outputs is the caller's: runtime/step_loop.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/deepseek_v3.h"
#include "model/model_source.h"
#include "model/resident_weights.h"
#include "ops/ops.h"
#include "parallel/plan.h"
#include "runtime/rank_comms.h"
#include "step/step_plan.h"

namespace moeserve::dist {
class Cluster;
}  // namespace moeserve::dist

namespace moeserve::runtime {

using step::StepPlan;

struct EngineOptions {
  parallel::ParallelPlan plan;
  int64_t page_size = 64;
  int64_t num_pages = 256;      // per rank and layer (each DP replica has its own pool)
  std::string backend = "cpu";  // "cpu" or "cuda" (rank r on GPU r)
  bool graphs = true;           // replay decode steps as captured graphs where the backend can
  // Pipeline: sequences per micro-batch (0: ceil(live / pp), so that every stage has work)
  // and how far a stage may run ahead of the next: it blocks on sending a micro-batch while
  // pp_async_batch_depth + 1 earlier ones wait unreceived.
  int64_t pp_max_micro_batch_size = 0;
  int64_t pp_async_batch_depth = 0;
  ModelRunOptions run;           // reduction_plan: the same logits under every plan that nests in it
  bool batch_invariant = false;  // every row's logits independent of its batch (rank_devices.h)
  bool kv_cache_fp8 = false;     // --kv-cache-dtype fp8_e4m3 (scale 1, as SGLang and vLLM without scales)
  // Several processes (dist/cluster.h): this engine holds the cluster's local ranks only and
  // their collectives run over its data plane; on the leader, submit() / wait() /
  // sample_logits_rows() drive the followers' engines too (runtime/multinode.h). Not owned.
  dist::Cluster* cluster = nullptr;
};

// What a step gives back: per (micro-batch, DP replica), what the sampler drew under the
// batch's DrawKind: the logit rows [rows, vocab] (fp32), each row's id (I32 [rows]) for a
// greedy or sampled draw, or each row's top candidates (rows then empty).
struct StepOutputs {
  std::vector<std::vector<Tensor>> rows;
  std::vector<std::vector<sample::SampleCandidates>> candidates;
  std::vector<std::vector<std::vector<float>>> maxima;  // greedy draws: each row's largest logit
};
using StepTicket = uint64_t;

// What each rank did and holds, indexed by rank (this process's ranks when the engine spans
// processes).
struct EngineStats {
  std::vector<comm::CommStats> comm;        // communication since construction (all groups merged)
  std::vector<int64_t> weight_bytes;        // weights held, in the backend's dtypes (fp32 on CPU)
  std::vector<int64_t> forward_passes;      // since construction, one per micro-batch
  std::vector<parallel::RankShard> shards;  // what it owns
  std::vector<ReshardStats> reshard;        // what a re-plan from resident weights moved onto it (zeros otherwise)
};

class Engine {
 public:
  Engine(const ModelSource& model, EngineOptions options);
  // The same model under another plan, its weights assembled from the shards `reshard_from`'s
  // ranks hold (model/resident_weights.h) instead of read from the model's source; the two
  // engines exist together while it loads (reshard_fit() says whether they fit). Throws,
  // before anything loads, when the model or backend differ or the backend cannot copy
  // between ranks in place yet (GPU ranks). With `take_caches` (a re-plan that discards
  // reshard_from), the new ranks also take over reshard_from's KV cache buffers of their size
  // instead of allocating them, and reshard_from runs no step after.
  Engine(const ModelSource& model, EngineOptions options, Engine& reshard_from, bool take_caches = false);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  // The model as it was named (its spec: a directory or a synthetic preset), for errors.
  const std::string& model_name() const { return model_name_; }
  const EngineOptions& options() const { return options_; }
  // Whether decode-shaped and draft steps replay captured graphs (DeepseekV3::replays_graphs).
  bool replays_graphs() const;
  int64_t graphs_captured() const;  // by the first rank, so far (no step in flight)

  // Steps: submit() queues a step and returns at once; the rank threads run the queued steps
  // in submission order, micro-batches in order, each stage as soon as its input has arrived
  // (hidden states pass stage to stage), so while the last stage runs one group of
  // sequences' step the first can run another's (pipeline groups). wait() blocks until the
  // step has left every rank and returns its outputs; a synchronous step is
  // wait(submit(step)). The caller orders dependent steps itself (a sequence's next step is
  // submitted after its previous one was waited for and sampled). What each batch's
  // ForwardBatch::draw returns per (micro-batch, DP replica), rows as the step's
  // ReplicaBatch describes (step::set_draw sets it on every batch):
  //   kLogits      the fp32 logits [rows, vocab];
  //   kGreedy      each row's argmax id (I32 [rows]), reduced on the devices;
  //   kCandidates  each row's top candidates and softmax normaliser at the temperatures of
  //                its ForwardBatch::temperatures (cpu::sample_candidates finishes the draw);
  //   kSampled     each row's token (I32 [rows]) drawn on the devices under its
  //                ForwardBatch::sampling options right after its micro-batch.
  // A failed step stops the engine: later calls throw.
  StepTicket submit(StepPlan step);
  StepOutputs wait(StepTicket ticket);
  // Replica `replica`'s logit rows `rows` of the last step, each drawn under its `options`
  // exactly as cpu::sample_row draws it (ops::SampleParams), on the devices (each rank's
  // sample::Sampler::draw_rows); returns the tokens. For the rows a candidates step's candidates do not cover (the
  // step's last micro-batch's logits stay on the devices until the next step). Like for_each_rank(), it needs every
  // submitted step waited for.
  std::vector<int32_t> sample_logits_rows(int replica, const std::vector<int64_t>& rows,
                                          const std::vector<ops::SamplingOptions>& options);

  // What one rank holds, for tools that drive the ranks directly (benchmarks).
  struct RankView {
    int rank;
    DeepseekV3& model;
    sample::Sampler* sampler;  // last stage only
    ops::Backend& backend;
    RankComms& comms;
  };
  // Runs fn on every rank's own thread, all ranks at once (collective calls inside are fine).
  void for_each_rank(const std::function<void(RankView&)>& fn);

  EngineStats stats() const;

 private:
  struct Impl;
  // What this engine's ranks hold, for the next plan's engine to copy from (no step in flight).
  // With give_caches, hands its KV cache buffers over too and refuses steps from then on.
  ResidentWeights resident_weights(bool give_caches);
  void build(const ModelSource& model, Engine* reshard_from, bool take_caches);
  void build_comms(bool on_gpus);
  ModelConfig config_;
  std::string model_name_;
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::runtime
