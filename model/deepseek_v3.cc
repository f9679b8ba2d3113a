// One rank's forward: embedding, per layer MLA attention then a dense MLP or the MoE block,
// each branch summed over its group into the residual stream, then the head projection
// (model/lm_head) to device logits and the caller's sampler's device part (sample/sampler.h).
#include "model/deepseek_v3.h"

#include <algorithm>

#include "comm/expert_exchange.h"
#include "comm/fused_all_reduce_norm.h"
#include "core/error.h"
#include "model/deepseek_v3_loader.h"
#include "model/deepseek_v3_weights.h"
#include "model/forward_batch_check.h"
#include "model/graph_cache.h"
#include "model/layer_ops.h"
#include "model/lm_head.h"
#include "model/reduction_tree.h"
#include "model/resident_weights.h"
#include "model/workspace.h"

namespace moeserve {

using ops::BufferPtr;
using parallel::Range;

DeepseekV3::DeepseekV3(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank, ops::Backend& backend,
                       WeightSource& source, RankGroups groups, KvCacheShape cache, ModelRunOptions run)
    : config_(config), plan_(plan), run_(run), backend_(backend), groups_(groups), cache_shape_(cache) {
  shard_ = parallel::shard_of(plan, shard_dims(config), rank);
  const int stage_ranks = plan.ranks_per_stage();
  MS_CHECK(plan.attn_tp == 1 || (groups.attn_tp != nullptr && groups.attn_tp->size() == plan.attn_tp),
           "plan '{}' rank {}: needs an attention-TP communicator of {} ranks", plan.name, rank, plan.attn_tp);
  MS_CHECK(stage_ranks == 1 || (groups.moe != nullptr && groups.moe->size() == stage_ranks),
           "plan '{}' rank {}: needs a MoE (stage) communicator of {} ranks", plan.name, rank, stage_ranks);
  check_reduction_plan(config, plan, run);
  parts_ = std::max(1, run.reduction_plan.world() / stage_ranks);
  weights_ = std::make_unique<ModelWeights>(load_weights({.config = config_,
                                                          .shard = shard_,
                                                          .parts = parts_,
                                                          .reduction_plan = run_.reduction_plan,
                                                          .backend = backend,
                                                          .source = source,
                                                          .mtp = run.mtp}));
  weight_bytes_ = weights_->bytes;
  const int64_t width = config.kv_lora_rank + config.qk_rope_head_dim;
  // An fp8 cache is one byte per element where activations are bf16 (the GPU); the CPU's
  // float cache keeps the codes' values.
  const size_t element_bytes =
      cache.fp8 && backend.activation_dtype() == DType::BF16 ? 1 : dtype_size(backend.activation_dtype());
  const size_t cache_bytes = static_cast<size_t>(cache.num_pages * cache.page_size * width) * element_bytes;
  // A re-plan takes over the old engine's caches of this size where it gave them up, and does
  // not zero the ones it allocates: every sequence writes its slots before attention reads them
  // (GPU caches are never zeroed), and zeroing cost pp2 -> tp2 a third of a cold start on CPU
  // ranks. A cold start zeroes them: its pages are resident from the start, so the server's
  // memory does not grow as they are first written (tests/python/serve/test_load.py).
  ResidentWeightSource* resident = source.resident();
  auto cache_buffer = [&] {
    ops::BufferPtr spare = resident ? resident->take_spare(backend, cache_bytes) : nullptr;
    if (spare) return spare;
    return resident ? backend.alloc_for_overwrite(cache_bytes) : backend.alloc(cache_bytes);
  };
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) kv_cache_.push_back(cache_buffer());
  if (weights_->mtp) {
    mtp_kv_cache_ = cache_buffer();
    // Two rows per cache slot (ForwardBatch::mtp_hidden_rows): the main model's, the MTP layer's.
    const auto slots = static_cast<size_t>(cache.num_pages * cache.page_size);
    mtp_hidden_store_ =
        backend.alloc(2 * slots * static_cast<size_t>(config.hidden_size) * dtype_size(backend.activation_dtype()));
  }
  backend.synchronize();
  // Candidates per row and vocab part of a kCandidates draw (fewer when the part is smaller).
  candidates_per_slice_ = std::min(sample::kCandidatesPerSlice, shard_.vocab.size() / parts_);
  graphs_ = std::make_unique<GraphCache>(backend);
  workspace_ = std::make_unique<Workspace>(WorkspaceDims{.config = config_,
                                                         .shard = shard_,
                                                         .parts = parts_,
                                                         .attn_tp = plan_.attn_tp,
                                                         .head_tp = groups_.attn_tp ? groups_.attn_tp->size() : 1,
                                                         .reduction_plan = reduction_plan_on(),
                                                         .candidates_per_slice = candidates_per_slice_,
                                                         .mtp = weights_->mtp != nullptr},
                                           backend, *graphs_);
  head_ = std::make_unique<LmHead>(
      LmHeadParams{.config = config_, .shard = shard_, .parts = parts_, .backend = backend, .weights = *weights_});
  if (plan_.attn_dp > 1)
    exchange_ = std::make_unique<comm::ExpertExchange>(
        comm::ExpertExchange::Params{.backend = backend,
                                     .group = *groups_.moe,
                                     .placement = {.ranks = stage_ranks,
                                                   .moe_tp = plan_.moe_tp,
                                                   .experts_per_group = config_.n_routed_experts / plan_.moe_ep,
                                                   .top_k = config_.num_experts_per_tok},
                                     .local_expert_begin = shard_.experts.begin,
                                     .hidden = config_.hidden_size});
}

DeepseekV3::~DeepseekV3() = default;

const WeightIndex& DeepseekV3::weight_index() const { return weights_->index; }

int64_t DeepseekV3::graphs_captured() const { return graphs_->size(); }

sample::SamplerParams DeepseekV3::sampler_params() const {
  return {.backend = backend_,
          .attn_tp = groups_.attn_tp,
          .vocab_size = config_.vocab_size,
          .vocab_begin = shard_.vocab.begin,
          .vocab_local = shard_.vocab.size(),
          .parts = parts_,
          .vocab_slices = parts_ * plan_.attn_tp,
          .candidates_per_slice = candidates_per_slice_};
}

std::vector<ops::Buffer*> DeepseekV3::kv_caches() {
  std::vector<ops::Buffer*> out;
  for (auto& b : kv_cache_) out.push_back(b.get());
  return out;
}

std::vector<ops::BufferPtr> DeepseekV3::release_kv_caches() {
  std::vector<ops::BufferPtr> out = std::move(kv_cache_);
  kv_cache_.clear();
  if (mtp_kv_cache_) out.push_back(std::move(mtp_kv_cache_));
  return out;
}

void DeepseekV3::record_routing(int64_t moe_layer, const int32_t* ids, size_t count) {
  if (static_cast<int64_t>(last_routing_.size()) <= moe_layer) last_routing_.resize(static_cast<size_t>(moe_layer + 1));
  last_routing_[moe_layer].insert(last_routing_[moe_layer].end(), ids, ids + count);
}

ops::Buffer& DeepseekV3::hidden_states(int64_t tokens) { return *workspace_->of(tokens).hidden; }

sample::SamplerBuffers DeepseekV3::forward(const ForwardBatch& batch, sample::Sampler* sampler) {
  const int64_t T = batch.num_tokens(), rows = static_cast<int64_t>(batch.logit_rows.size());
  check_forward_batch(batch, {.config = config_,
                              .cache = cache_shape_,
                              .first_stage = shard_.first_stage,
                              .last_stage = shard_.last_stage,
                              .mtp_layer = weights_->mtp != nullptr});
  if (batch.mtp_draft && !shard_.last_stage) return {};  // a draft step runs on the last stage only
  Activations& a = workspace_->prepare(batch);

  // Decode-shaped steps (one logit row per token, in order, no host work inside) and MTP draft
  // steps (padded by their drafter to few shapes, runtime/mtp_drafter.h) replay a graph; prompt
  // chunks and the MTP head of `eval-ppl` run eagerly.
  bool decode_shaped = rows == T && batch.mtp_tokens.empty();
  for (int64_t r = 0; decode_shaped && r < rows; ++r) decode_shaped = batch.logit_rows[r] == r;
  run_step(a, batch, sampler, (decode_shaped || batch.mtp_draft) && replays_graphs() && T > 0);
  if (!shard_.last_stage) {
    backend_.synchronize();
    return {};
  }
  return workspace_->sampler_buffers(a);
}

void DeepseekV3::run_step(Activations& a, const ForwardBatch& batch, sample::Sampler* sampler, bool graphed) {
  GraphCache::Key key{.tokens = a.tokens,
                      .logit_rows = static_cast<int64_t>(batch.logit_rows.size()),
                      .max_pages_per_seq = batch.max_pages_per_seq,
                      .mtp_draft = batch.mtp_draft,
                      .draw = batch.draw,
                      .logit_adjust = !batch.logit_adjust.empty()};
  auto part = [&](GraphCache::Part p, const std::function<void()>& work) {
    key.part = p;
    if (graphed) {
      graphs_->run(key, work);
    } else {
      work();
    }
  };
  if (!shard_.last_stage || !batch.token_bitmask) {
    part(GraphCache::Part::kWhole, [&] {
      run(a, batch);
      draw(a, batch, sampler);
    });
    return;
  }
  part(GraphCache::Part::kForward, [&] { run(a, batch); });
  workspace_->upload_token_bitmask(a, *batch.token_bitmask);  // the device runs the forward meanwhile
  part(GraphCache::Part::kDraw, [&] { draw(a, batch, sampler); });
}

void DeepseekV3::draw(Activations& a, const ForwardBatch& batch, sample::Sampler* sampler) {
  if (!shard_.last_stage) return;
  const auto logit_rows = static_cast<int64_t>(batch.logit_rows.size());
  if (batch.token_bitmask) sampler->apply_token_bitmask(workspace_->sampler_buffers(a), logit_rows);
  sampler->reduce(workspace_->sampler_buffers(a), logit_rows, batch.draw);
}

void DeepseekV3::run(Activations& a, const ForwardBatch& batch) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  const std::vector<std::unique_ptr<LayerWeights>>& layers = weights_->layers;
  if (batch.mtp_draft) return mtp_draft(a, batch);
  if (shard_.first_stage) embed(a);
  int64_t moe_layer = 0;
  // normed [T, hidden] = input_norm(hidden) for the first layer; after that, every residual
  // add is fused with the norm that follows it (the next branch's input). The stage's last
  // add stands alone: the next stage, or the head (on the selected rows), normalises.
  if (!layers.empty())
    backend_.rms_norm({ptr(a.hidden), ptr(layers[0]->input_norm), ptr(a.normed), T, hidden, hidden, hidden,
                       static_cast<float>(config_.rms_norm_eps)});
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& layer = *layers[i];
    decoder_layer(layer, *kv_cache_[i], layer.is_moe ? moe_layer++ : -1, a, batch.max_pages_per_seq,
                  i + 1 < layers.size() ? ptr(layers[i + 1]->input_norm) : nullptr);
  }
  if (!shard_.last_stage) return;
  const bool mtp_head = !batch.mtp_tokens.empty();
  if (weights_->mtp) store_hidden(a, weights_->final_norm, 0);  // a later draft step's input
  if (mtp_head) mtp(a, batch.max_pages_per_seq, /*normed_ready=*/false);
  head_->run(a, static_cast<int64_t>(batch.logit_rows.size()), mtp_head ? ptr(weights_->mtp->head_norm) : nullptr);
}

void DeepseekV3::decoder_layer(const LayerWeights& layer, ops::Buffer& cache, int64_t moe_layer, Activations& a,
                               int64_t max_pages_per_seq, const void* next_norm) {
  add_branch(attention(layer, cache, a, max_pages_per_seq), a, ptr(layer.post_attention_norm));
  const BranchSum mlp = layer.is_moe ? moe(layer, moe_layer, a) : dense_mlp(layer, a);
  add_branch(mlp, a, next_norm);
}

void DeepseekV3::embed(Activations& a) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  // hidden [T, hidden]: each attention-TP rank embeds its vocab rows; the sum is the embedding.
  backend_.embedding({static_cast<const int32_t*>(ptr(a.ids)), ptr(weights_->embed), ptr(a.hidden), T, hidden,
                      shard_.vocab.begin, shard_.vocab.end});
  all_reduce(groups_.attn_tp, *a.hidden, T * hidden, "embedding", backend_.activation_dtype());
}

void DeepseekV3::add_branch(const BranchSum& sum, Activations& a, const void* norm_weight) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const void* branch = ptr(a.branch);  // [T, hidden] fp32
  if (reduction_plan_on()) {
    // The parts' tree, then the residual add and norm on one rank's kernels whatever the plan.
    branch = sum_in_tree(backend_, {.group = sum.group, .site = sum.site, .parts = parts_, .hidden = hidden}, a);
  } else {
    // The fused all-reduce + add + norm where the group has one (the same bits as the ops below).
    comm::FusedAllReduceNorm* fused = sum.group != nullptr ? comm::fused_all_reduce_norm(*sum.group) : nullptr;
    if (fused != nullptr && norm_weight != nullptr && sum.group->size() > 1 && T > 0) {
      sum.group->set_site(sum.site);
      if (fused->all_reduce_add_rms_norm(static_cast<float*>(ptr(a.branch)),
                                         {ptr(a.hidden), norm_weight, ptr(a.normed), T, hidden, eps}))
        return;
    }
    all_reduce(sum.group, *a.branch, T * hidden, sum.site, DType::F32);
  }
  if (norm_weight == nullptr) {
    backend_.add({ptr(a.hidden), branch, T * hidden, /*x_f32=*/true});
  } else {
    backend_.add_rms_norm({ptr(a.hidden), branch, norm_weight, ptr(a.normed), T, hidden, eps, /*x_f32=*/true});
  }
}

void* DeepseekV3::branch_part(Activations& a, int v) const {
  return bytes(a.branch) + static_cast<int64_t>(v) * a.tokens * config_.hidden_size * 4;
}
DeepseekV3::BranchSum DeepseekV3::attention(const LayerWeights& layer, ops::Buffer& cache, Activations& a,
                                            int64_t max_pages_per_seq) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  const int64_t rope = c.qk_rope_head_dim, latent = c.kv_lora_rank, width = latent + rope;
  const size_t act = dtype_size(backend_.activation_dtype());
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The cache entry (kv path) is computed on the side stream beside the q path: two chains of
  // short kernels whose launch and ramp latencies overlap. Both end before attention.
  // kv [T, latent + rope] becomes the cache entry in place: norm(kv[:, :latent]), rope(kv[:, latent:]).
  backend_.side_begin();
  backend_.linear(linear_params(ptr(a.normed), layer.kv_a_proj, ptr(a.kv), T, hidden, width));
  backend_.rms_norm({ptr(a.kv), ptr(layer.kv_a_norm), ptr(a.kv), T, latent, width, width, eps});
  backend_.rope({bytes(a.kv) + latent * act, static_cast<const int32_t*>(ptr(a.positions)),
                 static_cast<const float*>(ptr(weights_->inv_freq)), T, 1, width, width, rope,
                 static_cast<float>(c.rope_attention_factor()), c.rope_interleave});
  backend_.kv_write({ptr(a.kv), static_cast<const int32_t*>(ptr(a.slots)), cache.data(), T, width, cache_shape_.fp8,
                     cache_shape_.fp8_scale});
  backend_.side_end();

  if (c.q_lora_rank > 0) {  // q_a [T, q_lora] path: replicated, once for every part
    backend_.linear(linear_params(ptr(a.normed), layer.q_a_proj, ptr(a.q_a), T, hidden, c.q_lora_rank));
    backend_.rms_norm(
        {ptr(a.q_a), ptr(layer.q_a_norm), ptr(a.q_a_normed), T, c.q_lora_rank, c.q_lora_rank, c.q_lora_rank, eps});
  }
  for (int v = 0; v < parts_; ++v) attention_part(layer.parts[v], v, cache, a, max_pages_per_seq);
  return {groups_.attn_tp, "attention"};
}

void DeepseekV3::attention_part(const LayerPart& part, int v, ops::Buffer& cache, Activations& a,
                                int64_t max_pages_per_seq) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  const int64_t heads = shard_.heads.size() / parts_;  // per part
  const int64_t qk = c.qk_head_dim(), nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, latent = c.kv_lora_rank;
  const auto* positions = static_cast<const int32_t*>(ptr(a.positions));
  // q: [T, heads, qk] = (q LoRA ? q_b(norm(q_a(x))) : q_proj(x)) for this part's heads.
  if (c.q_lora_rank > 0) {
    backend_.linear(linear_params(ptr(a.q_a_normed), part.q_b_proj, ptr(a.q), T, c.q_lora_rank, heads * qk));
  } else {
    backend_.linear(linear_params(ptr(a.normed), part.q_proj, ptr(a.q), T, hidden, heads * qk));
  }
  backend_.rope({bytes(a.q) + nope * dtype_size(backend_.activation_dtype()), positions,
                 static_cast<const float*>(ptr(weights_->inv_freq)), T, heads, heads * qk, qk, rope,
                 static_cast<float>(c.rope_attention_factor()), c.rope_interleave});
  // Absorbed MLA: attend in the latent space, then up-project values per head.
  // q_latent [T, heads, latent]; attn_latent [T, heads, latent]; attn_v [T, heads * v].
  backend_.mla_q_absorb({ptr(a.q), ptr(part.kv_b_proj), ptr(a.q_latent), T, heads, qk, nope, c.v_head_dim, latent});
  if (v == 0) backend_.side_join();
  backend_.mla_attention({.q_latent = ptr(a.q_latent),
                          .q_rope = ptr(a.q),
                          .cache = cache.data(),
                          .block_tables = static_cast<const int32_t*>(ptr(a.block_tables)),
                          .seq_of_token = static_cast<const int32_t*>(ptr(a.seq_of_token)),
                          .positions = positions,
                          .out = ptr(a.attn_latent),
                          .tokens = T,
                          .heads = heads,
                          .latent = latent,
                          .rope = rope,
                          .q_head_stride = qk,
                          .rope_offset = nope,
                          .page_size = cache_shape_.page_size,
                          .max_pages_per_seq = max_pages_per_seq,
                          .scale = static_cast<float>(c.attention_scale()),
                          .cache_fp8 = cache_shape_.fp8,
                          .cache_scale = cache_shape_.fp8_scale});
  backend_.mla_v_up({ptr(a.attn_latent), ptr(part.kv_b_proj), ptr(a.attn_v), T, heads, nope, c.v_head_dim, latent});
  // [T, hidden] partial over this part's heads, summed over the parts and attention TP.
  ops::LinearParams o_proj =
      linear_params(ptr(a.attn_v), part.o_proj, branch_part(a, v), T, heads * c.v_head_dim, hidden);
  o_proj.y_f32 = true;
  backend_.linear(o_proj);
}

void DeepseekV3::mlp(const LinearWeight& w13, const LinearWeight& w2, int64_t inter, Activations& a, void* out,
                     bool accumulate) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  // gate_up [T, 2 * inter] -> act [T, inter] -> out [T, hidden] (+)= down(silu(gate(x)) * up(x)).
  backend_.linear(linear_params(ptr(a.normed), w13, ptr(a.gate_up), T, hidden, 2 * inter));
  backend_.silu_mul({ptr(a.gate_up), ptr(a.act), T, inter});
  ops::LinearParams down = linear_params(ptr(a.act), w2, out, T, inter, hidden);
  down.accumulate = accumulate;
  down.y_f32 = true;
  backend_.linear(down);
}

DeepseekV3::BranchSum DeepseekV3::dense_mlp(const LayerWeights& layer, Activations& a) {
  // Per part: [T, hidden] partial over this part's columns.
  for (int v = 0; v < parts_; ++v)
    mlp(layer.parts[v].mlp_w13, layer.parts[v].mlp_w2, layer.mlp_inter, a, branch_part(a, v), /*accumulate=*/false);
  return {groups_.attn_tp, "dense_mlp"};
}

void DeepseekV3::shared_experts(const LayerWeights& layer, const LayerPart& part, Activations& a, void* out,
                                bool accumulate) {
  // out [T, hidden] (+)= the shared experts over this part's columns.
  if (part.mlp_w13) mlp(part.mlp_w13, part.mlp_w2, layer.mlp_inter, a, out, accumulate);
}

DeepseekV3::BranchSum DeepseekV3::moe(const LayerWeights& layer, int64_t moe_layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens;
  if (plan_.attn_dp > 1) return moe_dispatch_combine(layer, moe_layer, a);
  // Every rank of the stage holds every token (attention TP): route locally, run the owned
  // experts' column slices, add the shared experts' column slice, one all-reduce sums all.
  // The shared experts write the branch on the side stream while the router runs; the routed
  // sum is then added to it in one fp32 addition (shared + routed, the same bits as routed +
  // shared in transformers' order). Joining later, inside the routed experts (before their
  // sum), was slower at batch 64 in the run that tried it (16.96 against 16.04 ms per step,
  // K2.6 x3 on one H200, separate runs) and no faster at batch 1.
  const LayerPart& first = layer.parts[0];
  const bool has_shared = static_cast<bool>(first.mlp_w13);
  backend_.side_begin();
  shared_experts(layer, first, a, branch_part(a, 0), /*accumulate=*/false);
  backend_.side_end();
  backend_.moe_route(route_params(c, layer, ptr(a.normed), T, a));  // topk [T, top_k]
  if (record_routing_) {
    std::vector<int32_t> ids(static_cast<size_t>(T * c.num_experts_per_tok));
    if (T) backend_.download(ids.data(), *a.topk_ids, 0, ids.size() * 4);
    record_routing(moe_layer, ids.data(), ids.size());
  }
  backend_.side_join();
  for (int v = 0; v < parts_; ++v) {
    // Part v: its shared-expert columns (part 0's ran above), then its routed columns added.
    const LayerPart& part = layer.parts[v];
    if (v > 0) shared_experts(layer, part, a, branch_part(a, v), /*accumulate=*/false);
    ops::MoeExpertsParams experts = experts_params(part,
                                                   {.x = ptr(a.normed),
                                                    .ids = static_cast<const int32_t*>(ptr(a.topk_ids)),
                                                    .weights = static_cast<const float*>(ptr(a.topk_weights)),
                                                    .out = branch_part(a, v),
                                                    .tokens = T,
                                                    .top_k = c.num_experts_per_tok},
                                                   c.hidden_size);
    experts.routed_experts = c.n_routed_experts;
    experts.out_f32 = true;
    experts.accumulate = has_shared;
    backend_.moe_experts(experts);
  }
  return {groups_.moe, "moe"};
}

// Attention DP: each replica holds its own tokens, so routed tokens travel to the ranks that
// own their experts and back (comm::ExpertExchange over the stage's MoE group):
//   1. the replica's tokens are split over its attention-TP ranks; each rank routes its share;
//   2. layout and dispatch: the rows go to every MoE-TP rank of their experts' EP groups;
//   3. each rank runs its experts (top_k = 1, weight 1) on what it received: [N, hidden];
//   4. combine: the outputs return and the sender sums them with the routing weights; the
//      shared experts are added, and (attention TP > 1) the replica's tokens re-assembled with
//      an all-reduce "moe" over its TP group (rows of other ranks are zero).
DeepseekV3::BranchSum DeepseekV3::moe_dispatch_combine(const LayerWeights& layer, int64_t moe_layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size, top_k = c.num_experts_per_tok;
  // 1. This rank's share of the replica's tokens: rows [mine.begin, mine.end) of normed.
  const Range mine = parallel::split_range(T, plan_.attn_tp, shard_.coord.tp_index);
  const int64_t n_mine = mine.size();
  const size_t act = dtype_size(backend_.activation_dtype());
  backend_.moe_route(route_params(c, layer, bytes(a.normed) + mine.begin * hidden * act, n_mine, a));
  std::vector<int32_t> topk_ids(n_mine * top_k);    // [n_mine, top_k]
  std::vector<float> topk_weights(n_mine * top_k);  // [n_mine, top_k]
  if (n_mine) {
    backend_.download(topk_ids.data(), *a.topk_ids, 0, topk_ids.size() * 4);
    backend_.download(topk_weights.data(), *a.topk_weights, 0, topk_weights.size() * 4);
  }
  if (record_routing_) record_routing(moe_layer, topk_ids.data(), topk_ids.size());

  // 2-3. received x [N, hidden] -> y [N, hidden], one expert per row, weight 1.
  comm::ExpertExchange::Handle handle = exchange_->layout(topk_ids, mine.begin);
  const comm::ExpertExchange::Received received = exchange_->dispatch(ptr(a.normed), handle);
  const LayerPart& part = layer.parts[0];  // attention DP: no reduction plan, one part
  backend_.moe_experts(experts_params(part,
                                      {.x = received.x,
                                       .ids = received.expert_ids,
                                       .weights = received.weights,
                                       .out = received.y,
                                       .tokens = received.rows,
                                       .top_k = 1},
                                      hidden));
  // 4. branch [T, hidden] fp32: the combined experts, zero outside my share, + shared experts.
  exchange_->combine(received.y, topk_weights, handle, {.out = ptr(a.branch), .rows = T, .out_f32 = true});
  shared_experts(layer, part, a, ptr(a.branch), /*accumulate=*/true);
  backend_.synchronize();  // the exchange buffers (the handle's) are freed on return
  return {groups_.attn_tp, "moe"};
}

}  // namespace moeserve
