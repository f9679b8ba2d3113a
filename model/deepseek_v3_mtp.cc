// DeepSeek-V3's MTP layer (multi-token prediction, depth 1) on the last stage, after the main
// layers, for batches with ForwardBatch::mtp_tokens. The reference computation (and what
// training optimised) is scripts/deepseek_mtp.py: at token t, with h_t the main model's final
// hidden state (after model.norm) and e the embedding of the token after t,
//   x_t = eh_proj(concat(enorm(e), hnorm(h_t)))     [T, hidden]
//   y   = block(x) over the MTP layer's own cache   (one decoder layer, causal)
//   logits_t = lm_head(shared_head.norm(y_t))       (the head's rows; predicts token t + 2)
#include <algorithm>

#include "model/deepseek_v3.h"
#include "model/deepseek_v3_loader.h"
#include "model/layer_ops.h"
#include "model/lm_head.h"
#include "model/reduction_tree.h"
#include "model/workspace.h"

namespace moeserve {

void DeepseekV3::mtp(Activations& a, int64_t max_pages_per_seq, bool normed_ready) {
  const MtpWeights& m = *weights_->mtp;
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const DType act = backend_.activation_dtype();
  std::byte* in = bytes(a.mtp_in);  // [T, 2 * hidden]: enorm(e) in columns [0, hidden), hnorm(h) after
  // h = norm(hidden) -> normed (unless a draft step gathered it there); hnorm(h) -> in[:, hidden:].
  if (!normed_ready)
    backend_.rms_norm({ptr(a.hidden), ptr(weights_->final_norm), ptr(a.normed), T, hidden, hidden, hidden, eps});
  backend_.rms_norm({ptr(a.normed), ptr(m.hnorm), in + hidden * dtype_size(act), T, hidden, hidden, 2 * hidden, eps});
  // e = embed(next tokens) -> hidden (the main residual stream is spent); enorm(e) -> in[:, :hidden].
  backend_.embedding({static_cast<const int32_t*>(ptr(a.mtp_ids)), ptr(weights_->embed), ptr(a.hidden), T, hidden,
                      shard_.vocab.begin, shard_.vocab.end});
  all_reduce(groups_.attn_tp, *a.hidden, T * hidden, "mtp_embedding", act);
  backend_.rms_norm({ptr(a.hidden), ptr(m.enorm), in, T, hidden, hidden, 2 * hidden, eps});
  // x = eh_proj(in) -> hidden, the block's residual stream; then the block, as a main layer.
  backend_.linear(linear_params(in, m.eh_proj, ptr(a.hidden), T, 2 * hidden, hidden));
  backend_.rms_norm({ptr(a.hidden), ptr(m.block->input_norm), ptr(a.normed), T, hidden, hidden, hidden, eps});
  const auto& layers = weights_->layers;
  const int64_t moe_layers = std::count_if(layers.begin(), layers.end(), [](const auto& l) { return l->is_moe; });
  decoder_layer(*m.block, *mtp_kv_cache_, moe_layers, a, max_pages_per_seq, /*next_norm=*/nullptr);
}

void DeepseekV3::store_hidden(Activations& a, const ops::BufferPtr& norm, int64_t first_row) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  // normed [T, hidden] = norm(hidden); store row first_row + slots[t] = normed[t] (padding
  // tokens write their scratch page's rows).
  backend_.rms_norm(
      {ptr(a.hidden), ptr(norm), ptr(a.normed), T, hidden, hidden, hidden, static_cast<float>(config_.rms_norm_eps)});
  std::byte* store = bytes(mtp_hidden_store_) + first_row * hidden * dtype_size(backend_.activation_dtype());
  backend_.kv_write({ptr(a.normed), static_cast<const int32_t*>(ptr(a.slots)), store, T, hidden});
}

void DeepseekV3::mtp_draft(Activations& a, const ForwardBatch& batch) {
  const int64_t T = a.tokens, hidden = config_.hidden_size;
  const MtpWeights& m = *weights_->mtp;
  // normed [T, hidden] = store[mtp_hidden_rows]: the main model's or a previous draft's state.
  backend_.gather_rows(
      {ptr(mtp_hidden_store_), static_cast<const int32_t*>(ptr(a.mtp_rows)), ptr(a.normed), T, hidden});
  mtp(a, batch.max_pages_per_seq, /*normed_ready=*/true);
  store_hidden(a, m.head_norm, cache_shape_.num_pages * cache_shape_.page_size);  // the chain's next input
  head_->run(a, static_cast<int64_t>(batch.logit_rows.size()), ptr(m.head_norm));
}

}  // namespace moeserve
