// The communication each plan performs, counted by the communicators, against the plan's
// definition (docs/plans.md, "Communication per layer"). For a run of P forward passes over
// TT tokens (per DP replica) on a stage with Ld dense and Lm MoE layers, hidden h, vocab V,
// attention TP A, 4-byte fp32 elements:
//   attention TP (A > 1)   embedding all_reduce     P calls,  TT*h*4 bytes        (first stage)
//                          attention all_reduce     P*(Ld+Lm), (Ld+Lm)*TT*h*4
//                          dense_mlp all_reduce     P*Ld,     Ld*TT*h*4
//                          lm_head all_gather       P,        rows*(V/A)*4         (last stage)
//   EP/TP MoE (no DP)      moe all_reduce           P*Lm,     Lm*TT*h*4            (stage > 1 rank)
//   attention DP           moe_counts all_to_all_v  P*Lm,     Lm*P*E*moe_tp*4
//                          moe_dispatch             P*Lm,     Lm*share*top_k*moe_tp*h*4
//                          moe_combine              P*Lm,     what the rank computed (summed
//                                                             over ranks = dispatch bytes)
//                          moe all_reduce           P*Lm,     Lm*TT*h*4            (A > 1)
//   pipeline               send (to next stage)     P,        TT*h*4               (not last)
//                          recv (from previous)     P,        TT*h*4               (not first)
#include <gtest/gtest.h>

#include <map>

#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace moeserve::runtime {
namespace {

using comm::Collective;
using Entry = comm::CommStats::Entry;
using Key = std::pair<std::string, Collective>;

const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 42, 99, 3}, {200, 4}, {11, 12, 13}};
constexpr int64_t kNewTokens = 4;

struct Case {
  parallel::ParallelPlan plan;
  int64_t micro_batch_size = 0;
};

EngineOptions engine_options(const Case& k) {
  EngineOptions options;
  options.plan = k.plan;
  options.page_size = 16;
  options.num_pages = 8;
  options.pp_max_micro_batch_size = k.micro_batch_size;
  return options;
}

std::vector<GenerateRequest> requests() {
  std::vector<GenerateRequest> out;
  for (const auto& p : kPrompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_new_tokens = kNewTokens;
    r.top_logprobs = 0;  // the logits head: the full logit rows gathered, as counted above
    out.push_back(r);
  }
  return out;
}

// The sequences of one rank's DP replica (requests i with i % attn_dp == dp_index).
struct ReplicaTokens {
  int64_t prompt_tokens = 0, seqs = 0;
  int64_t total() const { return prompt_tokens + seqs * (kNewTokens - 1); }  // every token a pass sees
};

ReplicaTokens replica_tokens(const parallel::ParallelPlan& plan, const parallel::RankShard& s) {
  ReplicaTokens t;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    if (static_cast<int>(i % plan.attn_dp) == s.coord.dp_index) {
      t.prompt_tokens += static_cast<int64_t>(kPrompts[i].size());
      ++t.seqs;
    }
  return t;
}

// The rank's counted sites are exactly the expected ones, with their calls and bytes.
void expect_sites(const std::map<Key, Entry>& expected, const comm::CommStats& stats) {
  const std::map<Key, Entry> got(stats.by_site.begin(), stats.by_site.end());
  for (const auto& [key, entry] : expected) {
    const auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key.first << " " << comm::collective_name(key.second) << " missing";
    EXPECT_EQ(it->second.calls, entry.calls) << key.first << " " << comm::collective_name(key.second);
    EXPECT_EQ(it->second.bytes, entry.bytes) << key.first << " " << comm::collective_name(key.second);
  }
  for (const auto& [key, entry] : got)
    EXPECT_TRUE(expected.count(key)) << "unexpected " << key.first << " " << comm::collective_name(key.second);
}

void check_plan(const Case& k) {
  const parallel::ParallelPlan& plan = k.plan;
  SCOPED_TRACE(plan.name);
  const ModelSource model = open_model("synthetic:tiny");
  const ModelConfig& c = model.config;
  Engine engine(model, engine_options(k));
  runtime::generate(engine, requests());

  const int64_t h = c.hidden_size, V = c.vocab_size, E = c.n_routed_experts, top_k = c.num_experts_per_tok;
  const int A = plan.attn_tp, R = plan.ranks_per_stage();
  const int64_t B = static_cast<int64_t>(kPrompts.size());
  // Every sequence is live for kNewTokens steps; a step is ceil(B / micro-batch size) passes.
  const int64_t mbs = k.micro_batch_size ? k.micro_batch_size : (plan.pp == 1 ? B : (B + plan.pp - 1) / plan.pp);
  const int64_t P = kNewTokens * ((B + mbs - 1) / mbs);
  const EngineStats engine_stats = engine.stats();
  const auto& stats = engine_stats.comm;
  const auto& passes = engine_stats.forward_passes;
  const auto& shards = engine_stats.shards;
  int64_t dispatch_total = 0, combine_total = 0;
  for (int r = 0; r < plan.world(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const parallel::RankShard& s = shards[r];
    EXPECT_EQ(passes[r], P);
    const ReplicaTokens replica = replica_tokens(plan, s);
    const int64_t seqs = replica.seqs, prompt_tokens = replica.prompt_tokens, TT = replica.total();
    const int64_t rows = seqs * kNewTokens;
    int64_t Ld = 0, Lm = 0;
    for (int64_t l = s.layers.begin; l < s.layers.end; ++l) (c.is_moe_layer(l) ? Lm : Ld)++;

    std::map<Key, Entry> expected;
    if (A > 1) {
      if (s.first_stage) expected[{"embedding", Collective::AllReduce}] = {P, TT * h * 4};
      expected[{"attention", Collective::AllReduce}] = {P * (Ld + Lm), (Ld + Lm) * TT * h * 4};
      if (Ld) expected[{"dense_mlp", Collective::AllReduce}] = {P * Ld, Ld * TT * h * 4};
      if (s.last_stage) expected[{"lm_head", Collective::AllGather}] = {P, rows * (V / A) * 4};
    }
    if (plan.attn_dp == 1 && R > 1 && Lm) expected[{"moe", Collective::AllReduce}] = {P * Lm, Lm * TT * h * 4};
    if (plan.attn_dp > 1 && Lm) {
      expected[{"moe_counts", Collective::AllToAllV}] = {P * Lm, P * Lm * E * plan.moe_tp * 4};
      // This rank dispatches its TP share of the replica's tokens of each pass; with one
      // micro-batch per step that is the prefill and then one token per sequence.
      int64_t share = 0;
      ASSERT_TRUE(A == 1 || P == kNewTokens) << "the share formula below assumes one pass per step";
      if (A == 1) {
        share = TT;
      } else {
        share += parallel::split_range(prompt_tokens, A, s.coord.tp_index).size();
        share += (kNewTokens - 1) * parallel::split_range(seqs, A, s.coord.tp_index).size();
      }
      expected[{"moe_dispatch", Collective::AllToAllV}] = {P * Lm, Lm * share * top_k * plan.moe_tp * h * 4};
      const Entry combine = stats[r].at("moe_combine", Collective::AllToAllV);
      expected[{"moe_combine", Collective::AllToAllV}] = {P * Lm, combine.bytes};
      dispatch_total += Lm * share * top_k * plan.moe_tp * h * 4;
      combine_total += combine.bytes;
      if (A > 1) expected[{"moe", Collective::AllReduce}] = {P * Lm, Lm * TT * h * 4};
    }
    if (!s.last_stage) expected[{"pipeline", Collective::Send}] = {P, TT * h * 4};
    if (!s.first_stage) expected[{"pipeline", Collective::Recv}] = {P, TT * h * 4};

    expect_sites(expected, stats[r]);
  }
  // Everything dispatched comes back.
  EXPECT_EQ(dispatch_total, combine_total);
}

TEST(CommCounts, SingleRankCommunicatesNothing) { check_plan({parallel::parse_plan("single")}); }
TEST(CommCounts, Tp4) { check_plan({parallel::parse_plan("tp4")}); }
TEST(CommCounts, Tp8) { check_plan({parallel::parse_plan("tp8")}); }
TEST(CommCounts, Ep4) { check_plan({parallel::parse_plan("ep4")}); }
TEST(CommCounts, Ep4Tp2) { check_plan({parallel::parse_plan("ep4tp2")}); }
TEST(CommCounts, Ep4Dp) { check_plan({parallel::parse_plan("ep4-dp")}); }
TEST(CommCounts, Ep8Dp) { check_plan({parallel::parse_plan("ep8-dp")}); }
TEST(CommCounts, Ep2Tp2Dp) { check_plan({parallel::parse_plan("ep2tp2-dp")}); }
TEST(CommCounts, AttentionTpInsideDp) { check_plan({parallel::plan_from_flags({4, 2, 0, 2, true})}); }
TEST(CommCounts, Pp4OneSequencePerMicroBatch) { check_plan({parallel::parse_plan("pp4"), 1}); }
TEST(CommCounts, Tp2Pp2) { check_plan({parallel::parse_plan("tp2pp2"), 2}); }
TEST(CommCounts, Ep2Pp2Dp) { check_plan({parallel::parse_plan("ep2pp2-dp")}); }

}  // namespace
}  // namespace moeserve::runtime
