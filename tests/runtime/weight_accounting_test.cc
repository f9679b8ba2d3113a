// Per-rank weight accounting (model/deepseek_v3_weights.h), the numbers behind `plan show`:
//   * it matches what DeepseekV3 actually loads, on every rank of every preset;
//   * owned bytes summed over ranks equal the model's total (count_parameters x 2 in bf16):
//     every parameter has exactly one owner;
//   * held bytes summed over ranks equal the total plus the replicas, and the replicas are
//     exactly the tensors the plan replicates (computed here from the architecture).
#include <gtest/gtest.h>

#include "model/deepseek_v3_weights.h"
#include "parallel/plan_parse.h"
#include "tests/runtime/rank_model.h"

namespace moeserve {
namespace {

struct Totals {
  int64_t held = 0, owned = 0;
};

Totals totals(const ModelConfig& c, const parallel::ParallelPlan& plan) {
  Totals t;
  for (int r = 0; r < plan.world(); ++r) {
    const RankWeights w = rank_weights(c, plan, r);
    t.held += w.held_elements;
    t.owned += w.owned_elements;
  }
  return t;
}

// Parameters every rank of a stage holds whole, summed over all layers (+ the final norm):
// the two layer norms, the MLA latent projection (q_a, kv_a and their norms) and the router.
int64_t stage_replicated(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  int64_t per_layer = 2 * h + (c.kv_lora_rank + c.qk_rope_head_dim) * h + c.kv_lora_rank;
  if (c.q_lora_rank > 0) per_layer += c.q_lora_rank * h + c.q_lora_rank;
  const int64_t router = c.n_routed_experts * h + c.n_routed_experts;
  return c.num_hidden_layers * per_layer + c.num_moe_layers() * router + h;
}

TEST(WeightAccounting, MatchesWhatEachRankLoads) {
  const ModelSource model = open_model("synthetic:tiny");
  const int64_t total = count_parameters(model.config).total;
  for (const std::string& name : parallel::preset_names(8)) {
    const parallel::ParallelPlan plan = parallel::parse_plan(name);
    auto loaded = testing::load_plan(model, plan, [](std::unique_ptr<WeightSource> w) { return w; });
    for (int r = 0; r < plan.world(); ++r)
      EXPECT_EQ(loaded.ranks[r].model->weight_bytes(), rank_weights(model.config, plan, r).held_elements * 4)
          << name << " rank " << r;  // fp32 on CPU
    EXPECT_EQ(totals(model.config, plan).owned, total) << name;
  }
}

TEST(WeightAccounting, TiedEmbeddingsAreOwnedOnce) {
  ModelConfig c = synthetic_config("tiny");
  c.tie_word_embeddings = true;
  const int64_t total = count_parameters(c).total;
  for (const char* name : {"single", "pp2", "tp2pp2", "ep4-dp"}) {
    const parallel::ParallelPlan plan = parallel::parse_plan(name);
    EXPECT_EQ(totals(c, plan).owned, total) << name;
    // The head re-reads the embedding on the last stage: a replica of vocab x hidden per replica.
    ModelConfig untied = c;
    untied.tie_word_embeddings = false;
    EXPECT_EQ(totals(c, plan).held, totals(untied, plan).held) << name;
  }
}

// Kimi K2.6 (1.03 T parameters): the plans of docs/plans.md.
TEST(WeightAccounting, KimiK26RanksAddUpToTheModel) {
  const ModelConfig c = synthetic_config("kimi-k2.6");
  const int64_t total = count_parameters(c).total;
  const int64_t everything_but_experts = total - count_parameters(c).routed_experts;
  struct Case {
    const char* plan;
    int64_t replicas;  // parameters held beyond the one owned copy, over all ranks
  };
  const Case cases[] = {
      {"tp8", 7 * stage_replicated(c)},                    // 8 ranks hold the stage-replicated tensors
      {"ep8", 7 * stage_replicated(c)},                    // same attention layout as tp8
      {"ep4tp2", 7 * stage_replicated(c)},    {"pp8", 0},  // every layer on one stage, nothing shared
      {"ep8-dp", 7 * everything_but_experts},              // attention, dense and shared experts on every rank
  };
  for (const Case& k : cases) {
    const parallel::ParallelPlan plan = parallel::parse_plan(k.plan);
    const Totals t = totals(c, plan);
    EXPECT_EQ(t.owned, total) << k.plan;
    EXPECT_EQ(t.held, total + k.replicas) << k.plan;
  }
  // tp8: every rank holds the stage-replicated tensors whole and 1/8 of everything else
  // (heads, vocab, dense and shared columns, expert columns all divide by 8).
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(rank_weights(c, parallel::parse_plan("tp8"), r).held_elements,
              stage_replicated(c) + (total - stage_replicated(c)) / 8)
        << "rank " << r;
  EXPECT_EQ(kv_bytes_per_token(c, parallel::parse_plan("tp8"), 0, 2), 61 * (512 + 64) * 2);
  EXPECT_EQ(kv_bytes_per_token(c, parallel::parse_plan("pp8"), 0, 2), 8 * (512 + 64) * 2);
  EXPECT_EQ(kv_bytes_per_token(c, parallel::parse_plan("pp8"), 7, 2), 7 * (512 + 64) * 2);
}

// Kimi K2.6 as published (tests/data/configs): the routed experts are stored INT4, group 32
// (N*K/2 bytes + bf16 scales N*K/32*2); everything else stays bf16. Every rank of every plan
// counts its slices so, and the owned bytes add up to the checkpoint's size.
TEST(WeightAccounting, KimiK26Int4ExpertsCountAsStored) {
  const ModelConfig c = ModelConfig::from_file("tests/data/configs/kimi-k2.6.config.json");
  const ParameterCounts p = count_parameters(c);
  const int64_t stored = (p.total - p.routed_experts) * 2 + p.routed_experts / 2 + p.routed_experts / 32 * 2;
  EXPECT_EQ(stored_model_bytes(c), stored);
  for (const char* name : {"tp8", "ep8", "ep4tp2", "pp8", "ep8-dp"}) {
    const parallel::ParallelPlan plan = parallel::parse_plan(name);
    int64_t owned = 0;
    for (int r = 0; r < plan.world(); ++r) owned += rank_weights(c, plan, r).owned_bytes;
    EXPECT_EQ(owned, stored) << name;
  }
  ModelConfig bf16 = c;
  bf16.quantization = {};
  EXPECT_EQ(stored_model_bytes(bf16), p.total * 2);
  // Only the routed experts' projections are quantized.
  for (const WeightSlice& s : weight_slices_of_rank(c, parallel::parse_plan("ep8"), 0)) {
    const bool expert = s.name.find(".mlp.experts.") != std::string::npos;
    EXPECT_EQ(s.format.method, expert ? QuantMethod::int4_pack_quantized : QuantMethod::none) << s.name;
  }
}

// rank_weights lists each layer's routed experts as one slice per projection with a count; the
// sums must equal those over every expert's own slice, on every rank of plans that split the
// experts (EP), their columns (TP) and the layers (PP).
TEST(WeightAccounting, ExpertsListedOncePerLayerCountLikeEachExpert) {
  const ModelConfig c = ModelConfig::from_file("tests/data/configs/kimi-k2.6.config.json");
  for (const char* name : {"single", "tp8", "ep8", "ep4tp2", "pp8", "ep8-dp"}) {
    const parallel::ParallelPlan plan = parallel::parse_plan(name);
    for (int r = 0; r < plan.world(); ++r) {
      RankWeights each;
      for (const WeightSlice& s : weight_slices_of_rank(c, plan, r, 2, ExpertSlices::each)) {
        ASSERT_EQ(s.count, 1) << s.name;
        each.held_elements += s.elements;
        each.held_bytes += s.bytes();
        each.owned_elements += s.owned ? s.elements : 0;
        each.owned_bytes += s.owned ? s.bytes() : 0;
      }
      const RankWeights grouped = rank_weights(c, plan, r);
      EXPECT_EQ(grouped.held_elements, each.held_elements) << name << " rank " << r;
      EXPECT_EQ(grouped.held_bytes, each.held_bytes) << name << " rank " << r;
      EXPECT_EQ(grouped.owned_elements, each.owned_elements) << name << " rank " << r;
      EXPECT_EQ(grouped.owned_bytes, each.owned_bytes) << name << " rank " << r;
    }
  }
}

// The largest architecture validate() accepts (4096 layers of 65536 experts: 805 M expert
// tensors, which the config fuzz target once listed one by one until it ran out of memory) is
// counted from 17 slices per layer, and its bytes agree with count_parameters.
TEST(WeightAccounting, LargestAcceptedConfigIsCountedPerLayer) {
  ModelConfig c = ModelConfig::from_file("tests/data/configs/kimi-k2.6.config.json");
  c.quantization = {};
  c.hidden_size = 16;
  c.num_attention_heads = 1;
  c.q_lora_rank = 8;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = c.qk_rope_head_dim = c.v_head_dim = 2;
  c.vocab_size = 32;
  c.intermediate_size = c.moe_intermediate_size = 2;
  c.num_hidden_layers = 4096;
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 65536;
  c.n_group = 1;
  c.topk_group = 1;
  c.validate();
  const std::vector<WeightSlice> slices =
      weight_slices_of_rank(c, parallel::parse_plan("single"), 0, 2, ExpertSlices::one_per_layer);
  EXPECT_LT(slices.size(), size_t{20} * 4096);
  EXPECT_EQ(stored_model_bytes(c), count_parameters(c).total * 2);
}

}  // namespace
}  // namespace moeserve
