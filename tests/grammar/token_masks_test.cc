// The step loop's structured-output rows (runtime/token_masks.h) over a real grammar: a
// speculative chunk's row i is masked by the grammar's state after its drafts 0..i-1, an
// unconstrained row of the same batch allows every id, the matcher's state is unchanged after
// the walk, and drafts are cut at the first one the grammar rejects.
#include "runtime/token_masks.h"

#include "tests/grammar/grammar_fixture.h"

namespace moeserve::grammar {
namespace {

const std::string kSchema = R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";

std::vector<int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TokenMasks, DraftRowsAreMaskedByTheStateAfterTheDraftsBeforeThem) {
  std::shared_ptr<TokenConstraint> m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  feed(*m, R"({"n)");
  sched::ScheduledStep step;
  step.plan.micro_batches.resize(1);
  step.plan.micro_batches[0].replicas.resize(1);
  step.plan.micro_batches[0].replicas[0].batch.logit_rows = {0, 1, 2, 3, 4};
  // Request 1: rows 0..3 (three drafts); request 2 (unconstrained): row 4.
  step.chunks.push_back(
      {.id = 1, .replica = 0, .micro_batch = 0, .begin = 0, .end = 1, .logit_row = 0, .drafts = bytes_of("\": ")});
  step.chunks.push_back({.id = 2, .replica = 0, .micro_batch = 0, .begin = 1, .end = 2, .logit_row = 4});
  const std::vector<int32_t> before = next_mask(*m);
  runtime::fill_token_masks(
      step, [&](sched::RequestId id) { return id == 1 ? m.get() : nullptr; }, kModelVocab);
  ASSERT_TRUE(step.plan.micro_batches[0].replicas[0].batch.token_bitmask);
  const std::span<const int32_t> mask = step.plan.micro_batches[0].replicas[0].batch.token_bitmask->wait();
  const int64_t words = byte_engine().mask_words();
  ASSERT_EQ(static_cast<int64_t>(mask.size()), 5 * words);
  auto row = [&](int r) { return std::vector<int32_t>(mask.begin() + r * words, mask.begin() + (r + 1) * words); };
  auto probe = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  feed(*probe, R"({"n)");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(row(r), next_mask(*probe)) << "row " << r;
    if (r < 3) {
      ASSERT_TRUE(probe->accept("\": "[r]));
    }
  }
  EXPECT_EQ(row(4), std::vector<int32_t>(static_cast<size_t>(words), -1));
  EXPECT_EQ(next_mask(*m), before);  // the walk was rolled back
}

TEST(TokenMasks, DraftsAreCutAtTheFirstTheGrammarRejects) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kSchema});
  feed(*m, R"({"n": )");
  const std::vector<int32_t> before = next_mask(*m);
  EXPECT_EQ(runtime::allowed_drafts(*m, bytes_of("12x}")), 2u);
  EXPECT_EQ(runtime::allowed_drafts(*m, bytes_of("7}")), 2u);
  EXPECT_EQ(runtime::allowed_drafts(*m, bytes_of("\"")), 0u);
  EXPECT_EQ(next_mask(*m), before);
}

TEST(TokenMasks, BatchesWithoutConstrainedRowsStayUnmasked) {
  sched::ScheduledStep step;
  step.plan.micro_batches.resize(1);
  step.plan.micro_batches[0].replicas.resize(1);
  step.plan.micro_batches[0].replicas[0].batch.logit_rows = {0};
  step.chunks.push_back({.id = 2, .replica = 0, .micro_batch = 0, .begin = 0, .end = 1, .logit_row = 0});
  runtime::fill_token_masks(
      step, [](sched::RequestId) { return nullptr; }, kModelVocab);
  EXPECT_FALSE(step.plan.micro_batches[0].replicas[0].batch.token_bitmask);
}

}  // namespace
}  // namespace moeserve::grammar
