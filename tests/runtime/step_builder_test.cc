// Step building: micro-batches, DP replicas, pages, logit rows.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/step_builder.h"

namespace moeserve::runtime {
namespace {

std::vector<SequenceState> sequences(const std::vector<int>& lengths, int replicas) {
  std::vector<SequenceState> seqs(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    seqs[i].tokens.assign(lengths[i], 7);
    seqs[i].prompt_len = lengths[i];
    seqs[i].replica = static_cast<int>(i % replicas);
  }
  return seqs;
}

TEST(StepBuilder, MicroBatchSize) {
  StepOptions o;
  EXPECT_EQ(micro_batch_size(5, o), 5);  // no PP: one micro-batch
  o.pp = 4;
  EXPECT_EQ(micro_batch_size(5, o), 2);  // ceil(5 / 4): every stage gets work
  EXPECT_EQ(micro_batch_size(0, o), 1);
  o.max_micro_batch_size = 3;
  EXPECT_EQ(micro_batch_size(5, o), 3);
}

TEST(StepBuilder, PrefillSplitsIntoMicroBatchesAndReplicas) {
  auto seqs = sequences({5, 3, 4, 1, 2}, 2);
  std::vector<PagePool> pools = {PagePool(8), PagePool(8)};
  StepOptions o;
  o.page_size = 2;
  o.max_pages_per_seq = 3;
  o.attn_dp = 2;
  o.pp = 2;
  o.max_micro_batch_size = 2;
  const StepPlan step = build_step(seqs, {0, 1, 2, 3, 4}, pools, o);
  ASSERT_EQ(step.micro_batches.size(), 3u);  // {0, 1}, {2, 3}, {4}
  // Micro-batch 0: sequence 0 on replica 0 (5 tokens, 3 pages), sequence 1 on replica 1.
  const ReplicaBatch& a = step.micro_batches[0].replicas[0];
  EXPECT_EQ(a.sequences, (std::vector<size_t>{0}));
  EXPECT_EQ(a.batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.batch.seq_of_token, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(a.batch.logit_rows, (std::vector<int32_t>{4}));
  EXPECT_EQ(seqs[0].pages, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.batch.slots, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.batch.block_tables, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(step.micro_batches[0].replicas[1].sequences, (std::vector<size_t>{1}));
  // Replica 1's pool is separate: sequence 1 starts at page 0 too.
  EXPECT_EQ(seqs[1].pages, (std::vector<int32_t>{0, 1}));
  // Micro-batch 2 has only sequence 4 (replica 0): replica 1 runs it with no tokens.
  EXPECT_EQ(step.micro_batches[2].replicas[1].batch.num_tokens(), 0);
  EXPECT_EQ(step.micro_batches[2].replicas[0].sequences, (std::vector<size_t>{4}));
  for (const auto& s : seqs) EXPECT_EQ(s.cached, s.prompt_len);
}

TEST(StepBuilder, DecodeAndPromptLogits) {
  auto seqs = sequences({3, 2}, 1);
  std::vector<PagePool> pools = {PagePool(4)};
  StepOptions o;
  o.page_size = 4;
  o.max_pages_per_seq = 2;
  o.logits_for_every_token = true;
  StepPlan step = build_step(seqs, {0, 1}, pools, o);
  const ReplicaBatch& rb = step.micro_batches[0].replicas[0];
  EXPECT_EQ(rb.batch.logit_rows, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rb.first_row, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(rb.num_rows, (std::vector<int64_t>{3, 2}));
  // Decode: one new token each; sequence 0 crosses into its second page.
  seqs[0].tokens.push_back(9);
  seqs[0].tokens.push_back(9);
  seqs[1].tokens.push_back(9);
  seqs[0].cached = 4;  // as if one decode step already ran
  o.logits_for_every_token = false;
  step = build_step(seqs, {0, 1}, pools, o);
  const ReplicaBatch& d = step.micro_batches[0].replicas[0];
  EXPECT_EQ(d.batch.positions, (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(d.batch.logit_rows, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(seqs[0].pages.size(), 2u);
}

TEST(StepBuilder, OutOfPages) {
  auto seqs = sequences({9}, 1);
  std::vector<PagePool> pools = {PagePool(2)};
  StepOptions o;
  o.page_size = 4;
  o.max_pages_per_seq = 3;
  try {
    build_step(seqs, {0}, pools, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "out of KV cache pages (raise --kv-pages)");
  }
}

TEST(StepBuilder, PrefillChunkWithoutLogitsThenLastChunk) {
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

TEST(StepBuilder, PaddedTokenCounts) {
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

TEST(StepBuilder, PaddingKeepsTheDecodeShapeAndUsesOnlyTheScratchPage) {
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
}  // namespace moeserve::runtime
