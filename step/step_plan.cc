#include "step/step_plan.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::step {

int64_t micro_batch_size(int64_t live, const MicroBatching& options) {
  if (options.max_micro_batch_size > 0) return options.max_micro_batch_size;
  if (options.pp == 1) return std::max<int64_t>(live, 1);
  return std::max<int64_t>((live + options.pp - 1) / options.pp, 1);
}

void append_sequence(ReplicaBatch& rb, size_t sequence, std::span<const int32_t> tokens, int64_t begin, int64_t end,
                     std::span<const int32_t> pages, int64_t page_size, LogitRows logits) {
  ForwardBatch& batch = rb.batch;
  const int64_t width = batch.max_pages_per_seq;
  MS_CHECK(begin >= 0 && begin < end && end <= static_cast<int64_t>(tokens.size()),
           "sequence {}: token range [{}, {}) outside its {} tokens", sequence, begin, end, tokens.size());
  MS_CHECK(static_cast<int64_t>(pages.size()) * page_size >= end, "sequence {}: {} pages do not cover {} tokens",
           sequence, pages.size(), end);
  MS_CHECK(static_cast<int64_t>(pages.size()) <= width,
           "sequence {} needs {} pages, more than the {} per sequence of this batch", sequence, pages.size(), width);
  const int32_t seq_index = static_cast<int32_t>(rb.sequences.size());
  rb.sequences.push_back(sequence);
  rb.first_row.push_back(static_cast<int64_t>(batch.logit_rows.size()));
  for (int64_t pos = begin; pos < end; ++pos) {
    if (logits == LogitRows::kEvery) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()));
    batch.tokens.push_back(tokens[pos]);
    batch.positions.push_back(static_cast<int32_t>(pos));
    batch.seq_of_token.push_back(seq_index);
    batch.slots.push_back(static_cast<int32_t>(pages[pos / page_size] * page_size + pos % page_size));
  }
  if (logits == LogitRows::kLast) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size() - 1));
  rb.num_rows.push_back(static_cast<int64_t>(batch.logit_rows.size()) - rb.first_row.back());
  batch.block_tables.resize(rb.sequences.size() * width, 0);
  std::copy(pages.begin(), pages.end(), batch.block_tables.begin() + seq_index * width);
}

void append_scratch_sequences(ReplicaBatch& rb, int64_t count, int64_t length, int32_t scratch_page,
                              int64_t page_size) {
  const std::vector<int32_t> tokens(static_cast<size_t>(length), 0);
  for (int64_t s = 0; s < count; ++s)
    append_sequence(rb, rb.sequences.size(), tokens, 0, length, std::span(&scratch_page, 1), page_size,
                    LogitRows::kLast);
}

int64_t block_table_width(int64_t pages) {
  int64_t width = 1;
  while (width < pages) width *= 2;
  return width;
}

std::vector<int64_t> block_table_widths(int64_t max_pages) {
  std::vector<int64_t> widths;
  for (int64_t width = block_table_width(max_pages); width >= 1; width /= 2) widths.push_back(width);
  return widths;
}

int64_t padded_token_count(int64_t tokens) {
  if (tokens <= 8) return std::max<int64_t>(tokens, 0);
  int64_t octave = 8;  // tokens in (octave, 2 * octave]: steps of octave / 4
  while (2 * octave < tokens) octave *= 2;
  const int64_t step = octave / 4;
  return (tokens + step - 1) / step * step;
}

void pad_batch(ReplicaBatch& rb, int64_t tokens, int32_t scratch_page, int64_t page_size) {
  ForwardBatch& batch = rb.batch;
  const int64_t real = batch.num_tokens();
  if (tokens <= real) return;
  MS_CHECK(batch.max_pages_per_seq > 0, "padding a batch needs a block-table width");
  bool every_token_has_logits = static_cast<int64_t>(batch.logit_rows.size()) == real;
  for (int64_t r = 0; every_token_has_logits && r < real; ++r) every_token_has_logits = batch.logit_rows[r] == r;
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size()) / batch.max_pages_per_seq;
  batch.block_tables.resize(static_cast<size_t>((num_seqs + 1) * batch.max_pages_per_seq), 0);
  batch.block_tables[num_seqs * batch.max_pages_per_seq] = scratch_page;
  for (int64_t t = real; t < tokens; ++t) {
    if (every_token_has_logits) batch.logit_rows.push_back(static_cast<int32_t>(t));
    batch.tokens.push_back(0);
    batch.positions.push_back(0);
    batch.seq_of_token.push_back(static_cast<int32_t>(num_seqs));
    batch.slots.push_back(static_cast<int32_t>(scratch_page * page_size));
  }
}

void set_draw(StepPlan& step, DrawKind draw) {
  for (MicroBatch& micro_batch : step.micro_batches)
    for (ReplicaBatch& replica : micro_batch.replicas) replica.batch.draw = draw;
}

}  // namespace moeserve::step
