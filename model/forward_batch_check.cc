#include "model/forward_batch_check.h"

#include <cmath>

#include "core/error.h"

namespace moeserve {
namespace {

void check_tokens(const ForwardBatch& batch, const BatchLimits& limits) {
  const ModelConfig& c = limits.config;
  const KvCacheShape& cache = limits.cache;
  const int64_t T = batch.num_tokens();
  const int64_t num_seqs =
      batch.max_pages_per_seq > 0 ? static_cast<int64_t>(batch.block_tables.size()) / batch.max_pages_per_seq : 0;
  for (int64_t t = 0; t < T; ++t) {
    MS_CHECK(batch.positions[t] >= 0 && batch.positions[t] < c.max_position_embeddings,
             "forward batch: position {} outside [0, max_position_embeddings={})", batch.positions[t],
             c.max_position_embeddings);
    MS_CHECK(batch.slots[t] >= 0 && batch.slots[t] < cache.num_pages * cache.page_size,
             "forward batch: cache slot {} outside the cache", batch.slots[t]);
    MS_CHECK(batch.seq_of_token[t] >= 0 && batch.seq_of_token[t] < num_seqs &&
                 batch.positions[t] < batch.max_pages_per_seq * cache.page_size,
             "forward batch: token {} has no block-table row for position {}", t, batch.positions[t]);
    if (limits.first_stage)
      MS_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.vocab_size, "token id {} outside the vocabulary [0, {})",
               batch.tokens[t], c.vocab_size);
  }
  for (int32_t page : batch.block_tables)
    MS_CHECK(page >= 0 && page < cache.num_pages, "forward batch: page {} outside the cache", page);
}

void check_head_rows(const ForwardBatch& batch, const BatchLimits& limits) {
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
  if (batch.draw == DrawKind::kCandidates && limits.last_stage) {
    MS_CHECK(static_cast<int64_t>(batch.temperatures.size()) == rows,
             "forward batch: {} temperatures for {} logit rows (a candidates draw needs one per row)",
             batch.temperatures.size(), rows);
    for (float t : batch.temperatures)
      MS_CHECK(std::isfinite(t) && t >= 0.0f, "forward batch: temperature {} is not a finite value >= 0", t);
  }
  if (batch.token_bitmask) {
    const int64_t words = (limits.config.vocab_size + 31) / 32;
    MS_CHECK(batch.token_bitmask->rows() == rows && batch.token_bitmask->words() == words,
             "forward batch: token_bitmask of [{}, {}] words for {} logit rows of {} words each",
             batch.token_bitmask->rows(), batch.token_bitmask->words(), rows, words);
  }
  if (batch.draw == DrawKind::kSampled && limits.last_stage) {
    MS_CHECK(static_cast<int64_t>(batch.sampling.size()) == rows,
             "forward batch: {} sampling options for {} logit rows (a sampled draw needs one per row)",
             batch.sampling.size(), rows);
  }
}

void check_mtp_tokens(const ForwardBatch& batch, const BatchLimits& limits) {
  MS_CHECK(batch.mtp_draft || batch.mtp_hidden_rows.empty(), "forward batch: MTP hidden rows outside a draft step");
  MS_CHECK(!batch.mtp_draft || limits.mtp_layer || !limits.last_stage,
           "forward batch: an MTP draft step, but the model was loaded without its MTP layer (ModelRunOptions::mtp)");
  MS_CHECK(!batch.mtp_draft || batch.num_tokens() == static_cast<int64_t>(batch.mtp_tokens.size()),
           "forward batch: a draft step of {} tokens with {} MTP tokens", batch.num_tokens(), batch.mtp_tokens.size());
  if (batch.mtp_tokens.empty()) return;
  MS_CHECK(limits.mtp_layer || !limits.last_stage,
           "forward batch: MTP tokens given, but the model was loaded without its MTP layer (ModelRunOptions::mtp)");
  MS_CHECK(batch.num_tokens() == static_cast<int64_t>(batch.mtp_tokens.size()),
           "forward batch: {} MTP tokens for {} tokens", batch.mtp_tokens.size(), batch.num_tokens());
  for (int32_t id : batch.mtp_tokens)
    MS_CHECK(id >= 0 && id < limits.config.vocab_size, "MTP token id {} outside the vocabulary [0, {})", id,
             limits.config.vocab_size);
  if (!batch.mtp_draft) return;
  MS_CHECK(batch.num_tokens() == static_cast<int64_t>(batch.mtp_hidden_rows.size()),
           "forward batch: {} MTP hidden rows for {} tokens", batch.mtp_hidden_rows.size(), batch.num_tokens());
  const int64_t rows = 2 * limits.cache.num_pages * limits.cache.page_size;
  for (int32_t row : batch.mtp_hidden_rows)
    MS_CHECK(row >= 0 && row < rows, "forward batch: MTP hidden row {} outside the hidden store [0, {})", row, rows);
}

}  // namespace

void check_forward_batch(const ForwardBatch& batch, const BatchLimits& limits) {
  const int64_t T = batch.num_tokens();
  MS_CHECK(static_cast<int64_t>(batch.positions.size()) == T && static_cast<int64_t>(batch.slots.size()) == T &&
               static_cast<int64_t>(batch.seq_of_token.size()) == T,
           "forward batch: tokens, positions, slots and seq_of_token must have the same length");
  check_tokens(batch, limits);
  for (int32_t row : batch.logit_rows)
    MS_CHECK(row >= 0 && row < T, "logit row {} outside the batch of {} tokens", row, T);
  check_head_rows(batch, limits);
  check_mtp_tokens(batch, limits);
}

}  // namespace moeserve
