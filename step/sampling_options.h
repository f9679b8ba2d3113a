// How one logit row's next token is drawn. It lives in the step leaf (not ops/) because a
// step's batch carries it per row (ForwardBatch::sampling) and the scheduler, which fills
// batches, must not depend on the op interface; ops/ops.h includes it under its old name.
#pragma once

#include <cstdint>

namespace moeserve::ops {

// Per-row sampling options. temperature 0 = greedy.
struct SamplingOptions {
  float temperature = 0.0f;
  int32_t top_k = 0;   // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  uint64_t seed = 0;
  uint64_t step = 0;  // draws are a pure function of (seed, step)
};

}  // namespace moeserve::ops
