// Structured output in the step loop: the bitmask rows of a step's constrained requests
// (ForwardBatch::token_bitmask), and their speculative drafts cut where their grammar
// rejects one. A constraint's state is the request's output so far; filling the rows of a
// speculative chunk walks its drafts (row i: the state after drafts 0..i-1) and rolls them
// back, so the target's tokens are masked exactly as plain steps would mask them.
//
// The masks are filled while the step runs (step/token_bitmask.h): StepMasks attaches them
// before the step is submitted, fill() writes them after, while the ranks run the forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "sched/scheduler.h"
#include "step/token_constraint.h"

namespace moeserve::runtime {

// The constraint of a request (null: unconstrained or ended).
using ConstraintOf = std::function<TokenConstraint*(sched::RequestId)>;

class StepMasks {
 public:
  // Attaches a token bitmask ([logit_rows, words], all ones) to every batch of `step` that has
  // a constrained row; leaves the others without one. `step` must outlive fill().
  StepMasks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size);
  // A mask never filled fails: a rank waiting for it throws instead of waiting for ever.
  ~StepMasks();
  StepMasks(const StepMasks&) = delete;
  StepMasks& operator=(const StepMasks&) = delete;

  // Fills every constrained row (the requests at once, on the thread pool) and publishes the
  // masks. Throws (after failing the masks) when a chunk's draft is not allowed.
  void fill();
  bool empty() const { return rows_.empty(); }

 private:
  struct Rows {
    const sched::ScheduledChunk* chunk;
    TokenConstraint* constraint;
    TokenBitmask* mask;
  };
  std::vector<Rows> rows_;
  std::vector<std::shared_ptr<TokenBitmask>> masks_;
};

// Attaches and fills at once (what StepMasks does in two steps).
void fill_token_masks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size);

// How many of `drafts` the constraint accepts in a row (its state unchanged on return).
size_t allowed_drafts(TokenConstraint& constraint, std::span<const int32_t> drafts);

// Every token through its request's constraint (null: unconstrained; terminated: skipped), a
// request's in order, the requests at once on the thread pool (each matcher is its own).
struct ConstrainedToken {
  TokenConstraint* constraint;
  int32_t token;
};
void accept_tokens(std::span<const ConstrainedToken> tokens);

}  // namespace moeserve::runtime
