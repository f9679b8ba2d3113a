// The DeepSeek-V3 forward (MLA attention, dense MLP, MoE with shared experts), written once
// against ops::Backend and comm::Communicator. One DeepseekV3 object is one rank's shard of
// the model under a ParallelPlan; the single-rank plan is the whole model.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "model/weight_source.h"
#include "ops/ops.h"
#include "parallel/plan.h"
#include "sample/sampler.h"
#include "step/forward_batch.h"

namespace moeserve {

namespace comm {
class ExpertExchange;
}
struct Activations;
struct LayerPart;
struct LinearWeight;
struct LayerWeights;
struct ModelWeights;
class WeightIndex;
class GraphCache;
class LmHead;
class Workspace;

// The groups a rank talks to. Any may be null when its group has one member.
struct RankGroups {
  comm::Communicator* attn_tp = nullptr;  // same stage and DP replica (attention, dense, vocab)
  comm::Communicator* moe = nullptr;      // the whole stage (routed experts)
};

// A paged MLA latent cache for this rank's layers: [num_pages * page_size, latent + rope]
// per layer.
struct KvCacheShape {
  int64_t num_pages = 0;
  int64_t page_size = 64;
  // --kv-cache-dtype fp8_e4m3: the latent cache holds e4m3fn codes of value / fp8_scale, one
  // byte each on the GPU (a float each on the CPU, which keeps the codes' exact values).
  bool fp8 = false;
  float fp8_scale = 1.0f;
};

// How a rank computes, beside what it owns.
//
// reduction_plan (default single: none): every sum that a tensor- or expert-parallel plan
// splits -- o_proj over heads, the dense MLP's and shared experts' down projections over their
// columns, the routed experts over expert groups and columns, the LM head over the vocabulary
// -- is computed as the reduction plan's C ranks split it: C parts, each by the same kernel
// call one of those ranks makes, added in fp32 in one fixed pairwise tree (((p0 + p1) +
// (p2 + p3)) ...). A rank of a plan whose split nests in the reduction plan's (its ranks
// divide C and each holds a contiguous run of the C parts: check_reduction_plan) computes its
// run of parts and the ranks add their sums in the same tree. So every such plan -- one GPU,
// tp2 ... tpC under reduction plan tpC; one GPU, ep2 ... epC under epC; their pipelines --
// computes the same bits: identical logits, not close ones. The cost: C / ranks launches of
// each split op, C / ranks fp32 partial branches, no fused all-reduce + norm.
// Attention-DP plans move routed tokens by all-to-all and sum their experts' bf16 outputs in
// another order: they are outside every reduction plan.
//
// mtp: the last stage also loads the MTP layer (num_nextn_predict_layers, stored as layer
// num_hidden_layers) with its own latent cache, and the embedding where it is not the first
// stage; batches with ForwardBatch::mtp_tokens then return its logits.
struct ModelRunOptions {
  parallel::ParallelPlan reduction_plan;  // pp 1, no attention DP, a power-of-two number of ranks
  bool mtp = false;
};

// Throws, naming --reduction-plan and the plan or config field at fault, unless `plan` nests in
// `run.reduction_plan` on this model.
void check_reduction_plan(const ModelConfig& config, const parallel::ParallelPlan& plan, const ModelRunOptions& run);

class DeepseekV3 {
 public:
  // Loads this rank's weights from `source` (only the slices the shard owns). Synthetic
  // weights are generated directly in backend memory.
  DeepseekV3(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank, ops::Backend& backend,
             WeightSource& source, RankGroups groups, KvCacheShape cache, ModelRunOptions run = {});
  ~DeepseekV3();

  const ModelConfig& config() const { return config_; }
  const parallel::RankShard& shard() const { return shard_; }
  const KvCacheShape& cache_shape() const { return cache_shape_; }
  ops::Backend& backend() { return backend_; }

  // The residual stream [T, hidden] (activation dtype, backend memory) of a step of T
  // tokens: a later pipeline stage receives its input here before forward(), and every
  // stage but the last leaves its output here.
  ops::Buffer& hidden_states(int64_t tokens);

  // Runs this stage's layers on `batch`. The first stage embeds batch.tokens; later stages
  // read hidden_states(T). The last stage ends with the LM head projection, fp32 logits
  // [parts, logit_rows, vocab_part] on the device, and `sampler`'s device part for batch.draw
  // (sample::Sampler::reduce) inside the same step (and graph); it returns where the logits
  // and what the sampler reduced them to lie, for Sampler::finish. Earlier stages wait for the
  // step and return nothing (`sampler` may be null there). A constrained batch's token bitmask
  // is waited for after the head was enqueued (step/token_bitmask.h). One sampler per rank: a captured
  // graph replays the sampler's collectives of its capture.
  sample::SamplerBuffers forward(const ForwardBatch& batch, sample::Sampler* sampler);
  // What a sampler of this rank's logits needs: the backend, the vocab split, its attn_tp group.
  sample::SamplerParams sampler_params() const;

  // Decode-shaped steps (one logit row per token, in order) are captured once per
  // (tokens, max_pages_per_seq) and replayed as a graph on backends that support it.
  void set_graphs_enabled(bool enabled) { graphs_enabled_ = enabled; }
  // Whether such steps replay graphs on this rank now: enabled, a backend that captures them,
  // one attention replica, no routing recorded.
  bool replays_graphs() const {
    return graphs_enabled_ && backend_.supports_graphs() && plan_.attn_dp == 1 && !record_routing_;
  }
  int64_t graphs_captured() const;

  // Keep a host copy of each MoE layer's routing ([tokens, top_k] expert ids) while recording
  // (a synchronising download: for accounting, not for timed runs). Switching it on clears
  // the copy; every forward until then appends its tokens (all micro-batches of a step).
  void set_record_routing(bool record) {
    if (record && !record_routing_) last_routing_.clear();
    record_routing_ = record;
  }
  const std::vector<std::vector<int32_t>>& last_routing() const { return last_routing_; }

  // The latent cache of each local layer ([num_pages * page_size, latent + rope]).
  std::vector<ops::Buffer*> kv_caches();
  // Gives its KV cache buffers away (a re-plan's engine takes them over); it runs no step after.
  std::vector<ops::BufferPtr> release_kv_caches();

  // Bytes of weights this rank holds (in the backend's dtypes).
  int64_t weight_bytes() const { return weight_bytes_; }
  // Where this rank's weights lie (model/weight_index.h), for a re-plan from resident weights.
  const WeightIndex& weight_index() const;

 private:
  // A branch (attention, dense MLP, MoE) leaves this rank's partial [T, hidden] fp32 sum in
  // a.branch; summing it over `group` completes it (add_branch, fused with the residual add
  // and the next norm where the communicator can). `site` labels the all-reduce.
  struct BranchSum {
    comm::Communicator* group;
    const char* site;
  };
  // The device work of a step: embedding (first stage), layers, (last stage) the head; then
  // draw(): the token bitmask (a constrained batch) and the device part of the draw.
  void run(Activations& a, const ForwardBatch& batch);
  void draw(Activations& a, const ForwardBatch& batch, sample::Sampler* sampler);
  // Both, captured or replayed as graphs for decode-shaped steps. A constrained batch's
  // token bitmask is filled by the step loop while the forward runs: its step is two graphs,
  // the forward to the logits, then (the bitmask waited for and uploaded) the draw.
  void run_step(Activations& a, const ForwardBatch& batch, sample::Sampler* sampler, bool graphed);
  void embed(Activations& a);
  BranchSum attention(const LayerWeights& layer, ops::Buffer& cache, Activations& a, int64_t max_pages_per_seq);
  // One decoder layer: normed = input_norm(hidden) is ready; leaves hidden += attention + MLP
  // and normed = next_norm(hidden) (no norm with next_norm == nullptr).
  void decoder_layer(const LayerWeights& layer, ops::Buffer& cache, int64_t moe_layer, Activations& a,
                     int64_t max_pages_per_seq, const void* next_norm);
  // The MTP layer over the stage's output a.hidden and a.mtp_ids (model/deepseek_v3_mtp.cc):
  // leaves its block's output in a.hidden (the head normalises it with shared_head.norm).
  // normed_ready: a.normed already holds the (normalised) input hidden state (a draft step).
  void mtp(Activations& a, int64_t max_pages_per_seq, bool normed_ready);
  // An MTP draft step (ForwardBatch::mtp_draft): the store's rows through the MTP layer and head.
  void mtp_draft(Activations& a, const ForwardBatch& batch);
  // Hidden store rows [first_row + slot] = norm(a.hidden) per token (ForwardBatch::mtp_hidden_rows).
  void store_hidden(Activations& a, const ops::BufferPtr& norm, int64_t first_row);
  void attention_part(const LayerPart& part, int v, ops::Buffer& cache, Activations& a, int64_t max_pages_per_seq);
  BranchSum dense_mlp(const LayerWeights& layer, Activations& a);
  BranchSum moe(const LayerWeights& layer, int64_t moe_layer, Activations& a);
  BranchSum moe_dispatch_combine(const LayerWeights& layer, int64_t moe_layer, Activations& a);
  // hidden += sum over the group of a.branch; then normed = rms_norm(hidden) * norm_weight, or
  // no norm with norm_weight == nullptr (the stage's last add).
  void add_branch(const BranchSum& sum, Activations& a, const void* norm_weight);
  bool reduction_plan_on() const { return run_.reduction_plan.world() > 1; }
  // out [T, hidden] fp32 (+)= the MLP of `inter` columns (w13, w2) on a.normed.
  void mlp(const LinearWeight& w13, const LinearWeight& w2, int64_t inter, Activations& a, void* out, bool accumulate);
  void shared_experts(const LayerWeights& layer, const LayerPart& part, Activations& a, void* out, bool accumulate);
  void* branch_part(Activations& a, int v) const;  // [T, hidden] fp32: part v's partial branch
  void record_routing(int64_t moe_layer, const int32_t* ids, size_t count);

  ModelConfig config_;
  parallel::ParallelPlan plan_;
  parallel::RankShard shard_;
  ModelRunOptions run_;
  // Parts of each split this rank computes (the reduction plan's ranks / this plan's per
  // stage, at least 1).
  int parts_ = 1;
  ops::Backend& backend_;
  RankGroups groups_;
  KvCacheShape cache_shape_;
  int64_t weight_bytes_ = 0;
  bool graphs_enabled_ = false;
  bool record_routing_ = false;
  std::vector<std::vector<int32_t>> last_routing_;  // [moe layer][tokens * top_k], appended per forward

  std::unique_ptr<ModelWeights> weights_;
  std::vector<ops::BufferPtr> kv_cache_;            // per local layer
  ops::BufferPtr mtp_kv_cache_;                     // the MTP layer's (ModelRunOptions::mtp, last stage)
  ops::BufferPtr mtp_hidden_store_;                 // [2 * slots, hidden]: ForwardBatch::mtp_hidden_rows
  std::unique_ptr<comm::ExpertExchange> exchange_;  // attention DP: routed tokens by all-to-all
  std::unique_ptr<LmHead> head_;
  int64_t candidates_per_slice_ = 0;  // of a kCandidates draw: min(kCandidatesPerSlice, vocab part)
  std::unique_ptr<Workspace> workspace_;
  std::unique_ptr<GraphCache> graphs_;  // last: its graphs go first, before the buffers they point at
};

}  // namespace moeserve
