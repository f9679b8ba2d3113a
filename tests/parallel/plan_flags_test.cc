// SGLang-style flags give the same plans as the presets; conflicting flags are rejected.
#include <gtest/gtest.h>

#include "parallel/plan_parse.h"
#include "tests/parallel/test_util.h"

namespace moeserve::parallel {
namespace {

void expect_same(const ParallelPlan& a, const ParallelPlan& b) {
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.attn_tp, b.attn_tp);
  EXPECT_EQ(a.attn_dp, b.attn_dp);
  EXPECT_EQ(a.moe_ep, b.moe_ep);
  EXPECT_EQ(a.moe_tp, b.moe_tp);
  EXPECT_EQ(a.name, b.name);
}

PlanFlags flags(int tp, int ep, int pp, int dp, bool dp_attention) { return {tp, ep, pp, dp, dp_attention}; }

TEST(PlanFlags, PresetsAndTheirFlags) {
  expect_same(plan_from_flags(flags(8, 0, 0, 0, false)), parse_plan("tp8"));
  expect_same(plan_from_flags(flags(8, 8, 0, 0, false)), parse_plan("ep8"));
  expect_same(plan_from_flags(flags(8, 4, 0, 0, false)), parse_plan("ep4tp2"));
  expect_same(plan_from_flags(flags(0, 0, 8, 0, false)), parse_plan("pp8"));
  expect_same(plan_from_flags(flags(2, 0, 4, 0, false)), parse_plan("tp2pp4"));
  expect_same(plan_from_flags(flags(2, 2, 2, 0, false)), parse_plan("ep2pp2"));
  expect_same(plan_from_flags(flags(8, 8, 0, 0, true)), parse_plan("ep8-dp"));
  expect_same(plan_from_flags(flags(8, 8, 0, 8, true)), parse_plan("ep8-dp"));
  expect_same(plan_from_flags(flags(4, 4, 0, 0, true)), parse_plan("ep4-dp"));
  expect_same(plan_from_flags(flags(0, 0, 0, 0, false)), parse_plan("single"));
}

TEST(PlanFlags, HybridBeyondThePresets) {
  // Attention TP 2 inside each of 4 DP replicas, experts over 8 ranks.
  const ParallelPlan p = plan_from_flags(flags(8, 8, 0, 4, true));
  EXPECT_EQ(p.attn_tp, 2);
  EXPECT_EQ(p.attn_dp, 4);
  EXPECT_EQ(p.moe_ep, 8);
  EXPECT_EQ(p.moe_tp, 1);
  EXPECT_EQ(p.name, "pp1.attn_tp2.attn_dp4.moe_ep8.moe_tp1");
  // DP attention over plain MoE TP.
  const ParallelPlan q = plan_from_flags(flags(4, 0, 2, 0, true));
  EXPECT_EQ(q.attn_dp, 4);
  EXPECT_EQ(q.moe_tp, 4);
  EXPECT_EQ(q.world(), 8);
  EXPECT_EQ(q.name, "pp2.attn_tp1.attn_dp4.moe_ep1.moe_tp4");
}

TEST(PlanFlags, CanonicalNamesRoundTrip) {
  for (const std::string& name : preset_names(8)) {
    const ParallelPlan p = parse_plan(name);
    expect_same(parse_plan(canonical_plan_name(p)), p);
  }
  EXPECT_EQ(canonical_plan_name(parse_plan("tp2ep2")), "ep2tp2");
  EXPECT_EQ(canonical_plan_name(parse_plan("pp2ep4-dp")), "ep4pp2-dp");
}

TEST(PlanFlags, Errors) {
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(8, 3, 0, 0, false)),
                       "--ep-size 3 does not divide --tp-size 8 (the ranks of a pipeline stage)");
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(4, 8, 0, 0, false)),
                       "--ep-size 8 does not divide --tp-size 4 (the ranks of a pipeline stage)");
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(8, 8, 0, 3, true)),
                       "--dp-size 3 does not divide --tp-size 8 (the ranks of a pipeline stage)");
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(8, 8, 0, 2, false)),
                       "--dp-size 2 without --enable-dp-attention: replicating whole engines is not supported; add "
                       "--enable-dp-attention for data-parallel attention");
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(1, 0, 0, 0, true)),
                       "--enable-dp-attention with --dp-size 1 (--tp-size 1) leaves one attention replica; drop the "
                       "flag for attention TP or raise --dp-size");
  EXPECT_ERROR_MESSAGE(plan_from_flags(flags(-2, 0, 0, 0, false)), "--tp-size -2: sizes must be at least 1");
  EXPECT_ERROR_MESSAGE(resolve_plan("tp8", flags(8, 0, 0, 0, false)),
                       "--plan tp8 conflicts with --tp-size/--ep-size/--pp-size/--dp-size/--enable-dp-attention: give "
                       "one or the other");
  expect_same(resolve_plan("", flags(0, 0, 0, 0, false)), parse_plan("single"));
  expect_same(resolve_plan("ep4", flags(0, 0, 0, 0, false)), parse_plan("ep4"));
}

}  // namespace
}  // namespace moeserve::parallel
