#include "model/lm_head.h"

#include "model/layer_ops.h"

namespace moeserve {

void LmHead::run(Activations& a, int64_t rows, const void* norm_weight) {
  const ModelConfig& c = p_.config;
  const int64_t hidden = c.hidden_size, vocab_part = p_.shard.vocab.size() / p_.parts;
  ops::Backend& backend = p_.backend;
  backend.gather_rows({ptr(a.hidden), static_cast<const int32_t*>(ptr(a.logit_rows)), ptr(a.selected), rows, hidden});
  if (norm_weight == nullptr) norm_weight = ptr(p_.weights.final_norm);
  backend.rms_norm({ptr(a.selected), norm_weight, ptr(a.selected), rows, hidden, hidden, hidden,
                    static_cast<float>(c.rms_norm_eps)});
  for (int v = 0; v < p_.parts; ++v) {
    ops::LinearParams head = linear_params(ptr(a.selected), p_.weights.lm_head[v],
                                           bytes(a.local_logits) + v * rows * vocab_part * 4, rows, hidden, vocab_part);
    head.y_f32 = true;
    backend.linear(head);
  }
}

}  // namespace moeserve
