// Step building from engine sequences: micro-batches, DP replicas, pages, logit rows.
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

}  // namespace
}  // namespace moeserve::runtime
