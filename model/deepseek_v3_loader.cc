#include "model/deepseek_v3_loader.h"

#include <algorithm>

#include "core/error.h"
#include "model/rope.h"

namespace moeserve {
namespace {

using ops::BufferPtr;
using parallel::Range;

class WeightLoader {
 public:
  explicit WeightLoader(const WeightLoadParams& p)
      : p_(p), c_(p.config), shard_(p.shard), backend_(p.backend), weight_dtype_(p.backend.activation_dtype()) {}

  ModelWeights load() {
    load_ends();
    const std::vector<float> inv_freq = rope_inv_freq(c_);
    Tensor inv_freq_tensor(DType::F32, {static_cast<int64_t>(inv_freq.size())});
    std::copy(inv_freq.begin(), inv_freq.end(), inv_freq_tensor.f32());
    out_.inv_freq = backend_.upload_weight(inv_freq_tensor, /*keep_f32=*/true);
    for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) out_.layers.push_back(load_layer(l));
    return std::move(out_);
  }

 private:
  // Rows x cols of tensor `name` (full shape `shape`) into `dst` at element `offset`:
  // generated in place for synthetic sources, read and uploaded otherwise.
  void place(ops::Buffer& dst, int64_t offset, const std::string& name, const Shape& shape, Slice rows, Slice cols,
             bool keep_f32) {
    const int64_t full_rows = shape[0], full_cols = shape.size() == 2 ? shape[1] : 1;
    const Range r{rows.begin, rows.end < 0 ? full_rows : rows.end};
    const Range k{cols.begin, cols.end < 0 ? full_cols : cols.end};
    const size_t elem = keep_f32 ? 4 : dtype_size(weight_dtype_);
    SyntheticRecipe recipe;
    if (p_.source.synthetic_recipe(name, shape, &recipe)) {
      ops::FillUniformParams fill{static_cast<std::byte*>(dst.data()) + offset * elem,
                                  r.size(),
                                  k.size(),
                                  full_cols,
                                  r.begin,
                                  k.begin,
                                  recipe.seed,
                                  recipe.offset,
                                  recipe.amplitude};
      fill.out_f32 = keep_f32;
      backend_.fill_uniform(fill);
      return;
    }
    backend_.upload_weight_into(dst, static_cast<size_t>(offset) * elem, p_.source.read(name, shape, rows, cols),
                                keep_f32);
  }
  // A new buffer holding rows x cols of tensor `name`.
  BufferPtr load_tensor(const std::string& name, const Shape& shape, Slice rows = Slice::all(),
                        Slice cols = Slice::all(), bool keep_f32 = false) {
    const int64_t n_rows = (rows.end < 0 ? shape[0] : rows.end) - rows.begin;
    const int64_t n_cols = shape.size() == 2 ? (cols.end < 0 ? shape[1] : cols.end) - cols.begin : 1;
    const int64_t bytes = n_rows * n_cols * static_cast<int64_t>(keep_f32 ? 4 : dtype_size(weight_dtype_));
    BufferPtr buffer = backend_.alloc(static_cast<size_t>(bytes));
    place(*buffer, 0, name, shape, rows, cols, keep_f32);
    out_.bytes += bytes;
    return buffer;
  }
  // gate and up rows `cols` of an MLP stacked into one [2 * n, hidden] matrix.
  BufferPtr load_w13(const std::string& prefix, int64_t inter, Range cols) {
    const int64_t n = cols.size(), hidden = c_.hidden_size;
    BufferPtr w13 = backend_.alloc(static_cast<size_t>(2 * n * hidden) * dtype_size(weight_dtype_));
    place(*w13, 0, prefix + "gate_proj.weight", {inter, hidden}, {cols.begin, cols.end}, Slice::all(), false);
    place(*w13, n * hidden, prefix + "up_proj.weight", {inter, hidden}, {cols.begin, cols.end}, Slice::all(), false);
    out_.bytes += 2 * n * hidden * static_cast<int64_t>(dtype_size(weight_dtype_));
    return w13;
  }
  BufferPtr load_w2(const std::string& prefix, int64_t inter, Range cols) {
    return load_tensor(prefix + "down_proj.weight", {c_.hidden_size, inter}, Slice::all(), {cols.begin, cols.end});
  }
  BufferPtr pointer_table(const std::vector<BufferPtr>& buffers) {
    std::vector<const void*> pointers;
    for (const auto& b : buffers) pointers.push_back(b->data());
    BufferPtr table = backend_.alloc(std::max<size_t>(pointers.size(), 1) * sizeof(void*));
    if (!pointers.empty()) backend_.upload(*table, 0, pointers.data(), pointers.size() * sizeof(void*));
    return table;
  }
  // Part v of a range the rank owns (the ranges divide evenly: check_reduction_plan).
  Range part_of(Range r, int v) const {
    const Range sub = parallel::split_range(r.size(), p_.parts, v);
    return Range{r.begin + sub.begin, r.begin + sub.end};
  }

  // The embedding (first stage), the final norm and the LM head's vocab parts (last stage).
  void load_ends() {
    const int64_t hidden = c_.hidden_size;
    const std::string embed_name = c_.tensor_prefix + "model.embed_tokens.weight";
    const Slice vocab_rows{shard_.vocab.begin, shard_.vocab.end};
    if (shard_.first_stage) out_.embed = load_tensor(embed_name, {c_.vocab_size, hidden}, vocab_rows);
    if (!shard_.last_stage) return;
    out_.final_norm = load_tensor(c_.tensor_prefix + "model.norm.weight", {hidden});
    const std::string head_name = c_.tie_word_embeddings ? embed_name : c_.tensor_prefix + "lm_head.weight";
    for (int v = 0; v < p_.parts; ++v) {
      const Range rows = part_of(shard_.vocab, v);
      out_.lm_head.push_back(load_tensor(head_name, {c_.vocab_size, hidden}, {rows.begin, rows.end}));
    }
  }

  std::unique_ptr<LayerWeights> load_layer(int64_t l) {
    const int64_t hidden = c_.hidden_size, latent = c_.kv_lora_rank, rope = c_.qk_rope_head_dim;
    auto layer = std::make_unique<LayerWeights>();
    const std::string p = fmt::format("{}model.layers.{}.", c_.tensor_prefix, l);
    layer->is_moe = c_.is_moe_layer(l);
    layer->input_norm = load_tensor(p + "input_layernorm.weight", {hidden});
    layer->post_attention_norm = load_tensor(p + "post_attention_layernorm.weight", {hidden});
    if (c_.q_lora_rank > 0) {
      layer->q_a_proj = load_tensor(p + "self_attn.q_a_proj.weight", {c_.q_lora_rank, hidden});
      layer->q_a_norm = load_tensor(p + "self_attn.q_a_layernorm.weight", {c_.q_lora_rank});
    }
    layer->kv_a_proj = load_tensor(p + "self_attn.kv_a_proj_with_mqa.weight", {latent + rope, hidden});
    layer->kv_a_norm = load_tensor(p + "self_attn.kv_a_layernorm.weight", {latent});
    if (layer->is_moe) {
      layer->router = load_tensor(p + "mlp.gate.weight", {c_.n_routed_experts, hidden}, Slice::all(), Slice::all(),
                                  /*keep_f32=*/true);
      layer->router_bias = load_tensor(p + "mlp.gate.e_score_correction_bias", {c_.n_routed_experts}, Slice::all(),
                                       Slice::all(), /*keep_f32=*/true);
    }
    for (int v = 0; v < p_.parts; ++v) {
      LayerPart& part = layer->parts.emplace_back();
      load_attention_part(p, v, part);
      if (!layer->is_moe) {
        const Range cols = part_of(shard_.dense_intermediate, v);
        layer->mlp_inter = cols.size();
        part.mlp_w13 = load_w13(p + "mlp.", c_.intermediate_size, cols);
        part.mlp_w2 = load_w2(p + "mlp.", c_.intermediate_size, cols);
        continue;
      }
      if (c_.n_shared_experts > 0) {
        const Range cols = part_of(shard_.shared_intermediate, v);
        layer->mlp_inter = cols.size();
        part.mlp_w13 = load_w13(p + "mlp.shared_experts.", c_.shared_intermediate_size(), cols);
        part.mlp_w2 = load_w2(p + "mlp.shared_experts.", c_.shared_intermediate_size(), cols);
      }
      load_routed_experts(p, v, part);
    }
    return layer;
  }

  // Part v's heads of the attention projections.
  void load_attention_part(const std::string& p, int v, LayerPart& part) {
    const int64_t hidden = c_.hidden_size, qk = c_.qk_head_dim(), latent = c_.kv_lora_rank;
    const int64_t kv_b_per_head = c_.qk_nope_head_dim + c_.v_head_dim;
    const Range heads = part_of(shard_.heads, v);
    const Slice q_rows{heads.begin * qk, heads.end * qk};
    if (c_.q_lora_rank > 0) {
      part.q_b_proj =
          load_tensor(p + "self_attn.q_b_proj.weight", {c_.num_attention_heads * qk, c_.q_lora_rank}, q_rows);
    } else {
      part.q_proj = load_tensor(p + "self_attn.q_proj.weight", {c_.num_attention_heads * qk, hidden}, q_rows);
    }
    part.kv_b_proj = load_tensor(p + "self_attn.kv_b_proj.weight", {c_.num_attention_heads * kv_b_per_head, latent},
                                 {heads.begin * kv_b_per_head, heads.end * kv_b_per_head});
    part.o_proj = load_tensor(p + "self_attn.o_proj.weight", {hidden, c_.num_attention_heads * c_.v_head_dim},
                              Slice::all(), {heads.begin * c_.v_head_dim, heads.end * c_.v_head_dim});
  }

  void load_routed_experts(const std::string& p, int v, LayerPart& part) {
    // The routed experts of the reduction plan's part (expert group major, column part minor)
    // this part is; without one, the rank's.
    part.experts = shard_.experts;
    part.expert_cols = shard_.expert_intermediate;
    const parallel::ParallelPlan& r = p_.reduction_plan;
    if (r.world() > 1) {
      const int global = shard_.coord.moe_index * p_.parts + v;
      part.experts = parallel::split_range(c_.n_routed_experts, r.moe_ep, global / r.moe_tp);
      part.expert_cols = parallel::split_range(c_.moe_intermediate_size, r.moe_tp, global % r.moe_tp);
      MS_CHECK(part.experts.begin >= shard_.experts.begin && part.experts.end <= shard_.experts.end &&
                   part.expert_cols.begin >= shard_.expert_intermediate.begin &&
                   part.expert_cols.end <= shard_.expert_intermediate.end,
               "rank {}: part {} of reduction plan '{}' is not among the rank's experts", shard_.coord.rank, v, r.name);
    }
    for (int64_t e = part.experts.begin; e < part.experts.end; ++e) {
      const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
      part.expert_w13.push_back(load_w13(ep, c_.moe_intermediate_size, part.expert_cols));
      part.expert_w2.push_back(load_w2(ep, c_.moe_intermediate_size, part.expert_cols));
    }
    part.expert_w13_table = pointer_table(part.expert_w13);
    part.expert_w2_table = pointer_table(part.expert_w2);
    for (const auto& b : part.expert_w13) part.expert_w13_ptrs.push_back(b->data());
    for (const auto& b : part.expert_w2) part.expert_w2_ptrs.push_back(b->data());
  }

  const WeightLoadParams& p_;
  const ModelConfig& c_;
  const parallel::RankShard& shard_;
  ops::Backend& backend_;
  const DType weight_dtype_;
  ModelWeights out_;
};

}  // namespace

ModelWeights load_weights(const WeightLoadParams& params) { return WeightLoader(params).load(); }

}  // namespace moeserve
