// The step loop that `moeserve generate` and `moeserve serve` share: one scheduler
// (sched/scheduler.h) over the engine's KV cache, and step = schedule -> run on every rank
// (Engine::submit) -> draw each finished row's next token (temperature, top_p, top_k, min_p,
// seed; logprobs) -> commit. Continuous batching comes from the scheduler; with pipeline
// groups (SchedulerOptions::pipeline_groups > 1) every group keeps one step in flight, so
// while the last stage runs one group's step the first runs another's.
//
// It knows nothing of text, stop conditions or clients: the caller reads each step's tokens,
// decides which requests are done and calls finish(). Single-threaded: one thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "runtime/engine.h"
#include "runtime/logit_adjust_state.h"
#include "runtime/logprobs.h"
#include "sched/scheduler.h"
#include "spec/draft_budget.h"
#include "spec/drafter.h"
#include "spec/model_drafter.h"
#include "spec/verify.h"
#include "step/token_constraint.h"

namespace moeserve::runtime {

using Clock = std::chrono::steady_clock;

struct LoopRequest {
  std::vector<int32_t> prompt = {};    // ids valid for the model (the caller checks them)
  ops::SamplingOptions sampling = {};  // `step` is set per draw: draws are a pure function of (seed, step)
  int top_logprobs = -1;               // >= 0: each token's logprob and its top_logprobs alternatives
  bool prompt_logits = false;          // every prompt token's fp32 logits (StepResult::prompt_logits)
  // Drafts are verified for it when the loop speculates (StepLoopOptions::speculative), unless
  // it asks for logprobs or prompt logits.
  bool speculative = true;
  int64_t max_new_tokens = 0;  // > 0: no drafts past this many generated tokens
  // Structured output: the request's grammar state (null: unconstrained). Each row it draws
  // is masked to the tokens it allows (runtime/token_masks.h), each token drawn is accepted.
  std::shared_ptr<TokenConstraint> constraint = nullptr;
  // Tokens the request generated before it came here (a re-plan recomputes a running sequence
  // from its prompt and those tokens): its draws continue at that step, as they would have.
  int64_t first_step = 0;
  // Bias, min_tokens masks and penalties, applied on the devices before every draw (a request
  // with any of them does not speculate: its drafts' rows would need each other's tokens).
  ops::LogitAdjustOptions logit_adjust = {};
};

// One token drawn for a request.
struct DrawnToken {
  sched::RequestId id;
  int32_t token;
  TokenLogprob logprob;  // {token, 0, {}} without top_logprobs
};

// The logits of prompt tokens [begin, begin + rows.dim(0)) of a request (one prefill chunk).
struct PromptLogitRows {
  sched::RequestId id;
  int64_t begin;
  Tensor rows;  // [tokens, vocab] fp32
};

// A speculative chunk's verification.
struct VerifiedDrafts {
  sched::RequestId id;
  int64_t drafted, accepted;
};

// A step that completed and was committed.
struct StepResult {
  bool stalled = false;  // nothing could be scheduled and nothing runs: the waiting requests never fit
  // In step order (a speculative chunk's accepted drafts, then its next token); none for
  // requests finished while it ran.
  std::vector<DrawnToken> tokens;
  std::vector<VerifiedDrafts> verified;  // one per chunk that ran drafts
  std::vector<PromptLogitRows> prompt_logits;
  Clock::time_point scheduled;  // when the step was scheduled
  double host_seconds = 0;      // the leader's time on it outside the forward (schedule, draw, commit)
  int64_t prefill_tokens = 0;   // ScheduledStep::prefill_tokens
  // How its rows were drawn (for metrics): from device-reduced candidates, of those the ones
  // that fell back to a draw over their whole logits, and those drawn whole on the devices.
  int64_t candidate_rows = 0, fallback_rows = 0, device_drawn_rows = 0;
  // When the loop speculates: the drafts per sequence its next steps verify (the adaptive
  // budget's choice, else the configured maximum).
  int64_t draft_budget = 0;
};

// The engine failed a step: it has stopped, and so has the loop (nothing in flight completes).
class EngineFailure : public Error {
 public:
  using Error::Error;
};

struct StepLoopOptions {
  sched::SchedulerOptions scheduler = {};  // its max_drafts is speculative's
  spec::SpeculativeOptions speculative = {};
  // Called for every step scheduled, when it is scheduled (serve: queue-time metrics).
  std::function<void(const sched::ScheduledStep&, Clock::time_point)> on_scheduled = {};
};

class StepLoop {
 public:
  StepLoop(Engine& engine, StepLoopOptions options);
  ~StepLoop();
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Before serving: runs every padded step size once (sched::Scheduler::warmup_steps). On an
  // engine that replays graphs, the largest of those, then captures the graph of every
  // decode-shaped step serving can meet (Scheduler::graph_warmup_steps, greedy and, without
  // drafts, candidate draws) and of the model drafter's steps (spec::ModelDrafter::warm_up).
  void warm_up();

  // Queues a request (throws what Scheduler::add throws, e.g. a prompt too long for the cache).
  void add(sched::RequestId id, LoopRequest request);
  // Ends a request wherever it is; a step in flight that holds it draws nothing for it.
  void finish(sched::RequestId id);
  // Lets the steps in flight complete on the ranks and drops their results (shutting down:
  // the engine may outlive the loop). Engine failures are not reported again.
  void finish_in_flight();
  // Nothing waiting, running or in flight.
  bool idle() const { return scheduler_.idle() && in_flight_.empty(); }

  // Submits a step for every pipeline group without one in flight, then completes the oldest
  // in flight: waits for it, draws its rows, commits. Throws EngineFailure when the engine
  // failed or the first step's logits are NaN or infinite (check_first_logits); anything else
  // it throws is a bookkeeping bug.
  StepResult step();

  sched::Scheduler& scheduler() { return scheduler_; }
  const sched::Scheduler& scheduler() const { return scheduler_; }

 private:
  struct Flight {
    sched::ScheduledStep step;
    DrawKind draw;
    StepTicket ticket;
    Clock::time_point scheduled;
  };
  // The logit rows a step draws from, in step order, and the request of each (null: ended).
  struct Rows {
    std::vector<const sched::ScheduledChunk*> chunks;
    std::vector<const LoopRequest*> owners;
  };
  void top_up();
  // The draw a step needs, and (set on every batch, with, for candidates or device draws,
  // each logit row's options).
  DrawKind choose_draw(sched::ScheduledStep& step) const;
  void set_row_options(sched::ScheduledStep& step, DrawKind draw) const;
  // Each batch's logit adjustments, from the requests that have them (LogitAdjustState).
  void set_logit_adjust(sched::ScheduledStep& step) const;
  // The options of a request's next draw.
  ops::SamplingOptions next_draw(sched::RequestId id, const LoopRequest& request) const;
  Rows rows_of(const sched::ScheduledStep& step) const;
  void draw(const Flight& flight, StepOutputs& outputs, StepResult& result, std::vector<int64_t>& accepted);
  // A speculative chunk's verdict from its logit rows.
  spec::Verdict verify(const Flight& flight, const StepOutputs& outputs, const sched::ScheduledChunk& chunk,
                       const LoopRequest& owner) const;
  // The drafts of a request's next step (none when it does not speculate).
  std::vector<int32_t> drafts_for(sched::RequestId id, std::span<const int32_t> tokens) const;
  // result.tokens gains each speculative chunk's accepted drafts before its next token.
  void expand_accepted(const Flight& flight, const std::vector<int64_t>& accepted, StepResult& result) const;
  // The first step's logit rows, from what the draw brought to the host (greedy: each row's
  // maximum; candidates: the top ones; logits: the rows): a NaN or infinite one is an error
  // naming the model (broken weights would otherwise draw token 0 for ever). Device draws
  // (kSampled) bring no logits and are not checked.
  void check_first_logits(const Flight& flight, const StepOutputs& outputs, const Rows& rows);
  // Draws that reached past their row's candidates, over the rows' whole logits on the devices.
  void draw_fallbacks(const Rows& rows, std::vector<DrawnToken>& drawn, StepResult& result);
  // Structured output: every token of `result` through its request's constraint.
  void accept_constrained(const StepResult& result);
  void collect_prompt_logits(const sched::ScheduledStep& step, const StepOutputs& outputs, StepResult& result) const;
  // Runs an engine call; an exception from it stops the loop and becomes an EngineFailure.
  template <typename Fn>
  auto on_engine(Fn&& fn) -> decltype(fn());

  Engine& engine_;
  StepLoopOptions options_;
  // After a committed step, the model drafter's catch-up and drafts (CommittedSpan per chunk).
  void after_step(const Flight& flight, const std::vector<int64_t>& accepted);
  // Drafts a request's next step may verify: its room in the context and in max_new_tokens,
  // and the step's draft budget.
  int64_t draft_room(sched::RequestId id, const LoopRequest& r, int64_t tokens) const;
  // The adaptive budget measures the step that completed (`seconds` up to its commit) and
  // chooses the drafts of the next.
  void update_draft_budget(const Flight& flight, const std::vector<int64_t>& accepted, double seconds);

  std::unique_ptr<spec::Drafter> drafter_;             // NGRAM (null: none)
  std::unique_ptr<spec::ModelDrafter> model_drafter_;  // NEXTN (null: none)
  // Speculative options' adaptive, with one pipeline group (several keep steps in flight, so
  // a step's own time is not measured): each step's drafts per sequence.
  std::unique_ptr<spec::DraftBudget> draft_budget_;
  int64_t step_drafts_ = 0;      // drafts per sequence of the steps scheduled next
  double drafting_seconds_ = 0;  // the model drafter's time drafting for the next step
  int64_t budget_steps_ = 0;     // steps the budget measured or chose for
  sched::Scheduler scheduler_;
  std::unordered_map<sched::RequestId, LoopRequest> requests_;
  std::unordered_map<sched::RequestId, LogitAdjustState> adjust_;  // the requests with logit adjustments
  std::deque<Flight> in_flight_;                                   // oldest first
  bool logits_checked_ = false;                                    // check_first_logits has seen a step with logit rows
};

}  // namespace moeserve::runtime
