#include "model/deepseek_v3.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "model/rope.h"

namespace moeserve {

using ops::BufferPtr;
using parallel::Range;

struct DeepseekV3::Layer {
  bool is_moe = false;
  BufferPtr input_norm, post_attention_norm;  // [hidden]
  // Attention, this rank's heads.
  BufferPtr q_proj;      // [heads_local * qk_head_dim, hidden]        (no q LoRA)
  BufferPtr q_a_proj;    // [q_lora_rank, hidden]                       (q LoRA)
  BufferPtr q_a_norm;    // [q_lora_rank]
  BufferPtr q_b_proj;    // [heads_local * qk_head_dim, q_lora_rank]
  BufferPtr kv_a_proj;   // [kv_lora_rank + rope, hidden]  (replicated: the latent is shared by all heads)
  BufferPtr kv_a_norm;   // [kv_lora_rank]
  BufferPtr kv_b_proj;   // [heads_local * (nope + v), kv_lora_rank]
  BufferPtr o_proj;      // [hidden, heads_local * v]
  // Dense MLP (first_k_dense_replace layers) or the shared experts, attention-TP columns.
  BufferPtr mlp_w13;     // [2 * inter_local, hidden]: gate rows then up rows
  BufferPtr mlp_w2;      // [hidden, inter_local]
  int64_t mlp_inter = 0;
  // Routed experts owned by this rank, MoE-TP columns.
  BufferPtr router;                      // [experts, hidden] fp32
  BufferPtr router_bias;                 // [experts] fp32
  std::vector<BufferPtr> expert_w13;     // each [2 * expert_inter_local, hidden]
  std::vector<BufferPtr> expert_w2;      // each [hidden, expert_inter_local]
  std::vector<const void*> expert_w13_ptrs, expert_w2_ptrs;
};

// Per-step buffers, sized for the batch.
struct DeepseekV3::Activations {
  int64_t tokens = 0;
  BufferPtr ids, positions, seq_of_token, slots, block_tables;  // int32 metadata
  BufferPtr hidden;     // [T, hidden] residual stream
  BufferPtr normed;     // [T, hidden]
  BufferPtr branch;     // [T, hidden] output of attention / MLP before the residual add
  BufferPtr q_a;        // [T, q_lora]
  BufferPtr q_a_normed; // [T, q_lora]
  BufferPtr q;          // [T, heads_local, qk_head_dim]
  BufferPtr kv;         // [T, latent + rope]
  BufferPtr entry;      // [T, latent + rope] normalised latent + roped key, as cached
  BufferPtr q_latent;   // [T, heads_local, latent]
  BufferPtr attn_latent;// [T, heads_local, latent]
  BufferPtr attn_v;     // [T, heads_local * v]
  BufferPtr gate_up;    // [T, 2 * max inter]
  BufferPtr act;        // [T, max inter]
  BufferPtr topk_ids;   // [T, top_k] int32
  BufferPtr topk_weights; // [T, top_k] fp32
};

namespace {

void* ptr(const BufferPtr& b) { return b ? b->data() : nullptr; }

std::string layer_prefix(const ModelConfig& c, int64_t layer) {
  return fmt::format("{}model.layers.{}.", c.tensor_prefix, layer);
}

}  // namespace

DeepseekV3::DeepseekV3(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                       ops::Backend& backend, WeightSource& source, RankGroups groups, KvCacheShape cache)
    : config_(config), plan_(plan), backend_(backend), groups_(groups), cache_shape_(cache) {
  shard_ = parallel::shard_of(plan, shard_dims(config), rank);
  const int stage_ranks = plan.ranks_per_stage();
  MS_CHECK(plan.attn_tp == 1 || (groups.attn_tp != nullptr && groups.attn_tp->size() == plan.attn_tp),
           "plan '{}' rank {}: needs an attention-TP communicator of {} ranks", plan.name, rank, plan.attn_tp);
  MS_CHECK(stage_ranks == 1 || (groups.moe != nullptr && groups.moe->size() == stage_ranks),
           "plan '{}' rank {}: needs a MoE (stage) communicator of {} ranks", plan.name, rank, stage_ranks);
  load(source);
  const int64_t width = config.kv_lora_rank + config.qk_rope_head_dim;
  const size_t cache_bytes =
      static_cast<size_t>(cache.num_pages * cache.page_size * width) * dtype_size(backend.activation_dtype());
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) kv_cache_.push_back(backend.alloc(cache_bytes));
}

DeepseekV3::~DeepseekV3() = default;

void DeepseekV3::load(WeightSource& source) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t qk = c.qk_head_dim();
  const int64_t latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const Range heads = shard_.heads;
  auto upload = [&](const Tensor& t, bool keep_f32 = false) {
    weight_bytes_ += static_cast<int64_t>(t.numel() * dtype_size(keep_f32 ? DType::F32 : backend_.activation_dtype()));
    return backend_.upload_weight(t, keep_f32);
  };
  auto read = [&](const std::string& name, const Shape& shape, Slice rows = Slice::all(), Slice cols = Slice::all()) {
    return source.read(name, shape, rows, cols);
  };
  // gate and up rows [begin, end) of an MLP stacked into one [2 * n, hidden] matrix.
  auto read_w13 = [&](const std::string& prefix, int64_t inter, Range cols) {
    Tensor gate = read(prefix + "gate_proj.weight", {inter, hidden}, {cols.begin, cols.end});
    Tensor up = read(prefix + "up_proj.weight", {inter, hidden}, {cols.begin, cols.end});
    Tensor w13(DType::F32, {2 * cols.size(), hidden});
    std::memcpy(w13.f32(), gate.f32(), gate.nbytes());
    std::memcpy(w13.f32() + gate.numel(), up.f32(), up.nbytes());
    return upload(w13);
  };
  auto read_w2 = [&](const std::string& prefix, int64_t inter, Range cols) {
    return upload(read(prefix + "down_proj.weight", {hidden, inter}, Slice::all(), {cols.begin, cols.end}));
  };

  const std::string embed_name = c.tensor_prefix + "model.embed_tokens.weight";
  const Slice vocab_rows{shard_.vocab.begin, shard_.vocab.end};
  if (shard_.first_stage) embed_ = upload(read(embed_name, {c.vocab_size, hidden}, vocab_rows));
  if (shard_.last_stage) {
    final_norm_ = upload(read(c.tensor_prefix + "model.norm.weight", {hidden}));
    const std::string head_name = c.tie_word_embeddings ? embed_name : c.tensor_prefix + "lm_head.weight";
    lm_head_ = upload(read(head_name, {c.vocab_size, hidden}, vocab_rows));
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);
  Tensor inv_freq_tensor(DType::F32, {static_cast<int64_t>(inv_freq.size())});
  std::copy(inv_freq.begin(), inv_freq.end(), inv_freq_tensor.f32());
  inv_freq_ = backend_.upload_weight(inv_freq_tensor, /*keep_f32=*/true);

  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) {
    auto layer = std::make_unique<Layer>();
    const std::string p = layer_prefix(c, l);
    layer->is_moe = c.is_moe_layer(l);
    layer->input_norm = upload(read(p + "input_layernorm.weight", {hidden}));
    layer->post_attention_norm = upload(read(p + "post_attention_layernorm.weight", {hidden}));
    const Slice q_rows{heads.begin * qk, heads.end * qk};
    if (c.q_lora_rank > 0) {
      layer->q_a_proj = upload(read(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, hidden}));
      layer->q_a_norm = upload(read(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}));
      layer->q_b_proj =
          upload(read(p + "self_attn.q_b_proj.weight", {c.num_attention_heads * qk, c.q_lora_rank}, q_rows));
    } else {
      layer->q_proj = upload(read(p + "self_attn.q_proj.weight", {c.num_attention_heads * qk, hidden}, q_rows));
    }
    layer->kv_a_proj = upload(read(p + "self_attn.kv_a_proj_with_mqa.weight", {latent + rope, hidden}));
    layer->kv_a_norm = upload(read(p + "self_attn.kv_a_layernorm.weight", {latent}));
    const int64_t kv_b_per_head = c.qk_nope_head_dim + c.v_head_dim;
    layer->kv_b_proj = upload(read(p + "self_attn.kv_b_proj.weight", {c.num_attention_heads * kv_b_per_head, latent},
                                   {heads.begin * kv_b_per_head, heads.end * kv_b_per_head}));
    layer->o_proj = upload(read(p + "self_attn.o_proj.weight", {hidden, c.num_attention_heads * c.v_head_dim},
                                Slice::all(), {heads.begin * c.v_head_dim, heads.end * c.v_head_dim}));
    if (!layer->is_moe) {
      layer->mlp_inter = shard_.dense_intermediate.size();
      layer->mlp_w13 = read_w13(p + "mlp.", c.intermediate_size, shard_.dense_intermediate);
      layer->mlp_w2 = read_w2(p + "mlp.", c.intermediate_size, shard_.dense_intermediate);
    } else {
      layer->router = upload(read(p + "mlp.gate.weight", {c.n_routed_experts, hidden}), /*keep_f32=*/true);
      layer->router_bias = upload(read(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}), true);
      if (c.n_shared_experts > 0) {
        layer->mlp_inter = shard_.shared_intermediate.size();
        layer->mlp_w13 = read_w13(p + "mlp.shared_experts.", c.shared_intermediate_size(), shard_.shared_intermediate);
        layer->mlp_w2 = read_w2(p + "mlp.shared_experts.", c.shared_intermediate_size(), shard_.shared_intermediate);
      }
      for (int64_t e = shard_.experts.begin; e < shard_.experts.end; ++e) {
        const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
        layer->expert_w13.push_back(read_w13(ep, c.moe_intermediate_size, shard_.expert_intermediate));
        layer->expert_w2.push_back(read_w2(ep, c.moe_intermediate_size, shard_.expert_intermediate));
        layer->expert_w13_ptrs.push_back(layer->expert_w13.back()->data());
        layer->expert_w2_ptrs.push_back(layer->expert_w2.back()->data());
      }
    }
    layers_.push_back(std::move(layer));
  }
}

void DeepseekV3::all_reduce(comm::Communicator* group, ops::Buffer& buffer, int64_t count, const char* site) {
  if (group == nullptr || group->size() == 1) return;
  group->set_site(site);
  group->all_reduce_sum(buffer.data(), static_cast<size_t>(count), backend_.activation_dtype());
}

Tensor DeepseekV3::forward(const ForwardBatch& batch, const Tensor* hidden_in) {
  const ModelConfig& c = config_;
  const int64_t T = batch.num_tokens();
  const int64_t hidden = c.hidden_size;
  const int64_t heads_local = shard_.heads.size();
  const size_t act = dtype_size(backend_.activation_dtype());
  MS_CHECK(static_cast<int64_t>(batch.positions.size()) == T && static_cast<int64_t>(batch.slots.size()) == T &&
               static_cast<int64_t>(batch.seq_of_token.size()) == T,
           "forward batch: tokens, positions, slots and seq_of_token must have the same length");
  for (int64_t t = 0; t < T; ++t) {
    MS_CHECK(batch.positions[t] >= 0 && batch.positions[t] < c.max_position_embeddings,
             "forward batch: position {} outside [0, max_position_embeddings={})", batch.positions[t],
             c.max_position_embeddings);
    MS_CHECK(batch.slots[t] >= 0 && batch.slots[t] < cache_shape_.num_pages * cache_shape_.page_size,
             "forward batch: cache slot {} outside the cache", batch.slots[t]);
    if (shard_.first_stage)
      MS_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.vocab_size, "token id {} outside the vocabulary [0, {})",
               batch.tokens[t], c.vocab_size);
  }

  Activations a;
  a.tokens = T;
  auto alloc = [&](int64_t elements, size_t elem) { return backend_.alloc(std::max<int64_t>(elements, 1) * elem); };
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    auto b = alloc(static_cast<int64_t>(v.size()), 4);
    if (!v.empty()) backend_.upload(*b, 0, v.data(), v.size() * 4);
    return b;
  };
  a.ids = upload_i32(batch.tokens);
  a.positions = upload_i32(batch.positions);
  a.seq_of_token = upload_i32(batch.seq_of_token);
  a.slots = upload_i32(batch.slots);
  a.block_tables = upload_i32(batch.block_tables);
  const int64_t latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t max_inter =
      std::max({shard_.dense_intermediate.size(), shard_.shared_intermediate.size(), shard_.expert_intermediate.size()});
  a.hidden = alloc(T * hidden, act);
  a.normed = alloc(T * hidden, act);
  a.branch = alloc(T * hidden, act);
  a.q_a = alloc(T * c.q_lora_rank, act);
  a.q_a_normed = alloc(T * c.q_lora_rank, act);
  a.q = alloc(T * heads_local * c.qk_head_dim(), act);
  a.kv = alloc(T * (latent + rope), act);
  a.entry = alloc(T * (latent + rope), act);
  a.q_latent = alloc(T * heads_local * latent, act);
  a.attn_latent = alloc(T * heads_local * latent, act);
  a.attn_v = alloc(T * heads_local * c.v_head_dim, act);
  a.gate_up = alloc(T * 2 * max_inter, act);
  a.act = alloc(T * max_inter, act);
  a.topk_ids = alloc(T * c.num_experts_per_tok, 4);
  a.topk_weights = alloc(T * c.num_experts_per_tok, 4);

  if (shard_.first_stage) {
    // [T, hidden]: each attention-TP rank embeds its vocab rows; the sum is the embedding.
    backend_.embedding({static_cast<const int32_t*>(ptr(a.ids)), ptr(embed_), ptr(a.hidden), T, hidden,
                        shard_.vocab.begin, shard_.vocab.end});
    all_reduce(groups_.attn_tp, *a.hidden, T * hidden, "embedding");
  } else {
    MS_CHECK(hidden_in != nullptr && hidden_in->numel() == T * hidden,
             "pipeline stage {} needs the previous stage's hidden states [{}, {}]", shard_.coord.stage, T, hidden);
    backend_.upload(*a.hidden, 0, hidden_in->raw(), hidden_in->nbytes());
  }

  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    backend_.rms_norm({ptr(a.hidden), ptr(layer.input_norm), ptr(a.normed), T, hidden, hidden, hidden,
                       static_cast<float>(c.rms_norm_eps)});
    attention(layer, static_cast<int64_t>(i), a, batch);
    backend_.add({ptr(a.hidden), ptr(a.branch), T * hidden});
    backend_.rms_norm({ptr(a.hidden), ptr(layer.post_attention_norm), ptr(a.normed), T, hidden, hidden, hidden,
                       static_cast<float>(c.rms_norm_eps)});
    if (layer.is_moe) {
      moe(layer, a);
    } else {
      dense_mlp(layer, a);
    }
    backend_.add({ptr(a.hidden), ptr(a.branch), T * hidden});
  }

  if (!shard_.last_stage) {
    Tensor out(backend_.activation_dtype(), {T, hidden});
    backend_.download(out.raw(), *a.hidden, 0, out.nbytes());
    return out;
  }

  // Logits of the requested rows: gather rows, final norm, vocab-parallel head, gather vocab.
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
  const int64_t vocab_local = shard_.vocab.size();
  auto selected = alloc(rows * hidden, act);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = batch.logit_rows[r];
    MS_CHECK(t >= 0 && t < T, "logit row {} outside the batch of {} tokens", t, T);
    backend_.rms_norm({static_cast<std::byte*>(ptr(a.hidden)) + t * hidden * act, ptr(final_norm_),
                       static_cast<std::byte*>(selected->data()) + r * hidden * act, 1, hidden, hidden, hidden,
                       static_cast<float>(c.rms_norm_eps)});
  }
  auto local_logits = alloc(rows * vocab_local, 4);
  ops::LinearParams head{selected->data(), ptr(lm_head_), local_logits->data(), rows, hidden, vocab_local,
                         hidden, vocab_local};
  head.y_f32 = true;
  backend_.linear(head);
  Tensor logits(DType::F32, {rows, c.vocab_size});
  const int tp = groups_.attn_tp ? groups_.attn_tp->size() : 1;
  if (tp == 1) {
    backend_.download(logits.raw(), *local_logits, 0, logits.nbytes());
    return logits;
  }
  // [tp, rows, vocab_local] -> [rows, vocab]; the plan guarantees vocab % tp == 0.
  auto gathered = alloc(tp * rows * vocab_local, 4);
  groups_.attn_tp->set_site("lm_head");
  groups_.attn_tp->all_gather(local_logits->data(), gathered->data(), static_cast<size_t>(rows * vocab_local),
                              DType::F32);
  Tensor host(DType::F32, {tp, rows, vocab_local});
  backend_.download(host.raw(), *gathered, 0, host.nbytes());
  for (int r = 0; r < tp; ++r)
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(logits.f32() + row * c.vocab_size + r * vocab_local, host.f32() + (r * rows + row) * vocab_local,
                  vocab_local * sizeof(float));
  return logits;
}

void DeepseekV3::attention(const Layer& layer, int64_t local_layer, Activations& a, const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  const int64_t heads = shard_.heads.size();
  const int64_t qk = c.qk_head_dim(), nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t latent = c.kv_lora_rank, width = latent + rope;
  const size_t act = dtype_size(backend_.activation_dtype());
  const float eps = static_cast<float>(c.rms_norm_eps);

  // q: [T, heads, qk] = (q LoRA ? q_b(norm(q_a(x))) : q_proj(x))
  if (c.q_lora_rank > 0) {
    backend_.linear({ptr(a.normed), ptr(layer.q_a_proj), ptr(a.q_a), T, hidden, c.q_lora_rank, hidden, c.q_lora_rank});
    backend_.rms_norm({ptr(a.q_a), ptr(layer.q_a_norm), ptr(a.q_a_normed), T, c.q_lora_rank, c.q_lora_rank,
                       c.q_lora_rank, eps});
    backend_.linear({ptr(a.q_a_normed), ptr(layer.q_b_proj), ptr(a.q), T, c.q_lora_rank, heads * qk, c.q_lora_rank,
                     heads * qk});
  } else {
    backend_.linear({ptr(a.normed), ptr(layer.q_proj), ptr(a.q), T, hidden, heads * qk, hidden, heads * qk});
  }
  // kv: [T, latent + rope] -> entry = [norm(kv[:, :latent]), rope(kv[:, latent:])]
  backend_.linear({ptr(a.normed), ptr(layer.kv_a_proj), ptr(a.kv), T, hidden, width, hidden, width});
  backend_.rms_norm({ptr(a.kv), ptr(layer.kv_a_norm), ptr(a.entry), T, latent, width, width, eps});
  for (int64_t t = 0; t < T; ++t)  // copy the rope part of each row (strided)
    std::memcpy(static_cast<std::byte*>(ptr(a.entry)) + (t * width + latent) * act,
                static_cast<std::byte*>(ptr(a.kv)) + (t * width + latent) * act, rope * act);
  const auto* positions = static_cast<const int32_t*>(ptr(a.positions));
  const auto* inv_freq = static_cast<const float*>(ptr(inv_freq_));
  const float attention_factor = static_cast<float>(c.rope_attention_factor());
  backend_.rope({static_cast<std::byte*>(ptr(a.q)) + nope * act, positions, inv_freq, T, heads, heads * qk, qk, rope,
                 attention_factor, c.rope_interleave});
  backend_.rope({static_cast<std::byte*>(ptr(a.entry)) + latent * act, positions, inv_freq, T, 1, width, width,
                 rope, attention_factor, c.rope_interleave});
  ops::Buffer& cache = *kv_cache_[local_layer];
  backend_.kv_write({ptr(a.entry), static_cast<const int32_t*>(ptr(a.slots)), cache.data(), T, width});

  // Absorbed MLA: attend in the latent space, then up-project values per head.
  backend_.mla_q_absorb({ptr(a.q), ptr(layer.kv_b_proj), ptr(a.q_latent), T, heads, qk, nope, c.v_head_dim, latent});
  ops::MlaAttentionParams attn{};
  attn.q_latent = ptr(a.q_latent);
  attn.q_rope = ptr(a.q);
  attn.cache = cache.data();
  attn.block_tables = static_cast<const int32_t*>(ptr(a.block_tables));
  attn.seq_of_token = static_cast<const int32_t*>(ptr(a.seq_of_token));
  attn.positions = positions;
  attn.out = ptr(a.attn_latent);
  attn.tokens = T;
  attn.heads = heads;
  attn.latent = latent;
  attn.rope = rope;
  attn.q_head_stride = qk;
  attn.rope_offset = nope;
  attn.page_size = cache_shape_.page_size;
  attn.max_pages_per_seq = batch.max_pages_per_seq;
  attn.scale = static_cast<float>(c.attention_scale());
  backend_.mla_attention(attn);
  backend_.mla_v_up({ptr(a.attn_latent), ptr(layer.kv_b_proj), ptr(a.attn_v), T, heads, nope, c.v_head_dim, latent});
  // [T, hidden] partial over this rank's heads, summed over attention TP.
  backend_.linear({ptr(a.attn_v), ptr(layer.o_proj), ptr(a.branch), T, heads * c.v_head_dim, hidden,
                   heads * c.v_head_dim, hidden});
  all_reduce(groups_.attn_tp, *a.branch, T * hidden, "attention");
}

void DeepseekV3::dense_mlp(const Layer& layer, Activations& a) {
  const int64_t T = a.tokens, hidden = config_.hidden_size, inter = layer.mlp_inter;
  // [T, 2 * inter] -> [T, inter] -> [T, hidden] partial over this rank's columns.
  backend_.linear({ptr(a.normed), ptr(layer.mlp_w13), ptr(a.gate_up), T, hidden, 2 * inter, hidden, 2 * inter});
  backend_.silu_mul({ptr(a.gate_up), ptr(a.act), T, inter});
  backend_.linear({ptr(a.act), ptr(layer.mlp_w2), ptr(a.branch), T, inter, hidden, inter, hidden});
  all_reduce(groups_.attn_tp, *a.branch, T * hidden, "dense_mlp");
}

void DeepseekV3::shared_experts(const Layer& layer, Activations& a) {
  if (!layer.mlp_w13) return;
  const int64_t T = a.tokens, hidden = config_.hidden_size, inter = layer.mlp_inter;
  // branch [T, hidden] += down(silu(gate(x)) * up(x)) over this rank's shared-expert columns.
  backend_.linear({ptr(a.normed), ptr(layer.mlp_w13), ptr(a.gate_up), T, hidden, 2 * inter, hidden, 2 * inter});
  backend_.silu_mul({ptr(a.gate_up), ptr(a.act), T, inter});
  ops::LinearParams down{ptr(a.act), ptr(layer.mlp_w2), ptr(a.branch), T, inter, hidden, inter, hidden};
  down.accumulate = true;
  backend_.linear(down);
}

void DeepseekV3::moe(const Layer& layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  if (plan_.attn_dp > 1) {
    moe_dispatch_combine(layer, a);
    return;
  }
  // Every rank of the stage holds every token (attention TP): route locally, run the owned
  // experts' column slices, add the shared experts' column slice, one all-reduce sums all.
  ops::MoeRouteParams route{ptr(a.normed), static_cast<const float*>(ptr(layer.router)),
                            static_cast<const float*>(ptr(layer.router_bias)), static_cast<int32_t*>(ptr(a.topk_ids)),
                            static_cast<float*>(ptr(a.topk_weights)), T, hidden, c.n_routed_experts, c.n_group,
                            c.topk_group, c.num_experts_per_tok, c.norm_topk_prob,
                            static_cast<float>(c.routed_scaling_factor)};
  backend_.moe_route(route);
  ops::MoeExpertsParams experts{};
  experts.x = ptr(a.normed);
  experts.topk_ids = static_cast<const int32_t*>(ptr(a.topk_ids));
  experts.topk_weights = static_cast<const float*>(ptr(a.topk_weights));
  experts.w13 = layer.expert_w13_ptrs.data();
  experts.w2 = layer.expert_w2_ptrs.data();
  experts.out = ptr(a.branch);
  experts.tokens = T;
  experts.top_k = c.num_experts_per_tok;
  experts.hidden = hidden;
  experts.inter = shard_.expert_intermediate.size();
  experts.expert_begin = shard_.experts.begin;
  experts.expert_end = shard_.experts.end;
  backend_.moe_experts(experts);
  shared_experts(layer, a);
  all_reduce(groups_.moe, *a.branch, T * hidden, "moe");
}

// Attention DP: each replica holds its own tokens, so routed tokens travel to the ranks that
// own their experts and back (DeepEP-style dispatch / combine over the stage's MoE group):
//   1. the replica's tokens are split over its attention-TP ranks; each rank routes its share;
//   2. all_to_all_v "moe_counts": [ranks, experts_per_group] int32 row counts per (rank, expert);
//   3. all_to_all_v "moe_dispatch": the rows, ordered by (destination, expert, token, k); a row
//      goes to every MoE-TP rank of its expert's EP group;
//   4. each rank runs its experts (top_k = 1, weight 1) on what it received: [N, hidden];
//   5. all_to_all_v "moe_combine": the outputs return in the order they were sent;
//   6. the sender sums them in a fixed order (k, then MoE-TP index) with the routing weights,
//      adds the shared experts, and (attention TP > 1) re-assembles the replica's tokens with
//      an all-reduce "moe" over its TP group (rows of other ranks are zero).
void DeepseekV3::moe_dispatch_combine(const Layer& layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size, top_k = c.num_experts_per_tok;
  const int ranks = plan_.ranks_per_stage();
  const int moe_tp = plan_.moe_tp;
  const int64_t experts_per_group = c.n_routed_experts / plan_.moe_ep;
  const DType act_dtype = backend_.activation_dtype();
  const size_t act = dtype_size(act_dtype);
  comm::Communicator& moe = *groups_.moe;
  MS_CHECK(act_dtype == DType::F32, "plan '{}': dispatch/combine on backend '{}' combines on the host and needs fp32 "
           "activations", plan_.name, backend_.name());

  // 1. This rank's share of the replica's tokens: rows [mine.begin, mine.end) of normed.
  const Range mine = parallel::split_range(T, plan_.attn_tp, shard_.coord.tp_index);
  const int64_t n_mine = mine.size();
  std::byte* normed = static_cast<std::byte*>(ptr(a.normed));
  ops::MoeRouteParams route{normed + mine.begin * hidden * act, static_cast<const float*>(ptr(layer.router)),
                            static_cast<const float*>(ptr(layer.router_bias)), static_cast<int32_t*>(ptr(a.topk_ids)),
                            static_cast<float*>(ptr(a.topk_weights)), n_mine, hidden, c.n_routed_experts, c.n_group,
                            c.topk_group, top_k, c.norm_topk_prob, static_cast<float>(c.routed_scaling_factor)};
  backend_.moe_route(route);
  std::vector<int32_t> topk_ids(n_mine * top_k);        // [n_mine, top_k]
  std::vector<float> topk_weights(n_mine * top_k);      // [n_mine, top_k]
  if (n_mine) {
    backend_.download(topk_ids.data(), *a.topk_ids, 0, topk_ids.size() * 4);
    backend_.download(topk_weights.data(), *a.topk_weights, 0, topk_weights.size() * 4);
  }

  // (token, k) pairs per expert, in token then k order.
  std::vector<std::vector<int64_t>> by_expert(c.n_routed_experts);  // entries: i * top_k + k
  for (int64_t i = 0; i < n_mine; ++i)
    for (int64_t k = 0; k < top_k; ++k) by_expert[topk_ids[i * top_k + k]].push_back(i * top_k + k);

  // 2. Row counts per (destination rank, expert of its group); where each (i, k, j) row sits.
  std::vector<int32_t> send_expert_counts(ranks * experts_per_group);   // [ranks, experts_per_group]
  std::vector<size_t> send_rows(ranks, 0);
  std::vector<int64_t> row_order;                                       // sent row -> i * top_k + k
  std::vector<int64_t> position(n_mine * top_k * moe_tp);               // (i * top_k + k) * moe_tp + j -> sent row
  for (int dest = 0; dest < ranks; ++dest) {
    const int64_t group = dest / moe_tp, j = dest % moe_tp;
    for (int64_t le = 0; le < experts_per_group; ++le) {
      const auto& rows = by_expert[group * experts_per_group + le];
      send_expert_counts[dest * experts_per_group + le] = static_cast<int32_t>(rows.size());
      send_rows[dest] += rows.size();
      for (int64_t ik : rows) {
        position[ik * moe_tp + j] = static_cast<int64_t>(row_order.size());
        row_order.push_back(ik);
      }
    }
  }
  std::vector<int32_t> recv_expert_counts(ranks * experts_per_group);  // [ranks (source), experts_per_group]
  const std::vector<size_t> count_blocks(ranks, static_cast<size_t>(experts_per_group));
  moe.set_site("moe_counts");
  moe.all_to_all_v(send_expert_counts.data(), count_blocks, recv_expert_counts.data(), count_blocks, DType::I32);
  std::vector<size_t> recv_rows(ranks, 0);
  for (int src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < experts_per_group; ++le) recv_rows[src] += recv_expert_counts[src * experts_per_group + le];

  // 3. Dispatch the rows: send [sent, hidden] gathered from normed.
  const int64_t sent = static_cast<int64_t>(row_order.size());
  int64_t received = 0;
  for (size_t n : recv_rows) received += static_cast<int64_t>(n);
  auto alloc = [&](int64_t elements, size_t elem) { return backend_.alloc(std::max<int64_t>(elements, 1) * elem); };
  BufferPtr send_x = alloc(sent * hidden, act);      // [sent, hidden]
  BufferPtr recv_x = alloc(received * hidden, act);  // [received, hidden]
  for (int64_t r = 0; r < sent; ++r)
    std::memcpy(static_cast<std::byte*>(send_x->data()) + r * hidden * act,
                normed + (mine.begin + row_order[r] / top_k) * hidden * act, hidden * act);
  auto scaled = [&](const std::vector<size_t>& rows) {
    std::vector<size_t> out(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * static_cast<size_t>(hidden);
    return out;
  };
  moe.set_site("moe_dispatch");
  moe.all_to_all_v(send_x->data(), scaled(send_rows), recv_x->data(), scaled(recv_rows), act_dtype);

  // 4. Run the owned experts on the received rows, one expert per row, weight 1.
  std::vector<int32_t> recv_ids;  // [received]
  for (int src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < experts_per_group; ++le)
      recv_ids.insert(recv_ids.end(), recv_expert_counts[src * experts_per_group + le],
                      static_cast<int32_t>(shard_.experts.begin + le));
  const std::vector<float> ones(received, 1.0f);
  BufferPtr ids_buffer = alloc(received, 4), ones_buffer = alloc(received, 4);
  if (received) {
    backend_.upload(*ids_buffer, 0, recv_ids.data(), recv_ids.size() * 4);
    backend_.upload(*ones_buffer, 0, ones.data(), ones.size() * 4);
  }
  BufferPtr expert_out = alloc(received * hidden, act);  // [received, hidden]
  ops::MoeExpertsParams experts{};
  experts.x = recv_x->data();
  experts.topk_ids = static_cast<const int32_t*>(ids_buffer->data());
  experts.topk_weights = static_cast<const float*>(ones_buffer->data());
  experts.w13 = layer.expert_w13_ptrs.data();
  experts.w2 = layer.expert_w2_ptrs.data();
  experts.out = expert_out->data();
  experts.tokens = received;
  experts.top_k = 1;
  experts.hidden = hidden;
  experts.inter = shard_.expert_intermediate.size();
  experts.expert_begin = shard_.experts.begin;
  experts.expert_end = shard_.experts.end;
  backend_.moe_experts(experts);

  // 5. Combine: the outputs travel back; [sent, hidden] in the order the rows were sent.
  BufferPtr combined = alloc(sent * hidden, act);
  moe.set_site("moe_combine");
  moe.all_to_all_v(expert_out->data(), scaled(recv_rows), combined->data(), scaled(send_rows), act_dtype);

  // 6. branch[t] = sum over k (then MoE-TP j) of weight[t, k] * output; zero outside my share.
  Tensor partial(DType::F32, {T, hidden});  // zero-filled
  std::vector<float> outputs(sent * hidden);
  if (sent) backend_.download(outputs.data(), *combined, 0, outputs.size() * sizeof(float));
  for (int64_t i = 0; i < n_mine; ++i) {
    float* out = partial.f32() + (mine.begin + i) * hidden;
    for (int64_t k = 0; k < top_k; ++k) {
      const float w = topk_weights[i * top_k + k];
      for (int j = 0; j < moe_tp; ++j) {
        const float* row = outputs.data() + position[(i * top_k + k) * moe_tp + j] * hidden;
        for (int64_t n = 0; n < hidden; ++n) out[n] += w * row[n];
      }
    }
  }
  if (T) backend_.upload(*a.branch, 0, partial.raw(), partial.nbytes());
  shared_experts(layer, a);
  all_reduce(groups_.attn_tp, *a.branch, T * hidden, "moe");
}

}  // namespace moeserve
