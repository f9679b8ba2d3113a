// A drafter with a model of its own (NEXTN now; EAGLE3 and DFLASH fit the same shape): it
// runs forwards of its model after each target step, on the target's hidden states, so that a
// sequence's drafts are ready when its next step is scheduled. spec/ holds the interface and
// no tensors; the implementations live in runtime/ beside the engine they submit to
// (runtime/mtp_drafter.h). Drafts are proposals only: whatever they are, the verifier
// (spec/verify.h) keeps the target's outputs exact.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moeserve::spec {

// One sequence's part of a committed target step.
struct CommittedSpan {
  uint64_t id = 0;
  int replica = 0;  // its attention-DP replica (its pages are that replica's)
  // Positions [begin, end) whose target hidden states the step computed and the sequence kept
  // (a prefill chunk, or the verified token and its accepted drafts).
  int64_t begin = 0, end = 0;
  int64_t max_drafts = 0;  // > 0: the sequence sampled a token and its next step may verify this many drafts
};

class ModelDrafter {
 public:
  virtual ~ModelDrafter() = default;
  // After a target step was committed: the drafter's model catches up on the positions the
  // target computed (its own cache of them) and drafts for the spans that ask.
  virtual void after_step(std::span<const CommittedSpan> committed) = 0;
  // The drafts for a sequence's next step (empty: none); they are handed out once.
  virtual std::vector<int32_t> take(uint64_t id) = 0;
  // The sequence ended: its drafts are dropped.
  virtual void forget(uint64_t id) = 0;
  // Whether the last after_step also caught sequences up on positions of earlier steps after
  // which it had not run (nothing drafted): its time is the price of resuming, paid once, not
  // the steady cost of drafting (spec/draft_budget.h does not measure that step).
  virtual bool filled_gaps() const { return false; }
  // Before serving, on an engine that replays graphs: runs each shape of its draft steps for
  // up to `max_sequences` sequences of up to `max_context` tokens twice, so that the engine
  // captures their graphs then, not while serving.
  virtual void warm_up(int64_t max_sequences, int64_t max_context) {
    (void)max_sequences;
    (void)max_context;
  }
};

}  // namespace moeserve::spec
