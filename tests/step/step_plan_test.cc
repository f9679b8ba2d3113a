// Step layout helpers: micro-batch sizes, appending sequences, padding.
#include "step/step_plan.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace moeserve::step {
namespace {

TEST(StepPlan, MicroBatchSize) {
  MicroBatching o;
  EXPECT_EQ(micro_batch_size(5, o), 5);  // no PP: one micro-batch
  o.pp = 4;
  EXPECT_EQ(micro_batch_size(5, o), 2);  // ceil(5 / 4): every stage gets work
  EXPECT_EQ(micro_batch_size(0, o), 1);
  o.max_micro_batch_size = 3;
  EXPECT_EQ(micro_batch_size(5, o), 3);
}

TEST(StepPlan, PrefillChunkWithoutLogitsThenLastChunk) {
  ReplicaBatch rb;
  rb.batch.max_pages_per_seq = 2;
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10};
  const std::vector<int32_t> pages = {3, 1};
  append_sequence(rb, 4, tokens, 0, 3, pages, 4, LogitRows::kNone);
  append_sequence(rb, 9, tokens, 3, 6, pages, 4, LogitRows::kLast);
  EXPECT_EQ(rb.sequences, (std::vector<size_t>{4, 9}));
  EXPECT_EQ(rb.batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(rb.batch.slots, (std::vector<int32_t>{12, 13, 14, 15, 4, 5}));
  EXPECT_EQ(rb.batch.seq_of_token, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(rb.batch.logit_rows, (std::vector<int32_t>{5}));
  EXPECT_EQ(rb.num_rows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(rb.first_row, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(rb.batch.block_tables, (std::vector<int32_t>{3, 1, 3, 1}));
  EXPECT_THROW(append_sequence(rb, 1, tokens, 0, 6, std::vector<int32_t>{3}, 4, LogitRows::kLast), Error);
}

TEST(StepPlan, PaddedTokenCounts) {
  EXPECT_EQ(padded_token_count(0), 0);
  EXPECT_EQ(padded_token_count(1), 1);
  EXPECT_EQ(padded_token_count(3), 3);
  EXPECT_EQ(padded_token_count(8), 8);
  EXPECT_EQ(padded_token_count(9), 10);
  EXPECT_EQ(padded_token_count(17), 20);
  EXPECT_EQ(padded_token_count(33), 40);
  EXPECT_EQ(padded_token_count(513), 640);
  for (int64_t t = 1; t < 5000; ++t) {
    const int64_t p = padded_token_count(t);
    EXPECT_GE(p, t);
    EXPECT_LE(p, t + t / 4 + 1) << t;
    EXPECT_EQ(padded_token_count(p), p);
  }
}

TEST(StepPlan, PaddingKeepsTheDecodeShapeAndUsesOnlyTheScratchPage) {
  ReplicaBatch rb;
  rb.batch.max_pages_per_seq = 1;
  const std::vector<int32_t> a = {1, 2}, b = {3};
  append_sequence(rb, 0, a, 1, 2, std::vector<int32_t>{0}, 4, LogitRows::kLast);
  append_sequence(rb, 1, b, 0, 1, std::vector<int32_t>{1}, 4, LogitRows::kLast);
  pad_batch(rb, 4, /*scratch_page=*/7, 4);
  EXPECT_EQ(rb.batch.num_tokens(), 4);
  EXPECT_EQ(rb.batch.logit_rows, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(rb.batch.slots, (std::vector<int32_t>{1, 4, 28, 28}));
  EXPECT_EQ(rb.batch.seq_of_token, (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_EQ(rb.batch.block_tables, (std::vector<int32_t>{0, 1, 7}));
  EXPECT_EQ(rb.sequences.size(), 2u);  // the padding belongs to no sequence

  ReplicaBatch prefill;
  prefill.batch.max_pages_per_seq = 1;
  append_sequence(prefill, 0, std::vector<int32_t>{1, 2, 3}, 0, 3, std::vector<int32_t>{0}, 4, LogitRows::kLast);
  pad_batch(prefill, 4, 7, 4);
  EXPECT_EQ(prefill.batch.logit_rows, (std::vector<int32_t>{2}));  // no rows for the padding
}

}  // namespace
}  // namespace moeserve::step
