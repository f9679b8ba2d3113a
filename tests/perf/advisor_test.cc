// The advisor's pieces against hand-computed expectations (tiny config: 8 layers, 1 dense,
// 16 routed experts, top 4).
#include "perf/advisor.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"
#include "perf/step_cost.h"

namespace moeserve::perf {
namespace {

// Every op streams at 1000 bytes/us, computes at 1e6 FLOP/us, no fixed costs, collectives of
// 5 us latency and (practically) infinite bandwidth.
HardwareProfile simple_profile() {
  HardwareProfile p;
  p.name = "simple";
  p.devices = 8;
  p.memory_bytes = 1e12;
  p.memory_gbs = 1;
  p.matmul_tflops = 1;
  p.element_bytes = 2;
  p.weight_efficiency.points = {{1, 1.0}};
  p.kv_efficiency.points = {{1, 1.0}};
  p.matmul_efficiency.points = {{1, 1.0}};
  p.prefill_efficiency.points = {{1, 1.0}};
  p.link.topology = "nvlink_switch";
  p.link.alpha_us.points = {{2, 5}};
  p.link.link_gbs = 1e9;
  return p;
}

TEST(Advisor, ExpectedNormalMax) {
  EXPECT_NEAR(expected_normal_max(2), 1 / std::sqrt(M_PI), 1e-4);
  EXPECT_EQ(expected_normal_max(1), 0.0);
}

TEST(Advisor, UniformRoutingMeanGroup) {
  const ModelConfig c = synthetic_config("tiny");
  // One token picks 4 of 16 experts: p = 1/4 each; a group of 4 experts gets 1 hit and 1 row on average.
  const RoutedWork w = routed_work(c, 4, 1, {}, false);
  EXPECT_NEAR(w.experts_hit, 1.0, 1e-12);
  EXPECT_NEAR(w.rows, 1.0, 1e-12);
  // 100 tokens: every expert is hit (1 - 0.75^100 ~ 1), 100 rows per group.
  const RoutedWork many = routed_work(c, 4, 100, {}, false);
  EXPECT_NEAR(many.experts_hit, 4.0, 1e-9);
  EXPECT_NEAR(many.rows, 100.0, 1e-9);
}

TEST(Advisor, BusiestGroupUnderUniformAndMeasuredLoads) {
  const ModelConfig c = synthetic_config("tiny");
  // 2 groups, 64 tokens: rows per group 128 (mean), variance 64 x 8 x 1/4 x 3/4 = 96;
  // busiest = 128 + sqrt(96) / sqrt(pi).
  const RoutedWork w = routed_work(c, 2, 64, {}, true);
  EXPECT_NEAR(w.rows, 128 + std::sqrt(96.0) / std::sqrt(M_PI), 1e-3);
  // All load on experts 0..3 (group 0 of 4): each token's 4 rows land there (p = 1 each).
  std::vector<double> loads(16, 0.0);
  for (int e = 0; e < 4; ++e) loads[e] = 1;
  const RoutedWork skewed = routed_work(c, 4, 10, loads, true);
  EXPECT_NEAR(skewed.rows, 40.0, 1e-9);  // 10 tokens x 4 experts each, all in group 0
  EXPECT_NEAR(skewed.experts_hit, 4.0, 1e-9);
}

TEST(Advisor, SingleRankRooflineIsBytesOverBandwidth) {
  const ModelConfig c = synthetic_config("tiny");
  const parallel::ParallelPlan single;
  const HardwareProfile p = simple_profile();
  ForwardShape shape;
  shape.replica_tokens = shape.stage_tokens = 1;
  shape.context = 100;
  const StepSplit s = stage_time(c, single, p, 0, shape, {});
  // One token hits 4 experts in every MoE layer (4 of 16, p = 1/4 each: expected 4 distinct).
  StepShape cost_shape;
  cost_shape.context = 100;
  cost_shape.experts_hit.assign(c.num_moe_layers(), 4);
  const StepCost cost = decode_step_cost(c, parallel::shard_of(single, shard_dims(c), 0), cost_shape, 2, 2);
  EXPECT_NEAR(s.weights_us, (cost.weight_bytes + cost.activation_bytes) / 1000, 1e-9);
  EXPECT_NEAR(s.kv_us, cost.kv_bytes / 1000, 1e-9);
  // At one token the FLOPs (2 per weight) take far less than the bytes (2 per weight) at 1000x the rate.
  EXPECT_EQ(s.flops_us, 0.0);
  EXPECT_TRUE(s.collectives_us.empty());
}

// An fp8 KV cache (--kv-cache-dtype fp8_e4m3) reads one byte per cached element: half the KV
// time of the profile's bf16, the weights' time unchanged.
TEST(Advisor, Fp8KvCacheHalvesTheKvRead) {
  const ModelConfig c = synthetic_config("tiny");
  const parallel::ParallelPlan single;
  const HardwareProfile p = simple_profile();
  ForwardShape shape;
  shape.replica_tokens = shape.stage_tokens = 1;
  shape.context = 100;
  const StepSplit bf16 = stage_time(c, single, p, 0, shape, {});
  shape.kv_element_bytes = 1;
  const StepSplit fp8 = stage_time(c, single, p, 0, shape, {});
  EXPECT_GT(bf16.kv_us, 0.0);
  EXPECT_NEAR(fp8.kv_us, bf16.kv_us / 2, 1e-9);
  EXPECT_NEAR(fp8.weights_us, bf16.weights_us, 1e-9);
}

TEST(Advisor, TensorParallelCollectivesAreLatencyTimesCalls) {
  const ModelConfig c = synthetic_config("tiny");
  const HardwareProfile p = simple_profile();
  ForwardShape shape;
  const StepSplit s = stage_time(c, parallel::parse_plan("tp2"), p, 0, shape, {});
  // attention: one all-reduce per layer (8) + the dense layer's MLP (1); MoE: one per MoE layer (7);
  // embedding all-reduce and LM-head all-gather once: 5 us each (bandwidth ~ infinite).
  EXPECT_NEAR(s.collectives_us.at("attn_all_reduce"), 9 * 5, 1e-6);
  EXPECT_NEAR(s.collectives_us.at("moe_all_reduce"), 7 * 5, 1e-6);
  EXPECT_NEAR(s.collectives_us.at("embed_all_reduce"), 5, 1e-6);
  EXPECT_NEAR(s.collectives_us.at("lm_head_all_gather"), 5, 1e-6);
}

TEST(Advisor, AttentionDpPlanExchangesTokensByAllToAll) {
  const ModelConfig c = synthetic_config("tiny");
  const StepSplit s = stage_time(c, parallel::parse_plan("ep2-dp"), simple_profile(), 0, ForwardShape{}, {});
  // counts, dispatch and combine per MoE layer (7), no attention all-reduce (attention TP 1).
  EXPECT_NEAR(s.collectives_us.at("moe_all_to_all"), 3 * 7 * 5, 1e-6);
  EXPECT_EQ(s.collectives_us.count("attn_all_reduce"), 0u);
}

TEST(Advisor, PipelineOfOneSequenceIdlesTheOtherStages) {
  const ModelConfig c = synthetic_config("tiny");
  const HardwareProfile p = simple_profile();
  const parallel::ParallelPlan pp2 = parallel::parse_plan("pp2");
  AdviseWorkload w;
  ForwardShape shape;
  shape.context = 10;
  const double s0 = stage_time(c, pp2, p, 0, shape, {}).total_us();
  const double s1 = stage_time(c, pp2, p, 1, shape, {}).total_us();
  // One sequence, one group: the round is the traversal s0 + s1, each stage busy for its own part.
  const StepSplit round = decode_round(c, pp2, p, 1, 10, w);
  EXPECT_NEAR(round.total_us(), s0 + s1, 1e-6);
  EXPECT_NEAR(round.bubble_us, (s0 + s1) / 2, 1e-6);
  // Two sequences: two groups in flight, each stage runs both; the round is 2 x the slower stage.
  const StepSplit two = decode_round(c, pp2, p, 2, 10, w);
  EXPECT_NEAR(two.total_us(), 2 * std::max(s0, s1), 1e-6);
}

TEST(Advisor, SharedExecutorAddsEveryRanksWork) {
  const ModelConfig c = synthetic_config("tiny");
  HardwareProfile p = simple_profile();
  p.layer_overhead_us = 3;
  const parallel::ParallelPlan tp2 = parallel::parse_plan("tp2");
  ForwardShape shape;
  const StepSplit own = stage_time(c, tp2, p, 0, shape, {});
  p.ranks_share_executor = true;
  p.shared_rank_layer_us = 1;
  p.shared_executor_speedup.points = {{1, 1}, {2, 1.25}, {4, 1.5}};
  const StepSplit shared = stage_time(c, tp2, p, 0, shape, {});
  EXPECT_NEAR(shared.weights_us, 2 * own.weights_us, 1e-6);  // tp: no expert-group imbalance
  // Per layer: 2 ranks side by side, each 1 us + half the other 2 us (half the heads), over 1.25.
  EXPECT_NEAR(shared.overhead_us, 2 * (1 + 2.0 / 2) / 1.25 * c.num_hidden_layers, 1e-9);
  EXPECT_NEAR(shared.collectives_us.at("moe_all_reduce"), own.collectives_us.at("moe_all_reduce"), 1e-9);
}

TEST(Advisor, SharedExecutorCountsTheRanksThatRunAtOnce) {
  const ModelConfig c = synthetic_config("tiny");
  HardwareProfile p = simple_profile();
  p.ranks_share_executor = true;
  p.layer_overhead_us = 3;
  p.shared_rank_layer_us = 1;
  p.shared_executor_speedup.points = {{1, 1}, {2, 1.25}, {4, 1.5}};
  AdviseWorkload w;
  // pp2, one sequence: one group, one rank at a time: every layer at the one-rank time.
  const StepSplit one = decode_round(c, parallel::parse_plan("pp2"), p, 1, 10, w);
  EXPECT_NEAR(one.overhead_us + one.bubble_us, 3.0 * c.num_hidden_layers, 1e-6);
  // Two sequences: both stages busy at once (2 ranks side by side), each runs both groups' layers.
  const StepSplit two = decode_round(c, parallel::parse_plan("pp2"), p, 2, 10, w);
  EXPECT_NEAR(two.overhead_us + two.bubble_us, 2 * 3.0 / 1.25 * c.num_hidden_layers, 1e-6);
  // ep2-dp with one sequence: one replica has it, the other skips its layers.
  const StepSplit dp = decode_round(c, parallel::parse_plan("ep2-dp"), p, 1, 10, w);
  EXPECT_NEAR(dp.overhead_us, 3.0 * c.num_hidden_layers, 1e-6);
  // ... nor reads its attention and dense weights, nor its KV cache.
  const StepSplit dp2 = decode_round(c, parallel::parse_plan("ep2-dp"), p, 2, 10, w);
  EXPECT_LT(dp.weights_us, dp2.weights_us);
  EXPECT_NEAR(dp.kv_us, dp2.kv_us / 2, 1e-9);
}

TEST(Advisor, SteadyStateInterleavesOnePrefillPerOutput) {
  const ModelConfig c = synthetic_config("tiny");
  HardwareProfile p = simple_profile();
  p.step_overhead_us = 7;
  AdviseWorkload w;
  w.input_len = 16;
  w.output_len = 4;
  const PointPrediction pt = predict_point(c, parallel::ParallelPlan{}, p, w, 8);
  // Each round 8 tokens, and 8 / 4 = 2 requests finish and are replaced by a prefill each.
  const double round = pt.round.total_us() + 2 * pt.prefill_us;
  EXPECT_NEAR(pt.aggregate_tok_s, 8 / (round * 1e-6), 1e-6);
  EXPECT_NEAR(pt.per_request_tok_s, 1 / (round * 1e-6), 1e-9);
  EXPECT_NEAR(pt.ttft_ms, (pt.prefill_us + round) / 1e3, 1e-9);
  EXPECT_NEAR(pt.round.host_us, 7, 1e-12);
}

TEST(Advisor, SpeculationEmitsAcceptLengthPerVerifyStep) {
  const ModelConfig c = synthetic_config("tiny");
  const HardwareProfile p = simple_profile();
  AdviseWorkload w;
  w.output_len = 1 << 20;  // prefills negligible
  w.speculative_algorithm = "EAGLE";
  w.accept_length = 3;
  w.verify_tokens = 4;
  const PointPrediction pt = predict_point(c, parallel::ParallelPlan{}, p, w, 1);
  EXPECT_NEAR(pt.tpot_ms, pt.round.total_us() / 3 / 1e3, 1e-3 * pt.tpot_ms);
  EXPECT_GT(pt.round.collectives_us.at("draft"), 0);
}

TEST(Advisor, KimiFitsEightH200sAsInt4ButNotInBf16) {
  const HardwareProfile p = load_profile("perf/profiles/h200-sxm-x8.json");
  const std::vector<std::string> plans = {"tp8", "ep8", "pp8", "ep8-dp"};
  const ModelConfig bf16 = synthetic_config("kimi-k2.6", 0, SyntheticDtype::bf16);
  const Advice a = advise(bf16, "synthetic:kimi-k2.6:dtype=bf16", p, 8, plans, AdviseWorkload{});
  ASSERT_EQ(a.plans.size(), 4u);
  for (const PlanPrediction& plan : a.plans) {
    EXPECT_FALSE(plan.fits) << plan.plan.name;  // ~241 GiB of bf16 weights per rank > 141 GB
    EXPECT_NE(plan.fit_note.find("does not fit"), std::string::npos) << plan.fit_note;
  }
  EXPECT_TRUE(a.ranking.at(1).empty());
  // As published (INT4 routed experts, ~590 GB in all) every one of them fits.
  const ModelConfig int4 = synthetic_config("kimi-k2.6");
  const Advice b = advise(int4, "synthetic:kimi-k2.6", p, 8, plans, AdviseWorkload{});
  for (const PlanPrediction& plan : b.plans) EXPECT_TRUE(plan.fits) << plan.plan.name << ": " << plan.fit_note;
  EXPECT_EQ(b.ranking.at(1).size(), 4u);
}

TEST(Advisor, RankingIsByAggregateThroughput) {
  const ModelConfig c = synthetic_config("tiny");
  const Advice a = advise(c, "synthetic:tiny", simple_profile(), 2, {}, AdviseWorkload{});
  ASSERT_GE(a.plans.size(), 3u);  // tp2, ep2, pp2, ep2-dp
  for (const auto& [concurrency, order] : a.ranking) {
    ASSERT_EQ(order.size(), a.plans.size());
    const int64_t conc = concurrency;  // clang 14 cannot capture a structured binding
    auto speed = [&](const std::string& name) {
      for (const PlanPrediction& p : a.plans)
        if (p.plan.name == name)
          for (const PointPrediction& pt : p.points)
            if (pt.concurrency == conc) return pt.aggregate_tok_s;
      return -1.0;
    };
    for (size_t i = 1; i < order.size(); ++i) EXPECT_GE(speed(order[i - 1]), speed(order[i]));
  }
}

}  // namespace
}  // namespace moeserve::perf
