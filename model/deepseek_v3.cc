#include "model/deepseek_v3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "comm/fused_all_reduce_norm.h"
#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "model/rope.h"
#include "parallel/plan_parse.h"

namespace moeserve {

using ops::BufferPtr;
using parallel::Range;

// One part of a layer's split weights: everything the rank holds (no reduction plan, or one
// with no more ranks than the plan's), else the part a rank of the reduction plan holds:
// 1 / parts of the rank's heads and dense / shared-expert columns, and of its routed experts
// by expert group and column as the reduction plan splits them. Own buffers, so that every
// kernel sees the shapes and alignment that rank's would.
struct DeepseekV3::LayerPart {
  BufferPtr q_proj;      // [heads_part * qk_head_dim, hidden]        (no q LoRA)
  BufferPtr q_b_proj;    // [heads_part * qk_head_dim, q_lora_rank]   (q LoRA)
  BufferPtr kv_b_proj;   // [heads_part * (nope + v), kv_lora_rank]
  BufferPtr o_proj;      // [hidden, heads_part * v]
  // Dense MLP (first_k_dense_replace layers) or the shared experts.
  BufferPtr mlp_w13;     // [2 * inter_part, hidden]: gate rows then up rows
  BufferPtr mlp_w2;      // [hidden, inter_part]
  // Routed experts [experts.begin, experts.end) of this part, its columns expert_cols.
  Range experts, expert_cols;
  std::vector<BufferPtr> expert_w13;     // each [2 * expert_inter_part, hidden]
  std::vector<BufferPtr> expert_w2;      // each [hidden, expert_inter_part]
  BufferPtr expert_w13_table, expert_w2_table;  // [local experts] pointers, in backend memory
  std::vector<const void*> expert_w13_ptrs, expert_w2_ptrs;  // the same pointers on the host
};

struct DeepseekV3::Layer {
  bool is_moe = false;
  BufferPtr input_norm, post_attention_norm;  // [hidden]
  BufferPtr q_a_proj;    // [q_lora_rank, hidden]                       (q LoRA)
  BufferPtr q_a_norm;    // [q_lora_rank]
  BufferPtr kv_a_proj;   // [kv_lora_rank + rope, hidden]  (replicated: the latent is shared by all heads)
  BufferPtr kv_a_norm;   // [kv_lora_rank]
  int64_t mlp_inter = 0;  // columns of the dense MLP or the shared experts per part
  BufferPtr router;       // [experts, hidden] fp32
  BufferPtr router_bias;  // [experts] fp32
  std::vector<LayerPart> parts;  // [parts_]
};

// A step's buffers for T tokens. The metadata buffers are kept per T and filled by the host
// before each run; the activations are views of one arena shared by every T (steps run one
// at a time on a rank), so a captured graph replays with the same pointers and memory does
// not grow with the number of step sizes.
struct DeepseekV3::Activations {
  int64_t tokens = 0;
  int64_t block_table_capacity = 0;  // int32 entries of block_tables
  BufferPtr ids, positions, seq_of_token, slots, block_tables, logit_rows;  // int32 metadata
  BufferPtr hidden;     // [T, hidden] residual stream
  BufferPtr normed;     // [T, hidden]
  // [T, hidden] fp32: output of attention / MLP before the residual add. Partial sums over
  // heads, columns and experts are added across ranks in fp32 and rounded to the activation
  // dtype once, in the residual add: every plan rounds where one GPU does.
  BufferPtr branch;
  // A reduction plan: [parts, T, hidden] fp32, one partial branch per part (a.branch views
  // part 0, where their tree sum lands), and with more than 2 ranks per stage the ranks'
  // sums gathered [ranks, T, hidden] fp32 to be added in the same tree.
  BufferPtr branch_parts, branch_gather;
  BufferPtr q_a;        // [T, q_lora]
  BufferPtr q_a_normed; // [T, q_lora]
  BufferPtr q;          // [T, heads_local, qk_head_dim]
  BufferPtr kv;         // [T, latent + rope]: normalised latent + roped key, as cached
  BufferPtr q_latent;   // [T, heads_local, latent]
  BufferPtr attn_latent;// [T, heads_local, latent]
  BufferPtr attn_v;     // [T, heads_local * v]
  BufferPtr gate_up;    // [T, 2 * max inter]
  BufferPtr act;        // [T, max inter]
  BufferPtr topk_ids;   // [T, top_k] int32
  BufferPtr topk_weights; // [T, top_k] fp32
  // The head's buffers, last stage only, for R rows (views of the head arena, grown on demand).
  BufferPtr selected;   // [R, hidden] rows that get logits, normalised
  BufferPtr local_logits;  // [R, vocab_local] fp32
  BufferPtr gathered_logits;  // [attn_tp, R, vocab_local] fp32
  // Greedy heads: this rank's slice maxima, values [R] then ids [R] in one buffer, so that a
  // single all-gather moves both: gathered [attn_tp, 2R].
  BufferPtr greedy_pairs, greedy_values, greedy_ids;
  BufferPtr gathered_pairs;
  // Candidate heads: C = candidates_per_slice() per row of this rank's vocab slice.
  BufferPtr temperatures;                               // [R] fp32, uploaded with the step
  BufferPtr cand_values, cand_ids;                      // [R, C]: a row's first value is its slice's maximum
  BufferPtr cand_normaliser;                            // [R] fp64
  BufferPtr gathered_cand_values, gathered_cand_ids;    // [attn_tp, R, C]
  BufferPtr gathered_cand_normaliser;                   // [attn_tp, R] fp64
};

namespace {

void* ptr(const BufferPtr& b) { return b ? b->data() : nullptr; }
std::byte* bytes(const BufferPtr& b) { return static_cast<std::byte*>(ptr(b)); }

std::string layer_prefix(const ModelConfig& c, int64_t layer) {
  return fmt::format("{}model.layers.{}.", c.tensor_prefix, layer);
}

}  // namespace

DeepseekV3::DeepseekV3(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                       ops::Backend& backend, WeightSource& source, RankGroups groups, KvCacheShape cache,
                       ModelRunOptions run)
    : config_(config), plan_(plan), run_(run), backend_(backend), groups_(groups), cache_shape_(cache) {
  shard_ = parallel::shard_of(plan, shard_dims(config), rank);
  const int stage_ranks = plan.ranks_per_stage();
  MS_CHECK(plan.attn_tp == 1 || (groups.attn_tp != nullptr && groups.attn_tp->size() == plan.attn_tp),
           "plan '{}' rank {}: needs an attention-TP communicator of {} ranks", plan.name, rank, plan.attn_tp);
  MS_CHECK(stage_ranks == 1 || (groups.moe != nullptr && groups.moe->size() == stage_ranks),
           "plan '{}' rank {}: needs a MoE (stage) communicator of {} ranks", plan.name, rank, stage_ranks);
  check_reduction_plan(config, plan, run);
  parts_ = std::max(1, run.reduction_plan.world() / stage_ranks);
  load(source);
  const int64_t width = config.kv_lora_rank + config.qk_rope_head_dim;
  const size_t cache_bytes =
      static_cast<size_t>(cache.num_pages * cache.page_size * width) * dtype_size(backend.activation_dtype());
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) kv_cache_.push_back(backend.alloc(cache_bytes));
  backend.synchronize();
}

void check_reduction_plan(const ModelConfig& config, const parallel::ParallelPlan& plan, const ModelRunOptions& run) {
  const parallel::ParallelPlan& r = run.reduction_plan;
  const int ranks = r.world();
  MS_CHECK(r.pp == 1 && r.attn_dp == 1 && (ranks & (ranks - 1)) == 0,
           "--reduction-plan {}: name a plan of one stage, without attention DP, of a power-of-two number of ranks "
           "(tp8, ep8, ep4tp2, ...)",
           r.name);
  if (ranks == 1) return;
  MS_CHECK(plan.attn_dp == 1,
           "--reduction-plan {}: plan '{}' has attention DP {}: its routed tokens travel by all-to-all and their "
           "experts' outputs are summed in another order",
           r.name, plan.name, plan.attn_dp);
  MS_CHECK(ranks % plan.attn_tp == 0, "--reduction-plan {}: the {} ranks per stage of plan '{}' do not divide its {}",
           r.name, plan.attn_tp, plan.name, ranks);
  // Each rank must hold a contiguous run of the reduction plan's parts (expert group major,
  // column part minor): one expert group split further by columns, or whole groups.
  MS_CHECK(r.moe_ep % plan.moe_ep == 0 && r.moe_tp % plan.moe_tp == 0 && (plan.moe_ep == r.moe_ep || plan.moe_tp == 1),
           "--reduction-plan {}: plan '{}' splits the routed experts into {} expert group(s) x {} column part(s), "
           "which do not nest in its {} x {} (tp plans nest in a tp reduction plan, ep plans in an ep one, epAtpB "
           "in epAtpC)",
           r.name, plan.name, plan.moe_ep, plan.moe_tp, r.moe_ep, r.moe_tp);
  // Its parts must divide the model as its ranks would (heads, vocabulary, experts, columns).
  try {
    parallel::validate_plan(r, shard_dims(config));
  } catch (const Error& e) {
    fail("--reduction-plan {}: {}", r.name, e.what());
  }
}

DeepseekV3::~DeepseekV3() = default;

std::vector<ops::Buffer*> DeepseekV3::kv_caches() {
  std::vector<ops::Buffer*> out;
  for (auto& b : kv_cache_) out.push_back(b.get());
  return out;
}

void DeepseekV3::load(WeightSource& source) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t qk = c.qk_head_dim();
  const int64_t latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const DType weight_dtype = backend_.activation_dtype();

  // Rows x cols of tensor `name` (full shape `shape`) into `dst` at element `offset`:
  // generated in place for synthetic sources, read and uploaded otherwise.
  auto place = [&](ops::Buffer& dst, int64_t offset, const std::string& name, const Shape& shape, Slice rows,
                   Slice cols, bool keep_f32) {
    const int64_t full_rows = shape[0], full_cols = shape.size() == 2 ? shape[1] : 1;
    const Range r{rows.begin, rows.end < 0 ? full_rows : rows.end};
    const Range k{cols.begin, cols.end < 0 ? full_cols : cols.end};
    const size_t elem = keep_f32 ? 4 : dtype_size(weight_dtype);
    SyntheticRecipe recipe;
    if (source.synthetic_recipe(name, shape, &recipe)) {
      ops::FillUniformParams fill{static_cast<std::byte*>(dst.data()) + offset * elem, r.size(), k.size(), full_cols,
                                  r.begin, k.begin, recipe.seed, recipe.offset, recipe.amplitude};
      fill.out_f32 = keep_f32;
      backend_.fill_uniform(fill);
      return;
    }
    backend_.upload_weight_into(dst, static_cast<size_t>(offset) * elem, source.read(name, shape, rows, cols), keep_f32);
  };
  // A new buffer holding rows x cols of tensor `name`.
  auto load_tensor = [&](const std::string& name, const Shape& shape, Slice rows = Slice::all(),
                         Slice cols = Slice::all(), bool keep_f32 = false) {
    const int64_t n_rows = (rows.end < 0 ? shape[0] : rows.end) - rows.begin;
    const int64_t n_cols = shape.size() == 2 ? (cols.end < 0 ? shape[1] : cols.end) - cols.begin : 1;
    const int64_t bytes = n_rows * n_cols * static_cast<int64_t>(keep_f32 ? 4 : dtype_size(weight_dtype));
    BufferPtr buffer = backend_.alloc(static_cast<size_t>(bytes));
    place(*buffer, 0, name, shape, rows, cols, keep_f32);
    weight_bytes_ += bytes;
    return buffer;
  };
  // gate and up rows `cols` of an MLP stacked into one [2 * n, hidden] matrix.
  auto load_w13 = [&](const std::string& prefix, int64_t inter, Range cols) {
    const int64_t n = cols.size();
    BufferPtr w13 = backend_.alloc(static_cast<size_t>(2 * n * hidden) * dtype_size(weight_dtype));
    place(*w13, 0, prefix + "gate_proj.weight", {inter, hidden}, {cols.begin, cols.end}, Slice::all(), false);
    place(*w13, n * hidden, prefix + "up_proj.weight", {inter, hidden}, {cols.begin, cols.end}, Slice::all(), false);
    weight_bytes_ += 2 * n * hidden * static_cast<int64_t>(dtype_size(weight_dtype));
    return w13;
  };
  auto load_w2 = [&](const std::string& prefix, int64_t inter, Range cols) {
    return load_tensor(prefix + "down_proj.weight", {hidden, inter}, Slice::all(), {cols.begin, cols.end});
  };
  auto pointer_table = [&](const std::vector<BufferPtr>& buffers) {
    std::vector<const void*> pointers;
    for (const auto& b : buffers) pointers.push_back(b->data());
    BufferPtr table = backend_.alloc(std::max<size_t>(pointers.size(), 1) * sizeof(void*));
    if (!pointers.empty()) backend_.upload(*table, 0, pointers.data(), pointers.size() * sizeof(void*));
    return table;
  };

  // Part v of a range the rank owns (the ranges divide evenly: check_reduction_plan).
  auto part_of = [&](Range r, int v) {
    const Range sub = parallel::split_range(r.size(), parts_, v);
    return Range{r.begin + sub.begin, r.begin + sub.end};
  };

  const std::string embed_name = c.tensor_prefix + "model.embed_tokens.weight";
  const Slice vocab_rows{shard_.vocab.begin, shard_.vocab.end};
  if (shard_.first_stage) embed_ = load_tensor(embed_name, {c.vocab_size, hidden}, vocab_rows);
  if (shard_.last_stage) {
    final_norm_ = load_tensor(c.tensor_prefix + "model.norm.weight", {hidden});
    const std::string head_name = c.tie_word_embeddings ? embed_name : c.tensor_prefix + "lm_head.weight";
    for (int v = 0; v < parts_; ++v) {
      const Range rows = part_of(shard_.vocab, v);
      lm_head_.push_back(load_tensor(head_name, {c.vocab_size, hidden}, {rows.begin, rows.end}));
    }
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);
  Tensor inv_freq_tensor(DType::F32, {static_cast<int64_t>(inv_freq.size())});
  std::copy(inv_freq.begin(), inv_freq.end(), inv_freq_tensor.f32());
  inv_freq_ = backend_.upload_weight(inv_freq_tensor, /*keep_f32=*/true);

  const int64_t kv_b_per_head = c.qk_nope_head_dim + c.v_head_dim;
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) {
    auto layer = std::make_unique<Layer>();
    const std::string p = layer_prefix(c, l);
    layer->is_moe = c.is_moe_layer(l);
    layer->input_norm = load_tensor(p + "input_layernorm.weight", {hidden});
    layer->post_attention_norm = load_tensor(p + "post_attention_layernorm.weight", {hidden});
    if (c.q_lora_rank > 0) {
      layer->q_a_proj = load_tensor(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, hidden});
      layer->q_a_norm = load_tensor(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
    }
    layer->kv_a_proj = load_tensor(p + "self_attn.kv_a_proj_with_mqa.weight", {latent + rope, hidden});
    layer->kv_a_norm = load_tensor(p + "self_attn.kv_a_layernorm.weight", {latent});
    if (layer->is_moe) {
      layer->router = load_tensor(p + "mlp.gate.weight", {c.n_routed_experts, hidden}, Slice::all(), Slice::all(),
                                  /*keep_f32=*/true);
      layer->router_bias = load_tensor(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, Slice::all(),
                                       Slice::all(), /*keep_f32=*/true);
    }
    for (int v = 0; v < parts_; ++v) {
      LayerPart& part = layer->parts.emplace_back();
      const Range heads = part_of(shard_.heads, v);
      const Slice q_rows{heads.begin * qk, heads.end * qk};
      if (c.q_lora_rank > 0) {
        part.q_b_proj = load_tensor(p + "self_attn.q_b_proj.weight", {c.num_attention_heads * qk, c.q_lora_rank}, q_rows);
      } else {
        part.q_proj = load_tensor(p + "self_attn.q_proj.weight", {c.num_attention_heads * qk, hidden}, q_rows);
      }
      part.kv_b_proj = load_tensor(p + "self_attn.kv_b_proj.weight", {c.num_attention_heads * kv_b_per_head, latent},
                                   {heads.begin * kv_b_per_head, heads.end * kv_b_per_head});
      part.o_proj = load_tensor(p + "self_attn.o_proj.weight", {hidden, c.num_attention_heads * c.v_head_dim},
                                Slice::all(), {heads.begin * c.v_head_dim, heads.end * c.v_head_dim});
      if (!layer->is_moe) {
        const Range cols = part_of(shard_.dense_intermediate, v);
        layer->mlp_inter = cols.size();
        part.mlp_w13 = load_w13(p + "mlp.", c.intermediate_size, cols);
        part.mlp_w2 = load_w2(p + "mlp.", c.intermediate_size, cols);
        continue;
      }
      if (c.n_shared_experts > 0) {
        const Range cols = part_of(shard_.shared_intermediate, v);
        layer->mlp_inter = cols.size();
        part.mlp_w13 = load_w13(p + "mlp.shared_experts.", c.shared_intermediate_size(), cols);
        part.mlp_w2 = load_w2(p + "mlp.shared_experts.", c.shared_intermediate_size(), cols);
      }
      // The routed experts of the reduction plan's part (expert group major, column part minor)
      // this part is; without one, the rank's.
      part.experts = shard_.experts;
      part.expert_cols = shard_.expert_intermediate;
      if (reduction_plan_on()) {
        const parallel::ParallelPlan& r = run_.reduction_plan;
        const int global = shard_.coord.moe_index * parts_ + v;
        part.experts = parallel::split_range(c.n_routed_experts, r.moe_ep, global / r.moe_tp);
        part.expert_cols = parallel::split_range(c.moe_intermediate_size, r.moe_tp, global % r.moe_tp);
        MS_CHECK(part.experts.begin >= shard_.experts.begin && part.experts.end <= shard_.experts.end &&
                     part.expert_cols.begin >= shard_.expert_intermediate.begin &&
                     part.expert_cols.end <= shard_.expert_intermediate.end,
                 "rank {}: part {} of reduction plan '{}' is not among the rank's experts", shard_.coord.rank, v,
                 r.name);
      }
      for (int64_t e = part.experts.begin; e < part.experts.end; ++e) {
        const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
        part.expert_w13.push_back(load_w13(ep, c.moe_intermediate_size, part.expert_cols));
        part.expert_w2.push_back(load_w2(ep, c.moe_intermediate_size, part.expert_cols));
      }
      part.expert_w13_table = pointer_table(part.expert_w13);
      part.expert_w2_table = pointer_table(part.expert_w2);
      for (const auto& b : part.expert_w13) part.expert_w13_ptrs.push_back(b->data());
      for (const auto& b : part.expert_w2) part.expert_w2_ptrs.push_back(b->data());
    }
    layers_.push_back(std::move(layer));
  }
}

void DeepseekV3::record_routing(int64_t moe_layer, const int32_t* ids, size_t count) {
  if (static_cast<int64_t>(last_routing_.size()) <= moe_layer) last_routing_.resize(static_cast<size_t>(moe_layer + 1));
  last_routing_[moe_layer].insert(last_routing_[moe_layer].end(), ids, ids + count);
}

void DeepseekV3::all_reduce(comm::Communicator* group, ops::Buffer& buffer, int64_t count, const char* site,
                            DType dtype) {
  if (group == nullptr || group->size() == 1) return;
  group->set_site(site);
  group->all_reduce_sum(buffer.data(), static_cast<size_t>(count), dtype);
}

namespace {

// A non-owning window of a larger buffer (the activation arena).
class BufferView final : public ops::Buffer {
 public:
  BufferView(void* data, size_t nbytes) : data_(data), nbytes_(nbytes) {}
  void* data() override { return data_; }
  size_t nbytes() const override { return nbytes_; }

 private:
  void* data_;
  size_t nbytes_;
};

}  // namespace

// Lays buffers (at least one element each) out one after the other, 256-byte aligned, in
// `arena`: with an Activations object, points its members there; without one, only adds up
// the bytes the layout needs.
class DeepseekV3::ArenaLayout {
 public:
  ArenaLayout(Activations* a, ops::Buffer* arena) : a_(a), arena_(arena) {}
  void place(BufferPtr Activations::*member, int64_t elements, size_t elem) {
    const size_t n = static_cast<size_t>(std::max<int64_t>(elements, 1)) * elem;
    if (a_ != nullptr) a_->*member = std::make_unique<BufferView>(static_cast<std::byte*>(arena_->data()) + used_, n);
    used_ += (n + 255) & ~size_t{255};
  }
  size_t used() const { return used_; }

 private:
  Activations* a_;
  ops::Buffer* arena_;
  size_t used_ = 0;
};

size_t DeepseekV3::lay_out_activations(Activations* a, int64_t T, ops::Buffer* arena) const {
  const ModelConfig& c = config_;
  const size_t act = dtype_size(backend_.activation_dtype());
  const int64_t heads_local = shard_.heads.size();
  const int64_t latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t max_inter =
      std::max({shard_.dense_intermediate.size(), shard_.shared_intermediate.size(), shard_.expert_intermediate.size()});
  ArenaLayout layout(a, arena);
  layout.place(&Activations::hidden, T * c.hidden_size, act);
  layout.place(&Activations::normed, T * c.hidden_size, act);
  if (parts_ > 1) {
    layout.place(&Activations::branch_parts, parts_ * T * c.hidden_size, 4);
    if (a != nullptr) a->branch = std::make_unique<BufferView>(a->branch_parts->data(), T * c.hidden_size * 4);
  } else {
    layout.place(&Activations::branch, T * c.hidden_size, 4);
  }
  if (reduction_plan_on() && plan_.attn_tp > 2)
    layout.place(&Activations::branch_gather, plan_.attn_tp * T * c.hidden_size, 4);
  layout.place(&Activations::q_a, T * c.q_lora_rank, act);
  layout.place(&Activations::q_a_normed, T * c.q_lora_rank, act);
  layout.place(&Activations::q, T * heads_local * c.qk_head_dim(), act);
  layout.place(&Activations::kv, T * (latent + rope), act);
  layout.place(&Activations::q_latent, T * heads_local * latent, act);
  layout.place(&Activations::attn_latent, T * heads_local * latent, act);
  layout.place(&Activations::attn_v, T * heads_local * c.v_head_dim, act);
  layout.place(&Activations::gate_up, T * 2 * max_inter, act);
  layout.place(&Activations::act, T * max_inter, act);
  layout.place(&Activations::topk_ids, T * c.num_experts_per_tok, 4);
  layout.place(&Activations::topk_weights, T * c.num_experts_per_tok, 4);
  return layout.used();
}

size_t DeepseekV3::lay_out_head(Activations* a, int64_t rows, ops::Buffer* arena) const {
  // Per vocab part of this rank (parts_ of them, each vocab_local / parts_ wide), in part order.
  const int tp = groups_.attn_tp ? groups_.attn_tp->size() : 1;
  const int64_t vocab_local = shard_.vocab.size(), n = std::max<int64_t>(rows, 1);
  ArenaLayout layout(a, arena);
  layout.place(&Activations::selected, n * config_.hidden_size, dtype_size(backend_.activation_dtype()));
  layout.place(&Activations::local_logits, n * vocab_local, 4);   // [parts, R, vocab part]
  layout.place(&Activations::greedy_pairs, parts_ * 2 * n, 4);    // [parts, 2R]
  if (a != nullptr) {  // part 0's values and ids
    a->greedy_values = std::make_unique<BufferView>(a->greedy_pairs->data(), n * 4);
    a->greedy_ids = std::make_unique<BufferView>(static_cast<std::byte*>(a->greedy_pairs->data()) + n * 4, n * 4);
  }
  const int64_t c = candidates_per_slice();
  layout.place(&Activations::temperatures, n, 4);
  layout.place(&Activations::cand_values, parts_ * n * c, 4);   // [parts, R, C]
  layout.place(&Activations::cand_ids, parts_ * n * c, 4);
  layout.place(&Activations::cand_normaliser, parts_ * n, 8);   // [parts, R]
  if (tp > 1) {
    layout.place(&Activations::gathered_logits, tp * n * vocab_local, 4);
    layout.place(&Activations::gathered_pairs, tp * parts_ * 2 * n, 4);
    layout.place(&Activations::gathered_cand_values, tp * parts_ * n * c, 4);
    layout.place(&Activations::gathered_cand_ids, tp * parts_ * n * c, 4);
    layout.place(&Activations::gathered_cand_normaliser, tp * parts_ * n, 8);
  }
  return layout.used();
}

DeepseekV3::Activations& DeepseekV3::workspace(int64_t T) {
  if (!arena_ || T > arena_tokens_) {
    // Every step size shares one arena laid out for the largest size seen: growing it moves
    // every buffer, so the graphs captured so far (which point into it) are dropped.
    backend_.synchronize();
    graphs_.clear();
    workspaces_.clear();
    arena_.reset();
    arena_ = backend_.alloc(lay_out_activations(nullptr, T, nullptr));
    arena_tokens_ = T;
  }
  auto& slot = workspaces_[T];
  if (slot) return *slot;
  auto a = std::make_unique<Activations>();
  auto alloc = [&](int64_t elements, size_t elem) { return backend_.alloc(std::max<int64_t>(elements, 1) * elem); };
  a->tokens = T;
  a->ids = alloc(T, 4);  // step metadata: per size, uploaded before each step
  a->positions = alloc(T, 4);
  a->seq_of_token = alloc(T, 4);
  a->slots = alloc(T, 4);
  a->logit_rows = alloc(T, 4);
  lay_out_activations(a.get(), T, arena_.get());
  if (head_arena_) lay_out_head(a.get(), head_rows_, head_arena_.get());
  slot = std::move(a);
  return *slot;
}

void DeepseekV3::reserve_block_tables(Activations& a, int64_t entries) {
  if (a.block_tables && a.block_table_capacity >= entries) return;
  if (a.block_tables) drop_graphs_of(a);  // graphs captured for this T point at the old table
  a.block_table_capacity = std::max(entries, 2 * a.block_table_capacity);
  a.block_tables = backend_.alloc(static_cast<size_t>(std::max<int64_t>(a.block_table_capacity, 1)) * 4);
}

void DeepseekV3::drop_graphs_of(const Activations& a) {
  backend_.synchronize();
  for (auto it = graphs_.begin(); it != graphs_.end();)
    it = std::get<0>(it->first) == a.tokens ? graphs_.erase(it) : std::next(it);
}

int64_t DeepseekV3::candidates_per_slice() const {
  return std::min(kSampleCandidates, shard_.vocab.size() / parts_);
}

void DeepseekV3::reserve_logit_rows(int64_t rows) {
  if (!shard_.last_stage || (head_arena_ && head_rows_ >= rows)) return;
  // The head's buffers hold the rows that get logits ([rows, vocab] fp32 for every chunk
  // size would cost gigabytes): one arena for all step sizes, sized by the most rows asked.
  if (head_arena_) {
    backend_.synchronize();
    graphs_.clear();  // they point into the old arena
  }
  head_rows_ = std::max(rows, 2 * head_rows_);
  head_arena_.reset();
  head_arena_ = backend_.alloc(lay_out_head(nullptr, head_rows_, nullptr));
  for (auto& [tokens, a] : workspaces_) lay_out_head(a.get(), head_rows_, head_arena_.get());
}

ops::Buffer& DeepseekV3::hidden_states(int64_t tokens) { return *workspace(tokens).hidden; }

void DeepseekV3::upload_metadata(Activations& a, const ForwardBatch& batch) {
  auto put = [&](BufferPtr& dst, const std::vector<int32_t>& v) {
    if (!v.empty()) backend_.upload(*dst, 0, v.data(), v.size() * 4);
  };
  put(a.ids, batch.tokens);
  put(a.positions, batch.positions);
  put(a.seq_of_token, batch.seq_of_token);
  put(a.slots, batch.slots);
  put(a.block_tables, batch.block_tables);
  put(a.logit_rows, batch.logit_rows);
  if (head_mode_ == HeadMode::kCandidates && shard_.last_stage && !batch.temperatures.empty())
    backend_.upload(*a.temperatures, 0, batch.temperatures.data(), batch.temperatures.size() * 4);
}

Tensor DeepseekV3::forward(const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const int64_t T = batch.num_tokens();
  MS_CHECK(static_cast<int64_t>(batch.positions.size()) == T && static_cast<int64_t>(batch.slots.size()) == T &&
               static_cast<int64_t>(batch.seq_of_token.size()) == T,
           "forward batch: tokens, positions, slots and seq_of_token must have the same length");
  const int64_t num_seqs =
      batch.max_pages_per_seq > 0 ? static_cast<int64_t>(batch.block_tables.size()) / batch.max_pages_per_seq : 0;
  for (int64_t t = 0; t < T; ++t) {
    MS_CHECK(batch.positions[t] >= 0 && batch.positions[t] < c.max_position_embeddings,
             "forward batch: position {} outside [0, max_position_embeddings={})", batch.positions[t],
             c.max_position_embeddings);
    MS_CHECK(batch.slots[t] >= 0 && batch.slots[t] < cache_shape_.num_pages * cache_shape_.page_size,
             "forward batch: cache slot {} outside the cache", batch.slots[t]);
    MS_CHECK(batch.seq_of_token[t] >= 0 && batch.seq_of_token[t] < num_seqs &&
                 batch.positions[t] < batch.max_pages_per_seq * cache_shape_.page_size,
             "forward batch: token {} has no block-table row for position {}", t, batch.positions[t]);
    if (shard_.first_stage)
      MS_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.vocab_size, "token id {} outside the vocabulary [0, {})",
               batch.tokens[t], c.vocab_size);
  }
  for (int32_t page : batch.block_tables)
    MS_CHECK(page >= 0 && page < cache_shape_.num_pages, "forward batch: page {} outside the cache", page);
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
  for (int32_t row : batch.logit_rows) MS_CHECK(row >= 0 && row < T, "logit row {} outside the batch of {} tokens", row, T);
  if (head_mode_ == HeadMode::kCandidates && shard_.last_stage) {
    MS_CHECK(static_cast<int64_t>(batch.temperatures.size()) == rows,
             "forward batch: {} temperatures for {} logit rows (a candidate head needs one per row)",
             batch.temperatures.size(), rows);
    for (float t : batch.temperatures)
      MS_CHECK(std::isfinite(t) && t >= 0.0f, "forward batch: temperature {} is not a finite value >= 0", t);
    temperatures_ = batch.temperatures;
  }
  if (head_mode_ == HeadMode::kSampled && shard_.last_stage) {
    MS_CHECK(static_cast<int64_t>(batch.sampling.size()) == rows,
             "forward batch: {} sampling options for {} logit rows (a sampled head needs one per row)",
             batch.sampling.size(), rows);
    sampling_ = batch.sampling;
  }

  Activations& a = workspace(T);
  reserve_block_tables(a, static_cast<int64_t>(batch.block_tables.size()));
  reserve_logit_rows(rows);
  upload_metadata(a, batch);

  // Decode-shaped steps replay a captured graph: same tokens and block-table width as the
  // capture, pointers fixed by the per-T workspace, no host work between the ops.
  bool decode_shaped = rows == T && plan_.attn_dp == 1 && !record_routing_;
  for (int64_t r = 0; decode_shaped && r < rows; ++r) decode_shaped = batch.logit_rows[r] == r;
  const GraphKey key{T, batch.max_pages_per_seq, head_mode_};
  if (graphs_enabled_ && decode_shaped && backend_.supports_graphs() && T > 0) {
    auto graph = graphs_.find(key);
    if (graph == graphs_.end() && warmed_up_.count(key)) {
      backend_.begin_capture();
      run(a, rows, batch.max_pages_per_seq);
      graph = graphs_.emplace(key, backend_.end_capture()).first;
    }
    if (graph != graphs_.end()) {
      backend_.replay(*graph->second);
      return finish(a, rows);
    }
    warmed_up_.insert(key);  // the first run of a shape sizes every lazily grown workspace
  }
  run(a, rows, batch.max_pages_per_seq);
  return finish(a, rows);
}


Tensor DeepseekV3::greedy_to_host(Activations& a, int64_t rows) {
  Tensor ids(DType::I32, {rows});
  if (rows == 0) return ids;
  if (vocab_slices() == 1) {
    backend_.download(ids.raw(), *a.greedy_ids, 0, ids.nbytes());
    return ids;
  }
  // [slices, 2 * capacity]: each vocab slice's maxima (values, then ids). The largest value
  // wins, ties to the smallest id (slices are in id order, so the first slice holding it).
  const int slices = vocab_slices();
  const int64_t capacity = std::max<int64_t>(head_rows_, 1);
  std::vector<float> pairs(static_cast<size_t>(slices * 2 * capacity));
  backend_.download(pairs.data(), a.gathered_pairs ? *a.gathered_pairs : *a.greedy_pairs, 0, pairs.size() * 4);
  auto value = [&](int k, int64_t r) { return pairs[(k * 2) * capacity + r]; };
  for (int64_t r = 0; r < rows; ++r) {
    int best = 0;
    for (int k = 1; k < slices; ++k)
      if (value(k, r) > value(best, r)) best = k;
    std::memcpy(ids.i32() + r, &pairs[(best * 2 + 1) * capacity + r], 4);
  }
  return ids;
}

void DeepseekV3::candidates_to_host(Activations& a, int64_t rows) {
  const int64_t c = candidates_per_slice();
  const int tp = vocab_slices();
  // [slices, rows, c] sorted slices (each slice's first value is its maximum) and their
  // normalisers, each relative to its slice's maximum.
  std::vector<float> values(static_cast<size_t>(tp * rows * c));
  std::vector<int32_t> ids(values.size());
  std::vector<double> sums(static_cast<size_t>(tp * rows));
  if (rows) {
    const bool gathered = a.gathered_cand_values != nullptr;
    backend_.download(values.data(), gathered ? *a.gathered_cand_values : *a.cand_values, 0, values.size() * 4);
    backend_.download(ids.data(), gathered ? *a.gathered_cand_ids : *a.cand_ids, 0, ids.size() * 4);
    backend_.download(sums.data(), gathered ? *a.gathered_cand_normaliser : *a.cand_normaliser, 0, sums.size() * 8);
  }
  SampleCandidates out;
  out.rows = rows;
  out.count = std::min(kSampleCandidates, tp * c);
  out.values.resize(static_cast<size_t>(rows * out.count));
  out.ids.resize(out.values.size());
  out.normaliser.resize(static_cast<size_t>(rows));
  std::vector<int64_t> next(static_cast<size_t>(tp));
  for (int64_t r = 0; r < rows; ++r) {
    // Merge the slices' sorted lists: larger value first, ties to the lower slice (its ids are
    // smaller); the normaliser rescales each slice's sum to the row maximum.
    std::fill(next.begin(), next.end(), 0);
    for (int64_t j = 0; j < out.count; ++j) {
      int best = -1;
      for (int k = 0; k < tp; ++k)
        if (next[k] < c && (best < 0 || values[(k * rows + r) * c + next[k]] > values[(best * rows + r) * c + next[best]]))
          best = k;
      out.values[r * out.count + j] = values[(best * rows + r) * c + next[best]];
      out.ids[r * out.count + j] = ids[(best * rows + r) * c + next[best]];
      ++next[best];
    }
    auto slice_max = [&](int k) { return values[(k * rows + r) * c]; };
    const float row_max = out.values[r * out.count];
    const double temperature = temperatures_[r];
    double total = 0.0;
    for (int k = 0; k < tp; ++k)
      total += sums[k * rows + r] * std::exp((static_cast<double>(slice_max(k)) - row_max) / temperature);
    out.normaliser[r] = temperature > 0.0 ? total : 1.0;
  }
  candidates_ = std::move(out);
}

std::vector<int32_t> DeepseekV3::sample_logits_rows(const std::vector<int64_t>& rows,
                                                    const std::vector<ops::SamplingOptions>& options) {
  MS_CHECK(shard_.last_stage && rows.size() == options.size(),
           "sample_logits_rows: {} rows and {} options on a {} rank", rows.size(), options.size(),
           shard_.last_stage ? "last-stage" : "non-last-stage");
  std::vector<int32_t> row_ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    MS_CHECK(rows[i] >= 0 && rows[i] < last_logit_rows_,
             "sample_logits_rows: row {} is not among the last step's {} logit rows", rows[i], last_logit_rows_);
    row_ids[i] = static_cast<int32_t>(rows[i]);
  }
  Activations& a = *workspaces_.begin()->second;  // every workspace views the same head arena
  const int64_t vocab_local = shard_.vocab.size(), n = static_cast<int64_t>(rows.size());
  const void* logits = ptr(a.local_logits);  // [parts, logit rows, vocab part]
  if (a.gathered_logits) {  // [attn_tp * parts, logit rows, vocab part]
    comm::Communicator& tp = *groups_.attn_tp;
    tp.set_site("sample");
    tp.all_gather(ptr(a.local_logits), ptr(a.gathered_logits), static_cast<size_t>(last_logit_rows_ * vocab_local),
                  DType::F32);
    logits = ptr(a.gathered_logits);
  }
  const int64_t slices = vocab_slices();
  if (!sampled_tokens_ || static_cast<int64_t>(sampled_tokens_->nbytes()) < n * 4)
    sampled_tokens_ = backend_.alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
  ops::SampleParams params{static_cast<const float*>(logits), options.data(),
                           static_cast<int32_t*>(sampled_tokens_->data()), n, config_.vocab_size};
  params.row_ids = row_ids.data();
  params.slices = slices;
  params.logit_rows = last_logit_rows_;
  backend_.sample(params);
  std::vector<int32_t> tokens(rows.size());
  if (n) backend_.download(tokens.data(), *sampled_tokens_, 0, static_cast<size_t>(n) * 4);
  return tokens;
}

Tensor DeepseekV3::finish(Activations& a, int64_t rows) {
  last_logit_rows_ = rows;
  if (shard_.last_stage && head_mode_ == HeadMode::kGreedy) return greedy_to_host(a, rows);
  if (shard_.last_stage && head_mode_ == HeadMode::kCandidates) {
    candidates_to_host(a, rows);
    return Tensor();
  }
  if (shard_.last_stage && head_mode_ == HeadMode::kSampled) {
    std::vector<int64_t> all(static_cast<size_t>(rows));
    std::iota(all.begin(), all.end(), int64_t{0});
    const std::vector<int32_t> drawn = sample_logits_rows(all, sampling_);
    Tensor tokens(DType::I32, {rows});
    std::copy(drawn.begin(), drawn.end(), tokens.i32());
    return tokens;
  }
  if (shard_.last_stage && return_logits_) return logits_to_host(a, rows);
  backend_.synchronize();
  return Tensor();
}

void DeepseekV3::run(Activations& a, int64_t logit_rows, int64_t max_pages_per_seq) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (shard_.first_stage) {
    // [T, hidden]: each attention-TP rank embeds its vocab rows; the sum is the embedding.
    backend_.embedding({static_cast<const int32_t*>(ptr(a.ids)), ptr(embed_), ptr(a.hidden), T, hidden,
                        shard_.vocab.begin, shard_.vocab.end});
    all_reduce(groups_.attn_tp, *a.hidden, T * hidden, "embedding", backend_.activation_dtype());
  }
  int64_t moe_layer = 0;
  // normed = input_norm(hidden) for the first layer; after that, every residual add is fused
  // with the norm that follows it (the next branch's input). The stage's last add stands
  // alone: the next stage, or the head (on the selected rows), normalises.
  if (!layers_.empty())
    backend_.rms_norm({ptr(a.hidden), ptr(layers_[0]->input_norm), ptr(a.normed), T, hidden, hidden, hidden, eps});
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    add_branch(attention(layer, static_cast<int64_t>(i), a, max_pages_per_seq), a, ptr(layer.post_attention_norm));
    const BranchSum mlp = layer.is_moe ? moe(layer, moe_layer++, a) : dense_mlp(layer, a);
    add_branch(mlp, a, i + 1 < layers_.size() ? ptr(layers_[i + 1]->input_norm) : nullptr);
  }
  if (shard_.last_stage) lm_head(a, logit_rows);
}

void DeepseekV3::add_branch(const BranchSum& sum, Activations& a, const void* norm_weight) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const void* branch = ptr(a.branch);
  if (reduction_plan_on()) {
    // The parts' tree, then the residual add and norm on one rank's kernels whatever the plan.
    branch = sum_parts(sum, a);
  } else {
    if (norm_weight != nullptr && sum.group != nullptr && sum.group->size() > 1 && T > 0) {
      sum.group->set_site(sum.site);
      const comm::ResidualNorm fused{ptr(a.hidden), norm_weight, ptr(a.normed), T, hidden, eps};
      comm::FusedAllReduceNorm* fused_path = comm::fused_all_reduce_norm(*sum.group);
      if (fused_path != nullptr && fused_path->all_reduce_add_rms_norm(static_cast<float*>(ptr(a.branch)), fused))
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

namespace {

// parts[0] = the pairwise tree sum of parts [n, count] fp32: ((p0 + p1) + (p2 + p3)) + ...
// (n a power of two). A rank holding parts [r * n, (r + 1) * n) of a larger tree computes
// that tree's subtree, so the ranks' results added in the same tree give the whole tree.
void tree_sum(ops::Backend& backend, std::byte* parts, int n, int64_t count) {
  for (int step = 1; step < n; step *= 2)
    for (int i = 0; i + step < n; i += 2 * step) {
      ops::AddParams add{parts + i * count * 4, parts + (i + step) * count * 4, count};
      add.acc_f32 = true;
      backend.add(add);
    }
}

}  // namespace

const void* DeepseekV3::sum_parts(const BranchSum& sum, Activations& a) {
  const int64_t count = a.tokens * config_.hidden_size;
  if (parts_ > 1) tree_sum(backend_, bytes(a.branch_parts), parts_, count);
  const int ranks = sum.group ? sum.group->size() : 1;
  if (ranks <= 2) {  // two ranks: one fp32 addition, the same bits in either order
    all_reduce(sum.group, *a.branch, count, sum.site, DType::F32);
    return ptr(a.branch);
  }
  // A ring all-reduce adds in ring order: gather the ranks' sums and add them in the tree.
  sum.group->set_site(sum.site);
  sum.group->all_gather(ptr(a.branch), ptr(a.branch_gather), static_cast<size_t>(count), DType::F32);
  tree_sum(backend_, bytes(a.branch_gather), ranks, count);
  return ptr(a.branch_gather);
}

void DeepseekV3::lm_head(Activations& a, int64_t rows) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, vocab_part = shard_.vocab.size() / parts_;
  // selected [rows, hidden] = norm(hidden[logit_rows]); local logits [parts, rows, vocab_part] fp32.
  backend_.gather_rows({ptr(a.hidden), static_cast<const int32_t*>(ptr(a.logit_rows)), ptr(a.selected), rows, hidden});
  backend_.rms_norm({ptr(a.selected), ptr(final_norm_), ptr(a.selected), rows, hidden, hidden, hidden,
                     static_cast<float>(c.rms_norm_eps)});
  auto logits_of = [&](int v) { return bytes(a.local_logits) + v * rows * vocab_part * 4; };
  for (int v = 0; v < parts_; ++v) {
    ops::LinearParams head{ptr(a.selected), ptr(lm_head_[v]), logits_of(v), rows, hidden, vocab_part, hidden,
                           vocab_part};
    head.y_f32 = true;
    backend_.linear(head);
  }
  const int64_t capacity = std::max<int64_t>(head_rows_, 1);
  if (head_mode_ == HeadMode::kCandidates) {
    // Each row's top candidates of each vocab part, then (vocab split) every part's on every rank.
    const int64_t n = candidates_per_slice();
    for (int v = 0; v < parts_; ++v)
      backend_.top_candidates({reinterpret_cast<const float*>(logits_of(v)),
                               static_cast<const float*>(ptr(a.temperatures)),
                               reinterpret_cast<float*>(bytes(a.cand_values) + v * rows * n * 4),
                               reinterpret_cast<int32_t*>(bytes(a.cand_ids) + v * rows * n * 4),
                               reinterpret_cast<double*>(bytes(a.cand_normaliser) + v * rows * 8), rows, vocab_part, n,
                               shard_.vocab.begin + v * vocab_part});
    if (a.gathered_cand_values) {
      comm::Communicator& tp = *groups_.attn_tp;
      tp.set_site("lm_head");
      tp.all_gather(ptr(a.cand_values), ptr(a.gathered_cand_values), static_cast<size_t>(parts_ * rows * n), DType::F32);
      tp.all_gather(ptr(a.cand_ids), ptr(a.gathered_cand_ids), static_cast<size_t>(parts_ * rows * n), DType::I32);
      // fp64 normalisers travel as pairs of 4-byte words.
      tp.all_gather(ptr(a.cand_normaliser), ptr(a.gathered_cand_normaliser), static_cast<size_t>(2 * parts_ * rows),
                    DType::F32);
    }
    return;
  }
  if (head_mode_ == HeadMode::kGreedy) {
    // Per part: values [capacity] then ids [capacity].
    for (int v = 0; v < parts_; ++v) {
      std::byte* pairs = bytes(a.greedy_pairs) + v * 2 * capacity * 4;
      backend_.argmax_rows({reinterpret_cast<const float*>(logits_of(v)), reinterpret_cast<float*>(pairs),
                            reinterpret_cast<int32_t*>(pairs + capacity * 4), rows, vocab_part,
                            shard_.vocab.begin + v * vocab_part});
    }
    if (a.gathered_pairs) {  // values and ids in one collective (the whole capacity: a few KB)
      groups_.attn_tp->set_site("lm_head");
      groups_.attn_tp->all_gather(ptr(a.greedy_pairs), ptr(a.gathered_pairs), static_cast<size_t>(parts_ * 2 * capacity),
                                  DType::F32);
    }
    return;
  }
  if (a.gathered_logits && head_mode_ == HeadMode::kLogits) {
    groups_.attn_tp->set_site("lm_head");
    groups_.attn_tp->all_gather(ptr(a.local_logits), ptr(a.gathered_logits),
                                static_cast<size_t>(rows * shard_.vocab.size()), DType::F32);
  }
}

Tensor DeepseekV3::logits_to_host(Activations& a, int64_t rows) {
  const int64_t vocab = config_.vocab_size, slice = vocab / vocab_slices();
  Tensor logits(DType::F32, {rows, vocab});
  if (vocab_slices() == 1) {
    if (rows) backend_.download(logits.raw(), *a.local_logits, 0, logits.nbytes());
    return logits;
  }
  // [slices, rows, slice] (the ranks' parts in order) -> [rows, vocab]; the plan and
  // check_reduction_plan guarantee vocab % slices == 0.
  Tensor host(DType::F32, {vocab_slices(), rows, slice});
  if (rows) backend_.download(host.raw(), a.gathered_logits ? *a.gathered_logits : *a.local_logits, 0, host.nbytes());
  for (int k = 0; k < vocab_slices(); ++k)
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(logits.f32() + row * vocab + k * slice, host.f32() + (k * rows + row) * slice, slice * sizeof(float));
  return logits;
}

DeepseekV3::BranchSum DeepseekV3::attention(const Layer& layer, int64_t local_layer, Activations& a,
                                            int64_t max_pages_per_seq) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  const int64_t heads = shard_.heads.size() / parts_;  // per part
  const int64_t qk = c.qk_head_dim(), nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t latent = c.kv_lora_rank, width = latent + rope;
  const size_t act = dtype_size(backend_.activation_dtype());
  const float eps = static_cast<float>(c.rms_norm_eps);

  const auto* positions = static_cast<const int32_t*>(ptr(a.positions));
  const auto* inv_freq = static_cast<const float*>(ptr(inv_freq_));
  const float attention_factor = static_cast<float>(c.rope_attention_factor());
  ops::Buffer& cache = *kv_cache_[local_layer];
  // The cache entry (kv path) is computed on the side stream beside the q path: two chains of
  // short kernels whose launch and ramp latencies overlap. Both end before attention.
  // kv [T, latent + rope] becomes the cache entry in place: norm(kv[:, :latent]), rope(kv[:, latent:]).
  backend_.side_begin();
  backend_.linear({ptr(a.normed), ptr(layer.kv_a_proj), ptr(a.kv), T, hidden, width, hidden, width});
  backend_.rms_norm({ptr(a.kv), ptr(layer.kv_a_norm), ptr(a.kv), T, latent, width, width, eps});
  backend_.rope({bytes(a.kv) + latent * act, positions, inv_freq, T, 1, width, width, rope, attention_factor,
                 c.rope_interleave});
  backend_.kv_write({ptr(a.kv), static_cast<const int32_t*>(ptr(a.slots)), cache.data(), T, width});
  backend_.side_end();

  if (c.q_lora_rank > 0) {  // q_a path: replicated, once for every part
    backend_.linear({ptr(a.normed), ptr(layer.q_a_proj), ptr(a.q_a), T, hidden, c.q_lora_rank, hidden, c.q_lora_rank});
    backend_.rms_norm({ptr(a.q_a), ptr(layer.q_a_norm), ptr(a.q_a_normed), T, c.q_lora_rank, c.q_lora_rank,
                       c.q_lora_rank, eps});
  }
  for (int v = 0; v < parts_; ++v) {
    const LayerPart& part = layer.parts[v];
    // q: [T, heads, qk] = (q LoRA ? q_b(norm(q_a(x))) : q_proj(x)) for this part's heads.
    if (c.q_lora_rank > 0) {
      backend_.linear({ptr(a.q_a_normed), ptr(part.q_b_proj), ptr(a.q), T, c.q_lora_rank, heads * qk, c.q_lora_rank,
                       heads * qk});
    } else {
      backend_.linear({ptr(a.normed), ptr(part.q_proj), ptr(a.q), T, hidden, heads * qk, hidden, heads * qk});
    }
    backend_.rope({bytes(a.q) + nope * act, positions, inv_freq, T, heads, heads * qk, qk, rope, attention_factor,
                   c.rope_interleave});
    // Absorbed MLA: attend in the latent space, then up-project values per head.
    backend_.mla_q_absorb({ptr(a.q), ptr(part.kv_b_proj), ptr(a.q_latent), T, heads, qk, nope, c.v_head_dim, latent});
    if (v == 0) backend_.side_join();
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
    attn.max_pages_per_seq = max_pages_per_seq;
    attn.scale = static_cast<float>(c.attention_scale());
    backend_.mla_attention(attn);
    backend_.mla_v_up({ptr(a.attn_latent), ptr(part.kv_b_proj), ptr(a.attn_v), T, heads, nope, c.v_head_dim, latent});
    // [T, hidden] partial over this part's heads, summed over the parts and attention TP.
    ops::LinearParams o_proj{ptr(a.attn_v), ptr(part.o_proj), branch_part(a, v), T, heads * c.v_head_dim, hidden,
                            heads * c.v_head_dim, hidden};
    o_proj.y_f32 = true;
    backend_.linear(o_proj);
  }
  return {groups_.attn_tp, "attention"};
}

DeepseekV3::BranchSum DeepseekV3::dense_mlp(const Layer& layer, Activations& a) {
  const int64_t T = a.tokens, hidden = config_.hidden_size, inter = layer.mlp_inter;
  for (int v = 0; v < parts_; ++v) {
    // [T, 2 * inter] -> [T, inter] -> [T, hidden] partial over this part's columns.
    const LayerPart& part = layer.parts[v];
    backend_.linear({ptr(a.normed), ptr(part.mlp_w13), ptr(a.gate_up), T, hidden, 2 * inter, hidden, 2 * inter});
    backend_.silu_mul({ptr(a.gate_up), ptr(a.act), T, inter});
    ops::LinearParams down{ptr(a.act), ptr(part.mlp_w2), branch_part(a, v), T, inter, hidden, inter, hidden};
    down.y_f32 = true;
    backend_.linear(down);
  }
  return {groups_.attn_tp, "dense_mlp"};
}

void DeepseekV3::shared_experts(const Layer& layer, const LayerPart& part, Activations& a, void* out,
                                bool accumulate) {
  if (!part.mlp_w13) return;
  const int64_t T = a.tokens, hidden = config_.hidden_size, inter = layer.mlp_inter;
  // out [T, hidden] (+)= down(silu(gate(x)) * up(x)) over this part's shared-expert columns.
  backend_.linear({ptr(a.normed), ptr(part.mlp_w13), ptr(a.gate_up), T, hidden, 2 * inter, hidden, 2 * inter});
  backend_.silu_mul({ptr(a.gate_up), ptr(a.act), T, inter});
  ops::LinearParams down{ptr(a.act), ptr(part.mlp_w2), out, T, inter, hidden, inter, hidden};
  down.accumulate = accumulate;
  down.y_f32 = true;
  backend_.linear(down);
}

void* DeepseekV3::branch_part(Activations& a, int v) const {
  return bytes(a.branch) + static_cast<int64_t>(v) * a.tokens * config_.hidden_size * 4;
}

DeepseekV3::BranchSum DeepseekV3::moe(const Layer& layer, int64_t moe_layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size;
  if (plan_.attn_dp > 1) return moe_dispatch_combine(layer, moe_layer, a);
  // Every rank of the stage holds every token (attention TP): route locally, run the owned
  // experts' column slices, add the shared experts' column slice, one all-reduce sums all.
  // The shared experts write the branch on the side stream while the router runs; the routed
  // sum is then added to it in one fp32 addition (shared + routed, the same bits as routed +
  // shared in transformers' order). Joining later, inside the routed experts (before their
  // sum), was slower at batch 64 in the run that tried it (16.96 against 16.04 ms per step,
  // K2.6 x3 on one H200, separate runs) and no faster at batch 1.
  const LayerPart& first = layer.parts[0];
  const bool has_shared = first.mlp_w13 != nullptr;
  backend_.side_begin();
  shared_experts(layer, first, a, branch_part(a, 0), /*accumulate=*/false);
  backend_.side_end();
  ops::MoeRouteParams route{ptr(a.normed), static_cast<const float*>(ptr(layer.router)),
                            static_cast<const float*>(ptr(layer.router_bias)), static_cast<int32_t*>(ptr(a.topk_ids)),
                            static_cast<float*>(ptr(a.topk_weights)), T, hidden, c.n_routed_experts, c.n_group,
                            c.topk_group, c.num_experts_per_tok, c.norm_topk_prob,
                            static_cast<float>(c.routed_scaling_factor)};
  backend_.moe_route(route);
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
    ops::MoeExpertsParams experts{};
    experts.x = ptr(a.normed);
    experts.topk_ids = static_cast<const int32_t*>(ptr(a.topk_ids));
    experts.topk_weights = static_cast<const float*>(ptr(a.topk_weights));
    experts.w13 = static_cast<const void* const*>(ptr(part.expert_w13_table));
    experts.w2 = static_cast<const void* const*>(ptr(part.expert_w2_table));
    experts.w13_host = part.expert_w13_ptrs.data();
    experts.w2_host = part.expert_w2_ptrs.data();
    experts.out = branch_part(a, v);
    experts.tokens = T;
    experts.top_k = c.num_experts_per_tok;
    experts.hidden = hidden;
    experts.inter = part.expert_cols.size();
    experts.expert_begin = part.experts.begin;
    experts.expert_end = part.experts.end;
    experts.routed_experts = c.n_routed_experts;
    experts.out_f32 = true;
    experts.accumulate = has_shared;
    backend_.moe_experts(experts);
  }
  return {groups_.moe, "moe"};
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
// Rows move in backend memory (gather_rows, all_to_all_v, row_combine); only the routing
// and the row counts come to the host to lay the exchange out.
DeepseekV3::BranchSum DeepseekV3::moe_dispatch_combine(const Layer& layer, int64_t moe_layer, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = a.tokens, hidden = c.hidden_size, top_k = c.num_experts_per_tok;
  const int ranks = plan_.ranks_per_stage();
  const int moe_tp = plan_.moe_tp;
  const int64_t experts_per_group = c.n_routed_experts / plan_.moe_ep;
  const DType act_dtype = backend_.activation_dtype();
  const size_t act = dtype_size(act_dtype);
  comm::Communicator& moe = *groups_.moe;
  auto alloc = [&](int64_t elements, size_t elem) { return backend_.alloc(std::max<int64_t>(elements, 1) * elem); };
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    BufferPtr b = alloc(static_cast<int64_t>(v.size()), 4);
    if (!v.empty()) backend_.upload(*b, 0, v.data(), v.size() * 4);
    return b;
  };

  // 1. This rank's share of the replica's tokens: rows [mine.begin, mine.end) of normed.
  const Range mine = parallel::split_range(T, plan_.attn_tp, shard_.coord.tp_index);
  const int64_t n_mine = mine.size();
  ops::MoeRouteParams route{bytes(a.normed) + mine.begin * hidden * act, static_cast<const float*>(ptr(layer.router)),
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
  if (record_routing_) record_routing(moe_layer, topk_ids.data(), topk_ids.size());

  // (token, k) pairs per expert, in token then k order.
  std::vector<std::vector<int64_t>> by_expert(c.n_routed_experts);  // entries: i * top_k + k
  for (int64_t i = 0; i < n_mine; ++i)
    for (int64_t k = 0; k < top_k; ++k) by_expert[topk_ids[i * top_k + k]].push_back(i * top_k + k);

  // 2. Row counts per (destination rank, expert of its group); where each (i, k, j) row sits.
  std::vector<int32_t> send_expert_counts(ranks * experts_per_group);   // [ranks, experts_per_group]
  std::vector<size_t> send_rows(ranks, 0);
  std::vector<int32_t> send_source_rows;                                // sent row -> row of normed
  std::vector<int64_t> position(n_mine * top_k * moe_tp);               // (i * top_k + k) * moe_tp + j -> sent row
  for (int dest = 0; dest < ranks; ++dest) {
    const int64_t group = dest / moe_tp, j = dest % moe_tp;
    for (int64_t le = 0; le < experts_per_group; ++le) {
      const auto& rows = by_expert[group * experts_per_group + le];
      send_expert_counts[dest * experts_per_group + le] = static_cast<int32_t>(rows.size());
      send_rows[dest] += rows.size();
      for (int64_t ik : rows) {
        position[ik * moe_tp + j] = static_cast<int64_t>(send_source_rows.size());
        send_source_rows.push_back(static_cast<int32_t>(mine.begin + ik / top_k));
      }
    }
  }
  std::vector<int32_t> recv_expert_counts(ranks * experts_per_group);  // [ranks (source), experts_per_group]
  const std::vector<size_t> count_blocks(ranks, static_cast<size_t>(experts_per_group));
  {
    // Counts travel through backend memory like every other payload.
    BufferPtr send_counts = upload_i32(send_expert_counts), recv_counts = alloc(ranks * experts_per_group, 4);
    moe.set_site("moe_counts");
    moe.all_to_all_v(send_counts->data(), count_blocks, recv_counts->data(), count_blocks, DType::I32);
    backend_.download(recv_expert_counts.data(), *recv_counts, 0, recv_expert_counts.size() * 4);
  }
  std::vector<size_t> recv_rows(ranks, 0);
  for (int src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < experts_per_group; ++le) recv_rows[src] += recv_expert_counts[src * experts_per_group + le];

  // 3. Dispatch the rows: send [sent, hidden] gathered from normed.
  const int64_t sent = static_cast<int64_t>(send_source_rows.size());
  int64_t received = 0;
  for (size_t n : recv_rows) received += static_cast<int64_t>(n);
  BufferPtr send_x = alloc(sent * hidden, act);      // [sent, hidden]
  BufferPtr recv_x = alloc(received * hidden, act);  // [received, hidden]
  BufferPtr source_rows = upload_i32(send_source_rows);
  backend_.gather_rows({ptr(a.normed), static_cast<const int32_t*>(source_rows->data()), send_x->data(), sent, hidden});
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
  BufferPtr ids_buffer = upload_i32(recv_ids), ones_buffer = alloc(received, 4);
  if (received) backend_.upload(*ones_buffer, 0, ones.data(), ones.size() * 4);
  BufferPtr expert_out = alloc(received * hidden, act);  // [received, hidden]
  ops::MoeExpertsParams experts{};
  experts.x = recv_x->data();
  experts.topk_ids = static_cast<const int32_t*>(ids_buffer->data());
  experts.topk_weights = static_cast<const float*>(ones_buffer->data());
  const LayerPart& part = layer.parts[0];  // attention DP: no reduction plan, one part
  experts.w13 = static_cast<const void* const*>(ptr(part.expert_w13_table));
  experts.w2 = static_cast<const void* const*>(ptr(part.expert_w2_table));
  experts.w13_host = part.expert_w13_ptrs.data();
  experts.w2_host = part.expert_w2_ptrs.data();
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
  //    As CSR per branch row: offsets [T + 1], the combined rows and their weights.
  std::vector<int32_t> offsets(T + 1, 0), rows_of;
  std::vector<float> weights_of;
  for (int64_t t = 0; t < T; ++t) {
    offsets[t] = static_cast<int32_t>(rows_of.size());
    if (!mine.contains(t)) continue;
    const int64_t i = t - mine.begin;
    for (int64_t k = 0; k < top_k; ++k)
      for (int j = 0; j < moe_tp; ++j) {
        rows_of.push_back(static_cast<int32_t>(position[(i * top_k + k) * moe_tp + j]));
        weights_of.push_back(topk_weights[i * top_k + k]);
      }
  }
  offsets[T] = static_cast<int32_t>(rows_of.size());
  BufferPtr offsets_buffer = upload_i32(offsets), rows_buffer = upload_i32(rows_of);
  BufferPtr weights_buffer = alloc(static_cast<int64_t>(weights_of.size()), 4);
  if (!weights_of.empty()) backend_.upload(*weights_buffer, 0, weights_of.data(), weights_of.size() * 4);
  ops::RowCombineParams combine{combined->data(), static_cast<const int32_t*>(offsets_buffer->data()),
                                static_cast<const int32_t*>(rows_buffer->data()),
                                static_cast<const float*>(weights_buffer->data()), ptr(a.branch), T, hidden};
  combine.out_f32 = true;
  backend_.row_combine(combine);
  shared_experts(layer, part, a, ptr(a.branch), /*accumulate=*/true);
  backend_.synchronize();  // the exchange buffers above are freed on return
  return {groups_.attn_tp, "moe"};
}

}  // namespace moeserve
