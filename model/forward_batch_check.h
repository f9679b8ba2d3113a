// The checks a step's ForwardBatch passes before any of it reaches the device: lengths,
// positions, cache slots and pages, token ids, logit rows, and what the draw needs per row.
#pragma once

#include "model/config.h"
#include "model/deepseek_v3.h"

namespace moeserve {

struct BatchLimits {
  const ModelConfig& config;
  KvCacheShape cache;
  bool first_stage = false;  // checks the token ids
  bool last_stage = false;   // checks what the batch's draw needs
  bool mtp_layer = false;    // the rank holds the MTP layer (ForwardBatch::mtp_tokens allowed)
};

// Throws, naming the field at fault.
void check_forward_batch(const ForwardBatch& batch, const BatchLimits& limits);

}  // namespace moeserve
