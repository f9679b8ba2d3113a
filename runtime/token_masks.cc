#include "runtime/token_masks.h"

#include "core/error.h"
#include "core/thread_pool.h"

namespace moeserve::runtime {
namespace {

// The chunk's rows [logit_row, logit_row + drafts + 1) of `mask` [rows, words].
void fill_chunk(TokenConstraint& constraint, const sched::ScheduledChunk& chunk, std::vector<int32_t>& mask,
                int64_t words) {
  int accepted = 0;
  for (int64_t i = 0; i < chunk.logit_rows(); ++i) {
    std::span<int32_t> row(mask.data() + (chunk.logit_row + i) * words, static_cast<size_t>(words));
    if (!constraint.terminated()) constraint.fill_next_mask(row);  // terminated: the request stops; all allowed
    if (i < static_cast<int64_t>(chunk.drafts.size())) {
      MS_CHECK(constraint.accept(chunk.drafts[static_cast<size_t>(i)]),
               "structured output: draft {} of request {} is not allowed by its grammar (drafts are cut first)", i,
               chunk.id);
      ++accepted;
    }
  }
  constraint.rollback(accepted);
}

}  // namespace

void fill_token_masks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size) {
  const int64_t words = (vocab_size + 31) / 32;
  std::vector<std::pair<const sched::ScheduledChunk*, TokenConstraint*>> constrained;
  for (const auto& chunk : step.chunks) {
    TokenConstraint* constraint = chunk.logit_row < 0 ? nullptr : constraint_of(chunk.id);
    if (constraint == nullptr) continue;
    ForwardBatch& batch = step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch;
    if (batch.token_bitmask.empty())
      batch.token_bitmask.assign(batch.logit_rows.size() * static_cast<size_t>(words), -1);
    constrained.emplace_back(&chunk, constraint);
  }
  // Each request's rows are its own and its matcher is its own: the host's cores fill them at
  // once (a grammar's mask over a large vocabulary is the costly part of a constrained step).
  ThreadPool::global().parallel_for(constrained.size(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const sched::ScheduledChunk& chunk = *constrained[i].first;
      fill_chunk(*constrained[i].second, chunk,
                 step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch.token_bitmask, words);
    }
  });
}

size_t allowed_drafts(TokenConstraint& constraint, std::span<const int32_t> drafts) {
  size_t n = 0;
  while (n < drafts.size() && !constraint.terminated() && constraint.accept(drafts[n])) ++n;
  constraint.rollback(static_cast<int>(n));
  return n;
}

}  // namespace moeserve::runtime
