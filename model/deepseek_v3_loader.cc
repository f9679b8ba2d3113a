#include "model/deepseek_v3_loader.h"

#include <algorithm>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "model/resident_weights.h"
#include "model/rope.h"

namespace moeserve {
namespace {

using ops::BufferPtr;
using parallel::Range;

class WeightLoader {
 public:
  explicit WeightLoader(const WeightLoadParams& p)
      : p_(p),
        c_(p.config),
        shard_(p.shard),
        backend_(p.backend),
        weight_dtype_(p.backend.activation_dtype()),
        formats_(p.config.quantization, static_cast<int64_t>(dtype_size(weight_dtype_))) {}

  ModelWeights load() {
    load_ends();
    const std::vector<float> inv_freq = rope_inv_freq(c_);
    Tensor inv_freq_tensor(DType::F32, {static_cast<int64_t>(inv_freq.size())});
    std::copy(inv_freq.begin(), inv_freq.end(), inv_freq_tensor.f32());
    out_.inv_freq = backend_.upload_weight(inv_freq_tensor, /*keep_f32=*/true);
    for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) out_.layers.push_back(load_layer(l));
    if (p_.mtp && shard_.last_stage) load_mtp();
    return std::move(out_);
  }

 private:
  // Rows x cols of tensor `name` (full shape `shape`) into `dst` at element `offset`:
  // generated in place for synthetic sources, read and uploaded otherwise.
  void place(ops::Buffer& dst, int64_t offset, const std::string& name, const Shape& shape, Slice rows, Slice cols,
             bool keep_f32) {
    const int64_t full_cols = shape.size() == 2 ? shape[1] : 1;
    const int64_t elem = keep_f32 ? 4 : static_cast<int64_t>(dtype_size(weight_dtype_));
    Placement where = rect_of(name, shape, rows, cols, keep_f32);
    where.data = static_cast<std::byte*>(dst.data()) + offset * elem;
    where.buffer = &dst;
    if (index_and_copy(where)) return;
    const Range r = where.rows, k{where.col_bytes.begin / elem, where.col_bytes.end / elem};
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
    backend_.upload_weight_into(dst, static_cast<size_t>(offset * elem), p_.source.read(name, shape, rows, cols),
                                keep_f32);
  }
  // Rows x cols of tensor `name` (full shape `shape`) as a rectangle of its stored matrix
  // (data and buffer unset).
  Placement rect_of(const std::string& name, const Shape& shape, Slice rows, Slice cols, bool keep_f32) const {
    const int64_t full_rows = shape[0], full_cols = shape.size() == 2 ? shape[1] : 1;
    const Range r{rows.begin, rows.end < 0 ? full_rows : rows.end};
    const Range k{cols.begin, cols.end < 0 ? full_cols : cols.end};
    const int64_t elem = keep_f32 ? 4 : static_cast<int64_t>(dtype_size(weight_dtype_));
    return {name, r, {k.begin * elem, k.end * elem}, full_cols * elem, nullptr, shard_.coord.rank};
  }
  // In a re-plan: a view of the old buffer that holds exactly `pieces` at their offsets of a
  // new `bytes`-byte buffer, the pieces recorded in the index; null when none does (copy).
  BufferPtr view_of_resident(int64_t bytes, std::vector<PlannedPlacement> pieces) {
    ResidentWeightSource* resident = p_.source.resident();
    if (resident == nullptr) return nullptr;
    BufferPtr view = resident->view(backend_, bytes, pieces);
    if (view)
      for (const PlannedPlacement& piece : pieces) out_.index.add(piece.where);
    return view;
  }
  // A buffer the loader fills in full: unzeroed when its bytes are copied from resident weights.
  BufferPtr buffer_filled_in_full(int64_t bytes) {
    return p_.source.resident() != nullptr ? backend_.alloc_for_overwrite(static_cast<size_t>(bytes))
                                           : backend_.alloc(static_cast<size_t>(bytes));
  }
  // Records `p` in the rank's index; true when the source is resident weights and `p` was
  // copied from them (the caller then reads nothing).
  bool index_and_copy(const Placement& p) {
    out_.index.add(p);
    ResidentWeightSource* resident = p_.source.resident();
    if (resident) resident->assemble(p);
    return resident != nullptr;
  }
  // The values and scales of packed slice `s` at bytes values_at / scales_at of a buffer, as
  // rectangles of their stored matrices (data and buffer unset): int4 [n, k/8] words and
  // [n, k/group] bf16 scales, fp8 [n, k] bytes and the [ceil(n/bn), ceil(k/bk)] fp32 grid.
  std::vector<PlannedPlacement> packed_pieces(const PackedSlice& s, int64_t values_at, int64_t scales_at) const {
    const bool int4 = s.layout.quant == ops::WeightQuant::int4_group;
    auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const int rank = shard_.coord.rank;
    const int64_t vb = int4 ? 2 : 1;  // int4: two weights per byte; fp8: one
    const int64_t bn = int4 ? 1 : s.layout.block_n, bk = int4 ? s.layout.group_size : s.layout.block_k;
    const int64_t sb = int4 ? 2 : 4;  // bf16 or fp32 scales
    const Placement values{
        s.module + ".values", s.rows, {s.cols.begin / vb, s.cols.end / vb}, s.k / vb, nullptr, rank, nullptr};
    const Placement scales{s.module + ".scales",
                           {s.rows.begin / bn, ceil_div(s.rows.end, bn)},
                           {s.cols.begin / bk * sb, ceil_div(s.cols.end, bk) * sb},
                           ceil_div(s.k, bk) * sb,
                           nullptr,
                           rank,
                           nullptr};
    return {{values, values_at}, {scales, scales_at}};
  }
  // packed_pieces of `s` in dst, recorded; true when copied from resident weights.
  bool index_and_copy_packed(ops::Buffer& dst, const PackedSlice& s, int64_t values_at, int64_t scales_at) {
    bool copied = true;
    for (PlannedPlacement& piece : packed_pieces(s, values_at, scales_at)) {
      piece.where.data = static_cast<std::byte*>(dst.data()) + piece.offset;
      piece.where.buffer = &dst;
      copied = index_and_copy(piece.where) && copied;
    }
    return copied;
  }
  // Checks packed slice `s` and counts its bytes as loaded.
  void count_packed(const PackedSlice& s) {
    check_packed_slice(s, shard_.coord.rank);
    out_.bytes += ops::quant_value_bytes(s.rows.size(), s.cols.size(), s.layout) +
                  ops::quant_scale_bytes(s.rows.size(), s.cols.size(), s.layout);
  }
  // A new buffer holding rows x cols of tensor `name`.
  BufferPtr load_tensor(const std::string& name, const Shape& shape, Slice rows = Slice::all(),
                        Slice cols = Slice::all(), bool keep_f32 = false) {
    const Placement rect = rect_of(name, shape, rows, cols, keep_f32);
    const int64_t bytes = rect.rows.size() * rect.col_bytes.size();
    out_.bytes += bytes;
    if (BufferPtr view = view_of_resident(bytes, {{rect, 0}})) return view;
    BufferPtr buffer = buffer_filled_in_full(bytes);
    place(*buffer, 0, name, shape, rows, cols, keep_f32);
    return buffer;
  }
  // The layout of linear `module` (a tensor name without ".weight") as the checkpoint stores it.
  ops::QuantLayout layout_of(const std::string& module, bool expert = false) {
    return quant_layout(formats_.linear(module, expert));
  }
  // Rows x cols of the packed linear `s.module` into dst: its values at byte `values_at`, its
  // scales at byte `scales_at`; generated in place for synthetic sources.
  void place_packed(ops::Buffer& dst, const PackedSlice& s, int64_t values_at, int64_t scales_at) {
    count_packed(s);
    if (index_and_copy_packed(dst, s, values_at, scales_at)) return;
    SyntheticPackedRecipe recipe;
    if (p_.source.synthetic_packed_recipe(s.module, s.n, s.k, s.layout, &recipe)) {
      generate_packed(dst, s, recipe, values_at, scales_at);
      return;
    }
    const PackedWeight w = p_.source.read_packed(s);
    backend_.upload(dst, static_cast<size_t>(values_at), w.values.data(), w.values.size());
    backend_.upload(dst, static_cast<size_t>(scales_at), w.scales.data(), w.scales.size());
  }
  void generate_packed(ops::Buffer& dst, const PackedSlice& s, const SyntheticPackedRecipe& recipe, int64_t values_at,
                       int64_t scales_at) {
    const bool int4 = s.layout.quant == ops::WeightQuant::int4_group;
    const int64_t per_word = int4 ? 8 : 4;  // weights per 32-bit word
    MS_CHECK(s.k % per_word == 0 && s.cols.size() % per_word == 0,
             "synthetic tensor '{}': columns [{}, {}) of K = {} are not whole 32-bit words", s.module, s.cols.begin,
             s.cols.end, s.k);
    backend_.fill_random_words({.out = reinterpret_cast<uint32_t*>(static_cast<std::byte*>(dst.data()) + values_at),
                                .words = s.cols.size() / per_word,
                                .word0 = s.rows.begin * (s.k / per_word) + s.cols.begin / per_word,
                                .seed = recipe.value_seed,
                                .rows = s.rows.size(),
                                .index_stride = s.k / per_word,
                                .mask = recipe.value_mask});
    // The slice's part of the scale grid: int4 [N, K/group], fp8 [ceil(N/bn), ceil(K/bk)].
    auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const int64_t bn = int4 ? 1 : s.layout.block_n, bk = int4 ? s.layout.group_size : s.layout.block_k;
    const Range rows{s.rows.begin / bn, ceil_div(s.rows.end, bn)}, cols{s.cols.begin / bk, ceil_div(s.cols.end, bk)};
    ops::FillUniformParams fill{static_cast<std::byte*>(dst.data()) + scales_at,
                                rows.size(),
                                cols.size(),
                                ceil_div(s.k, bk),
                                rows.begin,
                                cols.begin,
                                recipe.scales.seed,
                                recipe.scales.offset,
                                recipe.scales.amplitude};
    fill.out_f32 = !int4;  // fp8 scales are fp32, int4 scales bf16 (ops/quant_layout.h)
    fill.out_bf16 = int4;
    backend_.fill_uniform(fill);
  }
  // Rows x cols of linear `module` [n, k]: packed when the checkpoint quantizes it.
  LinearWeight load_linear(const std::string& module, int64_t n, int64_t k, Range rows, Range cols,
                           bool expert = false) {
    const ops::QuantLayout layout = layout_of(module, expert);
    if (!layout.quantized())
      return {load_tensor(module + ".weight", {n, k}, {rows.begin, rows.end}, {cols.begin, cols.end}), layout};
    const PackedSlice s{module, n, k, rows, cols, layout};
    const int64_t bytes = ops::quant_buffer_bytes(rows.size(), cols.size(), layout);
    const int64_t scales_at = ops::quant_scales_offset(rows.size(), cols.size(), layout);
    if (BufferPtr view = view_of_resident(bytes, packed_pieces(s, 0, scales_at))) {
      count_packed(s);
      return {std::move(view), layout};
    }
    BufferPtr buffer = buffer_filled_in_full(bytes);
    place_packed(*buffer, s, 0, scales_at);
    return {std::move(buffer), layout};
  }
  // A weight an op reads unquantized (kv_b_proj: the absorbed-MLA ops), dequantized on the host
  // from a quantized checkpoint as vLLM does; synthetic sources generate it unquantized.
  BufferPtr load_dequantized(const std::string& module, int64_t n, int64_t k, Range rows) {
    MS_CHECK(dequantized_at_load(module), "tensor '{}': not a weight that is dequantized at load", module);
    const ops::QuantLayout layout = layout_of(module);
    SyntheticRecipe recipe;
    // Resident weights hold it dequantized already: copied as the unquantized tensor it is.
    if (!layout.quantized() || p_.source.resident() != nullptr ||
        p_.source.synthetic_recipe(module + ".weight", {n, k}, &recipe))
      return load_tensor(module + ".weight", {n, k}, {rows.begin, rows.end});
    const PackedSlice slice{module, n, k, rows, {0, k}, layout};
    check_packed_slice(slice, shard_.coord.rank);
    const Tensor w = dequantize(p_.source.read_packed(slice), layout);
    const int64_t elem = static_cast<int64_t>(dtype_size(weight_dtype_));
    out_.bytes += w.numel() * elem;
    BufferPtr buffer = backend_.upload_weight(w, /*keep_f32=*/false);
    out_.index.add({module + ".weight",
                    rows,
                    {0, k * elem},
                    k * elem,
                    static_cast<std::byte*>(buffer->data()),
                    shard_.coord.rank,
                    buffer.get()});
    return buffer;
  }
  // gate and up rows `cols` of an MLP stacked into one [2 * n, hidden] matrix (packed: gate's
  // values then up's, gate's scales then up's, which is the layout of the stacked matrix when
  // n rows are whole scale blocks).
  LinearWeight load_w13(const std::string& prefix, int64_t inter, Range cols, bool expert = false) {
    const int64_t n = cols.size(), hidden = c_.hidden_size;
    const ops::QuantLayout layout = layout_of(prefix + "gate_proj", expert);
    MS_CHECK(layout == layout_of(prefix + "up_proj", expert),
             "tensors '{}gate_proj' and '{}up_proj' are stored in "
             "different formats (quantization_config's ignore list); they are stacked into one matrix",
             prefix, prefix);
    if (!layout.quantized()) {
      const int64_t half = n * hidden * static_cast<int64_t>(dtype_size(weight_dtype_));
      out_.bytes += 2 * half;
      const Slice rows{cols.begin, cols.end};
      const Placement gate = rect_of(prefix + "gate_proj.weight", {inter, hidden}, rows, Slice::all(), false);
      const Placement up = rect_of(prefix + "up_proj.weight", {inter, hidden}, rows, Slice::all(), false);
      if (BufferPtr view = view_of_resident(2 * half, {{gate, 0}, {up, half}})) return {std::move(view), layout};
      BufferPtr w13 = buffer_filled_in_full(2 * half);
      place(*w13, 0, prefix + "gate_proj.weight", {inter, hidden}, rows, Slice::all(), false);
      place(*w13, n * hidden, prefix + "up_proj.weight", {inter, hidden}, rows, Slice::all(), false);
      return {std::move(w13), layout};
    }
    MS_CHECK(layout.quant != ops::WeightQuant::fp8_block || n % layout.block_n == 0,
             "tensor '{}gate_proj.weight': rank {} holds {} rows, not whole {}-row scale blocks, so gate and up "
             "cannot be stacked; use a plan that splits this MLP on block boundaries",
             prefix, shard_.coord.rank, n, layout.block_n);
    const int64_t bytes = ops::quant_buffer_bytes(2 * n, hidden, layout);
    const int64_t scales = ops::quant_scales_offset(2 * n, hidden, layout);
    const std::string gate_module = prefix + "gate_proj", up_module = prefix + "up_proj";
    const PackedSlice gate{gate_module, inter, hidden, cols, {0, hidden}, layout};
    const PackedSlice up{up_module, inter, hidden, cols, {0, hidden}, layout};
    const int64_t up_values = ops::quant_value_bytes(n, hidden, layout);
    const int64_t up_scales = scales + ops::quant_scale_bytes(n, hidden, layout);
    std::vector<PlannedPlacement> pieces = packed_pieces(gate, 0, scales);
    for (const PlannedPlacement& piece : packed_pieces(up, up_values, up_scales)) pieces.push_back(piece);
    if (BufferPtr view = view_of_resident(bytes, std::move(pieces))) {
      count_packed(gate);
      count_packed(up);
      return {std::move(view), layout};
    }
    BufferPtr w13 = buffer_filled_in_full(bytes);
    place_packed(*w13, gate, 0, scales);
    place_packed(*w13, up, up_values, up_scales);
    return {std::move(w13), layout};
  }
  LinearWeight load_w2(const std::string& prefix, int64_t inter, Range cols, bool expert = false) {
    return load_linear(prefix + "down_proj", c_.hidden_size, inter, {0, c_.hidden_size}, cols, expert);
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
    for (int v = 0; v < p_.parts; ++v) {
      const Range rows = part_of(shard_.vocab, v);
      if (c_.tie_word_embeddings) {
        out_.lm_head.push_back({load_tensor(embed_name, {c_.vocab_size, hidden}, {rows.begin, rows.end}), {}});
      } else {
        out_.lm_head.push_back(load_linear(c_.tensor_prefix + "lm_head", c_.vocab_size, hidden, rows, {0, hidden}));
      }
    }
  }

  void load_mtp() {
    const int64_t hidden = c_.hidden_size, n = c_.num_hidden_layers;
    MS_CHECK(c_.num_nextn_predict_layers >= 1,
             "config: num_nextn_predict_layers is {}: the model has no MTP layer to load (tensors model.layers.{}.*)",
             c_.num_nextn_predict_layers, n);
    if (!out_.embed)  // the MTP layer embeds its next tokens (a later pipeline stage)
      out_.embed = load_tensor(c_.tensor_prefix + "model.embed_tokens.weight", {c_.vocab_size, hidden},
                               {shard_.vocab.begin, shard_.vocab.end});
    const std::string p = fmt::format("{}model.layers.{}.", c_.tensor_prefix, n);
    auto mtp = std::make_unique<MtpWeights>();
    mtp->enorm = load_tensor(p + "enorm.weight", {hidden});
    mtp->hnorm = load_tensor(p + "hnorm.weight", {hidden});
    mtp->eh_proj = load_linear(p + "eh_proj", hidden, 2 * hidden, {0, hidden}, {0, 2 * hidden});
    mtp->head_norm = load_tensor(p + "shared_head.norm.weight", {hidden});
    mtp->block = load_layer(n);
    out_.mtp = std::move(mtp);
  }

  std::unique_ptr<LayerWeights> load_layer(int64_t l) {
    const int64_t hidden = c_.hidden_size, latent = c_.kv_lora_rank, rope = c_.qk_rope_head_dim;
    auto layer = std::make_unique<LayerWeights>();
    const std::string p = fmt::format("{}model.layers.{}.", c_.tensor_prefix, l);
    layer->is_moe = c_.is_moe_layer(l);
    layer->input_norm = load_tensor(p + "input_layernorm.weight", {hidden});
    layer->post_attention_norm = load_tensor(p + "post_attention_layernorm.weight", {hidden});
    if (c_.q_lora_rank > 0) {
      layer->q_a_proj = load_linear(p + "self_attn.q_a_proj", c_.q_lora_rank, hidden, {0, c_.q_lora_rank}, {0, hidden});
      layer->q_a_norm = load_tensor(p + "self_attn.q_a_layernorm.weight", {c_.q_lora_rank});
    }
    layer->kv_a_proj =
        load_linear(p + "self_attn.kv_a_proj_with_mqa", latent + rope, hidden, {0, latent + rope}, {0, hidden});
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
    const Range q_rows{heads.begin * qk, heads.end * qk};
    if (c_.q_lora_rank > 0) {
      part.q_b_proj = load_linear(p + "self_attn.q_b_proj", c_.num_attention_heads * qk, c_.q_lora_rank, q_rows,
                                  {0, c_.q_lora_rank});
    } else {
      part.q_proj = load_linear(p + "self_attn.q_proj", c_.num_attention_heads * qk, hidden, q_rows, {0, hidden});
    }
    part.kv_b_proj = load_dequantized(p + "self_attn.kv_b_proj", c_.num_attention_heads * kv_b_per_head, latent,
                                      {heads.begin * kv_b_per_head, heads.end * kv_b_per_head});
    const int64_t o_cols = c_.num_attention_heads * c_.v_head_dim;
    part.o_proj = load_linear(p + "self_attn.o_proj", hidden, o_cols, {0, hidden},
                              {heads.begin * c_.v_head_dim, heads.end * c_.v_head_dim});
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
      LinearWeight w13 = load_w13(ep, c_.moe_intermediate_size, part.expert_cols, /*expert=*/true);
      LinearWeight w2 = load_w2(ep, c_.moe_intermediate_size, part.expert_cols, /*expert=*/true);
      MS_CHECK(w13.quant == w2.quant,
               "tensors '{}gate_proj' and '{}down_proj' are stored in different formats "
               "(quantization_config's ignore list); one experts call reads both in one layout",
               ep, ep);
      part.expert_quant = w13.quant;
      part.expert_w13.push_back(std::move(w13.buffer));
      part.expert_w2.push_back(std::move(w2.buffer));
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
  WeightFormats formats_;
  ModelWeights out_;
};

}  // namespace

ModelWeights load_weights(const WeightLoadParams& params) { return WeightLoader(params).load(); }

}  // namespace moeserve
