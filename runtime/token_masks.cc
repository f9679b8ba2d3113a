#include "runtime/token_masks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>

#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace moeserve::runtime {
namespace {

// A first row filled faster than this: the others are filled inline too (see StepMasks::fill).
constexpr double kInlineRowMicroseconds = 50;

// The chunk's rows [logit_row, logit_row + drafts + 1) of `mask`.
void fill_chunk(TokenConstraint& constraint, const sched::ScheduledChunk& chunk, TokenBitmask& mask) {
  int accepted = 0;
  for (int64_t i = 0; i < chunk.logit_rows(); ++i) {
    if (!constraint.terminated()) constraint.fill_next_mask(mask.row(chunk.logit_row + i));  // else: all allowed
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

StepMasks::StepMasks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size) {
  const int64_t words = (vocab_size + 31) / 32;
  for (const auto& chunk : step.chunks) {
    TokenConstraint* constraint = chunk.logit_row < 0 ? nullptr : constraint_of(chunk.id);
    if (constraint == nullptr) continue;
    ForwardBatch& batch = step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch;
    if (!batch.token_bitmask) {
      batch.token_bitmask = std::make_shared<TokenBitmask>(static_cast<int64_t>(batch.logit_rows.size()), words);
      masks_.push_back(batch.token_bitmask);
    }
    rows_.push_back({&chunk, constraint, batch.token_bitmask.get()});
  }
}

StepMasks::~StepMasks() {
  for (const auto& mask : masks_) mask->fail("the step loop stopped before filling it");  // no-op once published
}

void StepMasks::fill() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::exception_ptr> errors(rows_.size());
  auto fill_rows = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      try {
        fill_chunk(*rows_[i].constraint, *rows_[i].chunk, *rows_[i].mask);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  // Each request's rows are its own and its matcher is its own, so the host's cores can fill
  // them at once; but a cheap grammar's row takes microseconds, less than waking the pool's
  // threads (which then compete with the ranks' threads), so the first row decides.
  fill_rows(0, std::min<size_t>(1, rows_.size()));
  const double first_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (first_us < kInlineRowMicroseconds) {
    fill_rows(1, rows_.size());
  } else if (rows_.size() > 1) {
    ThreadPool::global().parallel_for(rows_.size() - 1, 1, [&](size_t b, size_t e) { fill_rows(b + 1, e + 1); });
  }
  for (const std::exception_ptr& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      for (const auto& mask : masks_) mask->fail(e.what());
      throw;
    }
  }
  for (const auto& mask : masks_) mask->publish();
  // MOESERVE_GRAMMAR_TIMING=N: every N steps, the mean time to fill a step's masks (beside the
  // last stage's wait for them, model/workspace.cc).
  static const int every = env_int("MOESERVE_GRAMMAR_TIMING", 0);
  if (every <= 0) return;
  static double total_ms = 0;
  static int64_t steps = 0;
  total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (++steps % every == 0)
    std::fprintf(stderr, "grammar timing: %lld steps, mean fill %.3f ms (%zu rows in the last)\n",
                 static_cast<long long>(steps), total_ms / static_cast<double>(steps), rows_.size());
}

void fill_token_masks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size) {
  StepMasks(step, constraint_of, vocab_size).fill();
}

size_t allowed_drafts(TokenConstraint& constraint, std::span<const int32_t> drafts) {
  size_t n = 0;
  while (n < drafts.size() && !constraint.terminated() && constraint.accept(drafts[n])) ++n;
  constraint.rollback(static_cast<int>(n));
  return n;
}

void accept_tokens(std::span<const ConstrainedToken> tokens) {
  // A request's tokens in order on one task, different requests' matchers at once: an accept
  // grows with the matcher's history for some grammars (xgrammar 0.1.27 under an array of at
  // least 1000 items: 30 us a token on average over 256 tokens on one core), and this is on
  // the step's critical path.
  std::map<TokenConstraint*, std::vector<int32_t>> by_constraint;
  for (const ConstrainedToken& t : tokens)
    if (t.constraint != nullptr) by_constraint[t.constraint].push_back(t.token);
  const std::vector<std::pair<TokenConstraint*, std::vector<int32_t>>> work(by_constraint.begin(), by_constraint.end());
  ThreadPool::global().parallel_for(work.size(), 4, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      for (int32_t token : work[i].second) {
        // A masked draw only yields allowed tokens (a grammar that allowed none would leave
        // the matcher where it was rather than take the server down); a terminated grammar's
        // request is being stopped by its caller.
        if (work[i].first->terminated()) break;
        work[i].first->accept(token);
      }
  });
}

}  // namespace moeserve::runtime
