// decode_step_cost counts weight bytes as stored: K2.6's INT4 routed experts read int4 values and
// bf16 group scales (stored_bytes), not bf16 weights.
#include "perf/step_cost.h"

#include <gtest/gtest.h>

#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"

namespace moeserve {
namespace {

TEST(StepCost, Int4ExpertsAreCountedAsStored) {
  const ModelConfig int4 = synthetic_config("kimi-k2.6", 3);
  const ModelConfig bf16 = synthetic_config("kimi-k2.6", 3, SyntheticDtype::bf16);
  const parallel::RankShard s = parallel::shard_of(parallel::parse_plan("single"), shard_dims(int4), 0);
  const perf::StepShape shape{.tokens = 1, .context = 16, .experts_hit = {}};
  const perf::StepCost q = perf::decode_step_cost(int4, s, shape), b = perf::decode_step_cost(bf16, s, shape);
  // One expert of [2048, 7168] x 2 + [7168, 2048]: bf16 2 bytes each; int4 half a byte + 2 bytes per 32.
  const double params = 3.0 * 2048 * 7168, hit = 2.0 * 8;  // 2 MoE layers x top 8
  EXPECT_DOUBLE_EQ(b.expert_bytes, hit * params * 2);
  EXPECT_DOUBLE_EQ(q.expert_bytes, hit * (params / 2 + params / 32 * 2));
  EXPECT_DOUBLE_EQ(b.weight_bytes - q.weight_bytes, b.expert_bytes - q.expert_bytes);  // nothing else quantized
}

// A verify step's tokens of one sequence attend to the same cached context: it is read once
// per sequence, while the FLOPs grow with the tokens.
TEST(StepCost, VerifyTokensReadTheirSequenceCacheOnce) {
  const ModelConfig c = synthetic_config("kimi-k2.6", 3, SyntheticDtype::bf16);
  const parallel::RankShard s = parallel::shard_of(parallel::parse_plan("single"), shard_dims(c), 0);
  const perf::StepCost decode = perf::decode_step_cost(c, s, {.tokens = 2, .context = 1000, .experts_hit = {}});
  const perf::StepCost verify =
      perf::decode_step_cost(c, s, {.tokens = 16, .context = 1000, .sequences = 2, .experts_hit = {}});
  const double width = static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim);
  EXPECT_DOUBLE_EQ(decode.kv_bytes, 3 * 2 * 1000 * width * 2);
  EXPECT_DOUBLE_EQ(verify.kv_bytes, decode.kv_bytes);
  EXPECT_DOUBLE_EQ(verify.flops, 8 * decode.flops);
}

}  // namespace
}  // namespace moeserve
