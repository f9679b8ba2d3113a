// Every way a plan can be invalid, with the message the operator sees.
#include <gtest/gtest.h>

#include "parallel/memory_fit.h"
#include "parallel/plan_parse.h"
#include "tests/parallel/test_util.h"

namespace moeserve::parallel {
namespace {

// synthetic:tiny: 8 layers, 8 heads, vocab 512, dense 128, shared 32, 16 experts of 32.
ShardDims tiny_dims() { return {8, 8, 512, 128, 32, 16, 32}; }

const char* kGrammar = "expected 'single' or components tpN, epN, ppN (each at most once) with an optional -dp";

TEST(PlanErrors, Grammar) {
  EXPECT_ERROR_MESSAGE(parse_plan(""), fmt::format("plan '': empty plan; {}", kGrammar));
  EXPECT_ERROR_MESSAGE(parse_plan("tp"), "plan 'tp': 'tp' needs a size, as in tp8");
  EXPECT_ERROR_MESSAGE(parse_plan("tp0"), "plan 'tp0': size of 'tp' must be at least 1");
  EXPECT_ERROR_MESSAGE(parse_plan("xx2"), "plan 'xx2': unknown component 'xx' (use tp, ep, pp)");
  EXPECT_ERROR_MESSAGE(parse_plan("tp2tp2"), "plan 'tp2tp2': 'tp' given twice");
  EXPECT_ERROR_MESSAGE(parse_plan("tp99999"), "plan 'tp99999': size '99999' of 'tp' is too large");
  EXPECT_ERROR_MESSAGE(parse_plan("2tp"), fmt::format("plan '2tp': unexpected '2tp' at offset 0; {}", kGrammar));
  EXPECT_ERROR_MESSAGE(parse_plan("tp2x"), fmt::format("plan 'tp2x': unexpected 'x' at offset 3; {}", kGrammar));
  EXPECT_ERROR_MESSAGE(parse_plan("ep2-dp-dp"),
                       fmt::format("plan 'ep2-dp-dp': unexpected '-dp' at offset 3; {}", kGrammar));
  EXPECT_ERROR_MESSAGE(parse_plan("-dp"), fmt::format("plan '-dp': unexpected '-dp' at offset 0; {}", kGrammar));
  EXPECT_ERROR_MESSAGE(parse_plan("tp4-dp"),
                       "plan 'tp4-dp': '-dp' (attention data parallelism) needs expert parallelism, as in ep8-dp");
  EXPECT_ERROR_MESSAGE(parse_plan("pp2-dp"),
                       "plan 'pp2-dp': '-dp' (attention data parallelism) needs expert parallelism, as in ep8-dp");
}

TEST(PlanErrors, SizesThatDoNotDivideTheModel) {
  const ShardDims d = tiny_dims();
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("tp16"), d),
                       "plan 'tp16': model attention heads = 8 is not divisible by attention TP size = 16");
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("tp3"), d),
                       "plan 'tp3': model attention heads = 8 is not divisible by attention TP size = 3");
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("ep3-dp"), d),
                       "plan 'ep3-dp': model routed experts = 16 is not divisible by EP size = 3");
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("ep32-dp"), d),
                       "plan 'ep32-dp': model routed experts = 16 is not divisible by EP size = 32");
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("pp16"), d),
                       "plan 'pp16': 16 pipeline stages for 8 layers (each stage needs a layer)");
  ShardDims v = d;
  v.vocab = 500;
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("tp8"), v),
                       "plan 'tp8': model vocab size = 500 is not divisible by attention TP size = 8");
  ShardDims dense = d;
  dense.dense_intermediate = 100;
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("tp8"), dense),
                       "plan 'tp8': model intermediate_size = 100 is not divisible by attention TP size = 8");
  ShardDims expert = d;
  expert.expert_intermediate = 30;
  EXPECT_ERROR_MESSAGE(validate_plan(parse_plan("ep2tp4"), expert),
                       "plan 'ep2tp4': model moe_intermediate_size = 30 is not divisible by MoE TP size = 4");
  ShardDims shared = d;
  shared.shared_intermediate = 36;
  EXPECT_ERROR_MESSAGE(
      validate_plan(parse_plan("ep8"), shared),
      "plan 'ep8': model shared-expert intermediate size = 36 is not divisible by attention TP size = 8");
  // A dense model (no experts) is not asked to divide experts.
  ShardDims no_experts = d;
  no_experts.experts = 0;
  EXPECT_NO_THROW(validate_plan(parse_plan("tp8"), no_experts));
}

TEST(PlanErrors, InconsistentHandMadePlan) {
  ParallelPlan p;
  p.name = "custom";
  p.attn_tp = 4;
  p.moe_ep = 2;
  EXPECT_ERROR_MESSAGE(validate_plan(p, tiny_dims()),
                       "plan 'custom': moe_ep x moe_tp (2 x 1) must equal attn_tp x attn_dp (4 x 1), the ranks of a "
                       "stage");
  p.moe_ep = 0;
  EXPECT_ERROR_MESSAGE(validate_plan(p, tiny_dims()), "plan 'custom': every size must be at least 1");
}

TEST(PlanErrors, MemoryFit) {
  const ParallelPlan plan = parse_plan("ep2-dp");
  MemoryBudget budget;
  budget.bytes_per_rank = 1000;
  budget.context_tokens = 10;
  budget.max_running_requests = 3;  // 2 sequences per replica
  // rank 0: 500 + 20 x 10 x 2 = 900 fits; rank 1: 700 + 20 x 10 x 2 = 1100 does not.
  EXPECT_EQ(sequences_per_rank(plan, budget), 2);
  EXPECT_EQ(rank_bytes_needed(plan, {500, 20}, budget), 900);
  EXPECT_NO_THROW(check_memory_fit(plan, {{500, 20}}, budget));
  EXPECT_ERROR_MESSAGE(check_memory_fit(plan, {{500, 20}, {700, 20}}, budget),
                       "plan 'ep2-dp' does not fit --mem-per-rank 1000.00 B: rank 1 needs 1.07 KiB = weights 700.00 "
                       "B + KV cache 400.00 B (10 tokens x 2 sequences x 20.00 B per token)");
  budget.bytes_per_rank = 0;
  EXPECT_ERROR_MESSAGE(check_memory_fit(plan, {{1, 1}}, budget), "plan 'ep2-dp': --mem-per-rank must be positive");
}

TEST(PlanErrors, ByteSizes) {
  EXPECT_EQ(parse_byte_size("80GiB", "--mem-per-rank"), 80LL << 30);
  EXPECT_EQ(parse_byte_size("141 GB", "--mem-per-rank"), 141000000000LL);
  EXPECT_EQ(parse_byte_size("1.5MiB", "--mem-per-rank"), 1572864);
  EXPECT_EQ(parse_byte_size("4096", "--mem-per-rank"), 4096);
  EXPECT_ERROR_MESSAGE(parse_byte_size("lots", "--mem-per-rank"),
                       "--mem-per-rank: 'lots' is not a size (use e.g. 80GiB, 141GB, 512MiB or a byte count)");
  EXPECT_ERROR_MESSAGE(parse_byte_size("80PB", "--mem-per-rank"),
                       "--mem-per-rank: '80PB' is not a size (use e.g. 80GiB, 141GB, 512MiB or a byte count)");
}

}  // namespace
}  // namespace moeserve::parallel
