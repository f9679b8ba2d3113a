// Structured output in the step loop: the bitmask rows of a step's constrained requests
// (ForwardBatch::token_bitmask), and their speculative drafts cut where their grammar
// rejects one. A constraint's state is the request's output so far; filling the rows of a
// speculative chunk walks its drafts (row i: the state after drafts 0..i-1) and rolls them
// back, so the target's tokens are masked exactly as plain steps would mask them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "sched/scheduler.h"
#include "step/token_constraint.h"

namespace moeserve::runtime {

// The constraint of a request (null: unconstrained or ended).
using ConstraintOf = std::function<TokenConstraint*(sched::RequestId)>;

// Sets token_bitmask on every batch of `step` that has a constrained row ([logit_rows, words],
// all ones for the unconstrained rows); leaves the others empty.
void fill_token_masks(sched::ScheduledStep& step, const ConstraintOf& constraint_of, int64_t vocab_size);

// How many of `drafts` the constraint accepts in a row (its state unchanged on return).
size_t allowed_drafts(TokenConstraint& constraint, std::span<const int32_t> drafts);

}  // namespace moeserve::runtime
