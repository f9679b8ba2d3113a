// The tokens of one forward pass on one rank, as the scheduler lays them out and the model
// consumes them: pure host data, no tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "step/logit_adjust.h"
#include "step/sampling_options.h"
#include "step/token_bitmask.h"

namespace moeserve {

// What the last stage draws from a batch's logit rows (sample::Sampler performs it; the step
// loop picks the least that lets every row be drawn).
enum class DrawKind {
  kLogits,      // fp32 logits [rows, vocab] to the host
  kGreedy,      // each row's argmax id, reduced on the devices
  kCandidates,  // each row's top candidates and softmax normaliser at `temperatures`
  kSampled,     // each row's token drawn on the devices under `sampling`
};

// One step's tokens on this rank (host memory; the forward uploads what the backend needs).
// Tokens of several sequences are concatenated; each token carries its sequence's index
// into `block_tables`, its position, and the cache slot its latent is written to.
struct ForwardBatch {
  std::vector<int32_t> tokens;        // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> seq_of_token;  // [T]
  std::vector<int32_t> slots;         // [T] page * page_size + offset
  std::vector<int32_t> block_tables;  // [num_seqs * max_pages_per_seq]
  int64_t max_pages_per_seq = 0;
  std::vector<int32_t> logit_rows;             // token indices whose logits are returned
  DrawKind draw = DrawKind::kLogits;           // what the last stage draws from them
  std::vector<float> temperatures;             // [logit_rows]: each row's sampling temperature (kCandidates)
  std::vector<ops::SamplingOptions> sampling;  // [logit_rows]: each row's draw (kSampled)
  // [T] or empty. When given (a model loaded with ModelRunOptions::mtp), the logit rows are
  // the MTP layer's (DeepSeek-V3's multi-token prediction, scripts/deepseek_mtp.py): token t's
  // MTP input is the main model's final hidden state at t and mtp_tokens[t] (the token that
  // follows t), its logits predict the token after that, and its MTP latent is cached at
  // slots[t] of the MTP layer's own cache.
  std::vector<int32_t> mtp_tokens;
  // An MTP draft step (NEXTN; mtp_tokens and mtp_hidden_rows then have T entries, T may be 0
  // on an attention-DP replica that only joins the MoE collectives): only the last stage runs,
  // only the MTP layer, and token t's input hidden state is row mtp_hidden_rows[t] of its
  // hidden store instead of the main model's: rows [0, slots) hold the main model's final
  // (normalised) hidden state written at each cache slot by every step, rows [slots, 2 slots)
  // the MTP layer's own output (after shared_head.norm) written at each slot by draft steps,
  // so a chain's next draft reads the previous draft's output. Its logit rows are the MTP
  // head's; its MTP latents go to slots[t] of the MTP cache. (slots: num_pages * page_size.)
  bool mtp_draft = false;
  std::vector<int32_t> mtp_hidden_rows;
  // [logit_rows, ceil(vocab / 32)]: the tokens each row's grammar allows (ops::TokenBitmaskParams;
  // unconstrained rows allow all); null when no row is constrained. Filled while the step runs
  // (step/token_bitmask.h): the last stage waits for it after the LM head.
  std::shared_ptr<TokenBitmask> token_bitmask;
  // Changes to the logit rows before any draw (ops::LogitAdjustParams); empty for most steps.
  std::vector<ops::LogitAdjustEntry> logit_adjust;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

}  // namespace moeserve
