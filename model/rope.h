// RoPE inverse frequencies, including YaRN's frequency blend, computed exactly as
// transformers' _compute_yarn_parameters does (fp32 arithmetic where it uses fp32).
#pragma once

#include <vector>

#include "model/config.h"

namespace moeserve {

// [qk_rope_head_dim / 2]
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace moeserve
