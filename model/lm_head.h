// The last stage's LM head projection: the logit rows normalised and projected over this
// rank's vocab parts into fp32 logits on the device. What they become (argmax, candidates,
// draws, host logits) is the sampler's (sample/sampler.h).
#pragma once

#include <cstdint>

#include "model/deepseek_v3.h"
#include "model/deepseek_v3_loader.h"
#include "model/workspace.h"
#include "ops/ops.h"

namespace moeserve {

struct LmHeadParams {
  const ModelConfig& config;
  const parallel::RankShard& shard;
  int parts;  // vocab parts of this rank (the reduction plan's)
  ops::Backend& backend;
  const ModelWeights& weights;  // final_norm, lm_head
};

class LmHead {
 public:
  explicit LmHead(const LmHeadParams& params) : p_(params) {}

  // selected [rows, hidden] = norm(hidden[logit_rows]); local logits [parts, rows, vocab_part]
  // fp32 = selected @ lm_head[part]. The norm is the final norm, or `norm_weight` [hidden]
  // (the MTP layer's shared_head.norm) when given.
  void run(Activations& a, int64_t rows, const void* norm_weight = nullptr);

 private:
  LmHeadParams p_;
};

}  // namespace moeserve
