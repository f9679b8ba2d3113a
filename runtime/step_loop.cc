#include "runtime/step_loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "runtime/mtp_drafter.h"
#include "runtime/token_masks.h"
#include "sample/sampler.h"

namespace moeserve::runtime {

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool all_finite(const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i])) return false;
  return true;
}

constexpr int64_t kBudgetLogSteps = 1024;  // steps between the draft budget's debug log lines

bool greedy(const ops::SamplingOptions& o) { return o.temperature <= 0.0f || o.top_k == 1; }

StepLoopOptions with_drafts(StepLoopOptions options) {
  options.scheduler.max_drafts = options.speculative.max_drafts();
  return options;
}
}  // namespace

StepLoop::StepLoop(Engine& engine, StepLoopOptions options)
    : engine_(engine),
      options_(with_drafts(std::move(options))),
      drafter_(spec::make_drafter(options_.speculative)),
      scheduler_(options_.scheduler) {
  if (options_.speculative.algorithm == spec::Algorithm::kNextn)
    model_drafter_ = std::make_unique<MtpDrafter>(engine_, scheduler_);
  step_drafts_ = options_.speculative.max_drafts();
  if (options_.speculative.adaptive && step_drafts_ > 0 && options_.scheduler.pipeline_groups == 1)
    draft_budget_ = std::make_unique<spec::DraftBudget>(step_drafts_);
}

StepLoop::~StepLoop() {
  finish_in_flight();
  if (draft_budget_) log(LogLevel::kDebug, "{}", draft_budget_->describe());
}

void StepLoop::finish_in_flight() {
  for (const Flight& flight : in_flight_) {
    try {
      engine_.wait(flight.ticket);
    } catch (const std::exception&) {  // the engine failed: whoever drove the loop was told
    }
  }
  in_flight_.clear();
}

template <typename Fn>
auto StepLoop::on_engine(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    in_flight_.clear();  // the engine has stopped: nothing submitted will complete
    throw EngineFailure(e.what());
  }
}

void StepLoop::warm_up() {
  auto run = [&](step::StepPlan plan) { on_engine([&] { return engine_.wait(engine_.submit(std::move(plan))); }); };
  std::vector<step::StepPlan> steps = scheduler_.warmup_steps();
  const sched::SchedulerOptions& o = scheduler_.options();
  if (!engine_.replays_graphs() || !o.pad_batches) {
    for (step::StepPlan& plan : steps) run(std::move(plan));
    return;
  }
  run(std::move(steps.front()));  // the largest: it sizes the activation memory
  const Clock::time_point start = Clock::now();
  const int64_t max_context = engine_.config().max_position_embeddings;
  const int64_t plain_tokens = step::padded_token_count(o.max_running_requests);
  for (step::StepPlan& plan : scheduler_.graph_warmup_steps(o.max_running_requests, max_context)) {
    // Greedy rows, and sampled rows without drafts (kCandidates; sampled drafts are verified
    // from whole logits, eagerly brought to the host anyway).
    std::vector<DrawKind> draws{DrawKind::kGreedy};
    const bool verify = plan.micro_batches.front().replicas.front().batch.num_tokens() > plain_tokens;
    if (!verify && o.pipeline_groups == 1) draws.push_back(DrawKind::kCandidates);
    for (DrawKind draw : draws) {
      step::set_draw(plan, draw);
      for (auto& rb : plan.micro_batches.front().replicas)
        rb.batch.temperatures.assign(draw == DrawKind::kCandidates ? rb.batch.logit_rows.size() : 0, 0.0f);
      for (int pass = 0; pass < 2; ++pass) run(plan);  // the second pass is captured
    }
  }
  if (model_drafter_) on_engine([&] { model_drafter_->warm_up(o.max_running_requests, max_context); });
  log(LogLevel::kInfo, "warm-up: {} step graphs captured in {:.1f} s", engine_.graphs_captured(),
      seconds_between(start, Clock::now()));
}

void StepLoop::add(sched::RequestId id, LoopRequest request) {
  scheduler_.add(id, request.prompt, {.prompt_logits = request.prompt_logits});
  if (request.logit_adjust.active()) {
    request.speculative = false;
    adjust_.insert_or_assign(id, LogitAdjustState(request.logit_adjust, request.prompt));
  }
  requests_.emplace(id, std::move(request));
}

void StepLoop::finish(sched::RequestId id) {
  if (model_drafter_) model_drafter_->forget(id);
  scheduler_.finish(id);
  requests_.erase(id);
  adjust_.erase(id);
}

ops::SamplingOptions StepLoop::next_draw(sched::RequestId id, const LoopRequest& request) const {
  ops::SamplingOptions options = request.sampling;
  options.step = static_cast<uint64_t>(request.first_step + scheduler_.generated_tokens(id));
  return options;
}

DrawKind StepLoop::choose_draw(sched::ScheduledStep& step) const {
  // The least that lets every row be drawn: greedy rows without logprobs need only each row's
  // argmax; sampled rows their top candidates and softmax normaliser (both reduced on the
  // devices); full fp32 logits come to the host only for logprobs, prompt logits or a top_k
  // beyond the candidates. A step of several micro-batches (the candidates' fallback can fetch
  // the last one's logits only) and a pipeline group's step (a later group's step may replace
  // its logits on the devices before a fallback could fetch them) draw every row on the
  // devices right after its micro-batch instead (kSampled), under options uploaded with the batch.
  DrawKind draw = DrawKind::kGreedy;
  for (const auto& chunk : step.chunks) {
    const LoopRequest& r = requests_.at(chunk.id);
    if (chunk.prompt_rows) draw = DrawKind::kLogits;
    if (chunk.logit_row < 0) continue;
    const bool greedy_row = greedy(r.sampling);
    // Sampled drafts are verified against each row's whole distribution, on the host.
    if (r.top_logprobs >= 0 || r.sampling.top_k > sample::kCandidatesPerSlice ||
        (!greedy_row && !chunk.drafts.empty())) {
      draw = DrawKind::kLogits;
    } else if (!greedy_row && draw == DrawKind::kGreedy) {
      draw = DrawKind::kCandidates;
    }
  }
  const bool pipelined = scheduler_.options().pipeline_groups > 1;
  if (draw == DrawKind::kCandidates && (step.plan.micro_batches.size() != 1 || pipelined)) draw = DrawKind::kSampled;
  return draw;
}

void StepLoop::set_row_options(sched::ScheduledStep& step, DrawKind draw) const {
  step::set_draw(step.plan, draw);
  if (draw != DrawKind::kSampled && draw != DrawKind::kCandidates) return;
  for (auto& micro_batch : step.plan.micro_batches)
    for (auto& replica : micro_batch.replicas) {
      const size_t rows = replica.batch.logit_rows.size();
      // Rows that draw nothing (padding) are greedy: temperature 0.
      if (draw == DrawKind::kSampled) replica.batch.sampling.assign(rows, {});
      if (draw == DrawKind::kCandidates) replica.batch.temperatures.assign(rows, 0.0f);
    }
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    const LoopRequest& r = requests_.at(chunk.id);
    ForwardBatch& batch = step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch;
    if (draw == DrawKind::kSampled) batch.sampling[chunk.logit_row] = next_draw(chunk.id, r);
    if (draw == DrawKind::kCandidates)
      batch.temperatures[chunk.logit_row] = r.sampling.top_k == 1 ? 0.0f : std::max(r.sampling.temperature, 0.0f);
  }
}

void StepLoop::set_logit_adjust(sched::ScheduledStep& step) const {
  for (const auto& chunk : step.chunks) {
    auto it = adjust_.find(chunk.id);
    if (chunk.logit_row < 0 || it == adjust_.end()) continue;
    ForwardBatch& batch = step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch;
    it->second.append_entries(static_cast<int32_t>(chunk.logit_row), batch.logit_adjust);
  }
}

void StepLoop::top_up() {
  const int groups = scheduler_.options().pipeline_groups;
  for (int g = 0; g < groups; ++g) {
    if (std::any_of(in_flight_.begin(), in_flight_.end(), [&](const Flight& f) { return f.step.group == g; })) continue;
    const auto scheduled = Clock::now();
    sched::ScheduledStep step = scheduler_.schedule(
        g, [this](sched::RequestId id, std::span<const int32_t> tokens) { return drafts_for(id, tokens); });
    if (step.empty()) continue;
    if (options_.on_scheduled) options_.on_scheduled(step, scheduled);
    const DrawKind draw = choose_draw(step);
    set_row_options(step, draw);
    if (!adjust_.empty()) set_logit_adjust(step);
    StepMasks masks(
        step,
        [this](sched::RequestId id) -> TokenConstraint* {
          auto it = requests_.find(id);
          return it == requests_.end() ? nullptr : it->second.constraint.get();
        },
        engine_.config().vocab_size);
    const StepTicket ticket = on_engine([&] { return engine_.submit(step.plan); });
    in_flight_.push_back({std::move(step), draw, ticket, scheduled});
    // While the ranks run the forward: the masks are needed only after the LM head.
    if (!masks.empty()) masks.fill();
  }
}

StepResult StepLoop::step() {
  const auto top_up_start = Clock::now();
  top_up();
  StepResult result;
  if (in_flight_.empty()) {
    result.stalled = true;
    return result;
  }
  Flight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto wait_start = Clock::now();
  StepOutputs outputs = on_engine([&] { return engine_.wait(oldest.ticket); });
  const auto wait_end = Clock::now();
  std::vector<int64_t> accepted;  // per row chunk: drafts accepted
  draw(oldest, outputs, result, accepted);
  collect_prompt_logits(oldest.step, outputs, result);
  std::vector<int32_t> sampled;
  for (const DrawnToken& t : result.tokens) sampled.push_back(t.token);
  scheduler_.commit(oldest.step, sampled, accepted);
  if (draft_budget_) update_draft_budget(oldest, accepted, seconds_between(top_up_start, Clock::now()));
  if (model_drafter_) {
    const auto drafting_start = Clock::now();
    after_step(oldest, accepted);
    drafting_seconds_ = seconds_between(drafting_start, Clock::now());
  }
  for (const DrawnToken& t : result.tokens)  // requests with adjustments take no drafts
    if (auto it = adjust_.find(t.id); it != adjust_.end()) it->second.add_output(t.token);
  expand_accepted(oldest, accepted, result);
  // Tokens of requests that ended while the step ran were drawn as placeholders: drop them.
  std::erase_if(result.tokens, [&](const DrawnToken& t) { return !requests_.count(t.id); });
  accept_constrained(result);
  result.scheduled = oldest.scheduled;
  result.prefill_tokens = oldest.step.prefill_tokens;
  result.draft_budget = step_drafts_;
  // Not the time the step spent in flight behind other groups' steps.
  result.host_seconds = seconds_between(top_up_start, wait_start) + seconds_between(wait_end, Clock::now());
  return result;
}

StepLoop::Rows StepLoop::rows_of(const sched::ScheduledStep& step) const {
  Rows rows;
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    rows.chunks.push_back(&chunk);
    auto it = requests_.find(chunk.id);  // a pipeline group's step may outlive a request
    rows.owners.push_back(it == requests_.end() ? nullptr : &it->second);
  }
  return rows;
}

int64_t StepLoop::draft_room(sched::RequestId id, const LoopRequest& r, int64_t tokens) const {
  if (!r.speculative || r.top_logprobs >= 0 || r.prompt_logits) return 0;
  // No drafts past the request's last token or the model's context (the next token is always drawn).
  int64_t room = engine_.config().max_position_embeddings - tokens;
  if (r.max_new_tokens > 0) room = std::min(room, r.max_new_tokens - scheduler_.generated_tokens(id) - 1);
  return std::max<int64_t>(0, std::min(room, step_drafts_));
}

void StepLoop::update_draft_budget(const Flight& flight, const std::vector<int64_t>& accepted, double seconds) {
  // The step's drafts were made while the previous step completed (a model drafter's forwards)
  // or when it was scheduled (NGRAM, inside `seconds`).
  spec::DraftStepSample sample{.drafts = step_drafts_, .seconds = seconds + drafting_seconds_};
  size_t row = 0;  // accepted[] is per chunk with a logit row
  for (const sched::ScheduledChunk& chunk : flight.step.chunks) {
    if (chunk.logit_row < 0) continue;
    const int64_t drafted = static_cast<int64_t>(chunk.drafts.size());
    const int64_t kept = accepted.empty() ? 0 : accepted[row];
    ++row;
    ++sample.sequences;
    sample.drafting += drafted > 0 ? 1 : 0;
    sample.drafted += drafted;
    sample.accepted += kept;
    sample.rejected += kept < drafted ? 1 : 0;
  }
  // A step with prompt tokens costs what its prefill costs: it measures nothing of decoding.
  // Drafts made while the drafter caught up on skipped positions cost what resuming costs
  // (its last after_step made this step's drafts: the next one runs after this).
  if (flight.step.prefill_tokens == 0) {
    if (model_drafter_ && model_drafter_->filled_gaps())
      draft_budget_->record_unmeasured(sample);
    else
      draft_budget_->record(sample);
  }
  if (sample.sequences > 0) step_drafts_ = draft_budget_->choose(sample.sequences);
  if (++budget_steps_ % kBudgetLogSteps == 0) log(LogLevel::kDebug, "{}", draft_budget_->describe());
}

std::vector<int32_t> StepLoop::drafts_for(sched::RequestId id, std::span<const int32_t> tokens) const {
  auto it = requests_.find(id);
  if ((!drafter_ && !model_drafter_) || it == requests_.end()) return {};
  const LoopRequest& r = it->second;
  const int64_t room = draft_room(id, r, static_cast<int64_t>(tokens.size()));
  // A model drafter drafted after the sequence's last commit (after_step).
  std::vector<int32_t> drafts = model_drafter_ ? model_drafter_->take(id) : drafter_->propose(tokens, room);
  if (static_cast<int64_t>(drafts.size()) > room) drafts.resize(static_cast<size_t>(room));
  if (r.constraint) drafts.resize(allowed_drafts(*r.constraint, drafts));  // cut at the first the grammar rejects
  return drafts;
}

void StepLoop::after_step(const Flight& flight, const std::vector<int64_t>& accepted) {
  std::vector<spec::CommittedSpan> spans;
  size_t row = 0;  // accepted[] is per chunk with a logit row
  for (const sched::ScheduledChunk& chunk : flight.step.chunks) {
    const bool sampled = chunk.logit_row >= 0;
    const int64_t kept = sampled && !accepted.empty() ? accepted[row] : 0;
    row += sampled ? 1 : 0;
    auto it = requests_.find(chunk.id);
    if (it == requests_.end()) continue;  // ended while the step ran
    // Every request's computed positions feed the MTP cache (a later request may share its
    // prefix pages); only speculative ones get drafts.
    const int64_t end = chunk.end + kept;
    const int64_t room = sampled ? draft_room(chunk.id, it->second, end + 1) : 0;
    spans.push_back({.id = chunk.id, .replica = chunk.replica, .begin = chunk.begin, .end = end, .max_drafts = room});
  }
  on_engine([&] {
    model_drafter_->after_step(spans);
    return 0;
  });
}

void StepLoop::accept_constrained(const StepResult& result) {
  std::vector<ConstrainedToken> tokens;
  for (const DrawnToken& t : result.tokens)
    if (TokenConstraint* constraint = requests_.at(t.id).constraint.get()) tokens.push_back({constraint, t.token});
  if (!tokens.empty()) accept_tokens(tokens);
}

spec::Verdict StepLoop::verify(const Flight& flight, const StepOutputs& outputs, const sched::ScheduledChunk& chunk,
                               const LoopRequest& owner) const {
  const int64_t vocab = engine_.config().vocab_size, rows = chunk.logit_rows();
  const auto m = chunk.micro_batch;
  const auto d = static_cast<size_t>(chunk.replica);
  if (flight.draw == DrawKind::kLogits && !greedy(owner.sampling))
    return spec::verify_sampled(chunk.drafts, outputs.rows.at(m).at(d).f32() + chunk.logit_row * vocab, vocab,
                                next_draw(chunk.id, owner));
  std::vector<int32_t> target(static_cast<size_t>(rows));  // each row's argmax
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = chunk.logit_row + i;
    if (flight.draw == DrawKind::kGreedy || flight.draw == DrawKind::kSampled) {
      target[i] = outputs.rows.at(m).at(d).i32()[r];
    } else if (flight.draw == DrawKind::kCandidates) {
      const sample::SampleCandidates& c = outputs.candidates.at(m).at(d);
      target[i] = c.ids[r * c.count];  // the largest logit, ties to the smaller id
    } else {
      target[i] = cpu::sample_row(outputs.rows.at(m).at(d).f32() + r * vocab, vocab, {});
    }
  }
  return spec::verify_greedy(chunk.drafts, target);
}

void StepLoop::expand_accepted(const Flight& flight, const std::vector<int64_t>& accepted, StepResult& result) const {
  const Rows rows = rows_of(flight.step);
  std::vector<DrawnToken> tokens;
  for (size_t i = 0; i < rows.chunks.size(); ++i) {
    const sched::ScheduledChunk& chunk = *rows.chunks[i];
    if (!chunk.drafts.empty())
      result.verified.push_back({chunk.id, static_cast<int64_t>(chunk.drafts.size()), accepted[i]});
    for (int64_t j = 0; j < accepted[i]; ++j) tokens.push_back({chunk.id, chunk.drafts[j], {chunk.drafts[j], 0, {}}});
    tokens.push_back(std::move(result.tokens[i]));
  }
  result.tokens = std::move(tokens);
}

void StepLoop::draw(const Flight& flight, StepOutputs& outputs, StepResult& result, std::vector<int64_t>& accepted) {
  const DrawKind draw = flight.draw;
  const std::vector<std::vector<Tensor>>& logits = outputs.rows;  // or drawn ids
  const int64_t vocab = engine_.config().vocab_size;
  const Rows rows = rows_of(flight.step);
  check_first_logits(flight, outputs, rows);
  std::vector<DrawnToken>& drawn = result.tokens;
  drawn.assign(rows.chunks.size(), DrawnToken{});
  accepted.assign(rows.chunks.size(), 0);
  auto sample = [&](size_t i) {
    const sched::ScheduledChunk& chunk = *rows.chunks[i];
    drawn[i].id = chunk.id;
    const LoopRequest* owner = rows.owners[i];
    if (owner == nullptr) return;
    if (!chunk.drafts.empty()) {
      const spec::Verdict verdict = verify(flight, outputs, chunk, *owner);
      accepted[i] = verdict.accepted;
      drawn[i].token = verdict.tokens.back();
    } else if (draw == DrawKind::kGreedy || draw == DrawKind::kSampled) {  // ids drawn on the devices
      drawn[i].token = logits.at(chunk.micro_batch).at(chunk.replica).i32()[chunk.logit_row];
    } else if (draw == DrawKind::kCandidates) {  // -1: drawn over the row's whole logits below
      const sample::SampleCandidates& c = outputs.candidates.at(chunk.micro_batch).at(chunk.replica);
      const int64_t r = chunk.logit_row;
      drawn[i].token =
          cpu::sample_candidates({c.values.data() + r * c.count, c.ids.data() + r * c.count, c.count, c.normaliser[r]},
                                 vocab, next_draw(chunk.id, *owner));
    } else {
      const float* row = logits.at(chunk.micro_batch).at(chunk.replica).f32() + chunk.logit_row * vocab;
      drawn[i].token = cpu::sample_row(row, vocab, next_draw(chunk.id, *owner));
      if (owner->top_logprobs >= 0) drawn[i].logprob = token_logprob(row, vocab, drawn[i].token, owner->top_logprobs);
    }
  };
  if (draw != DrawKind::kLogits) {
    for (size_t i = 0; i < drawn.size(); ++i) sample(i);
  } else {
    // Rows are independent and each sorts a vocabulary of logits: over the host's cores (the
    // ranks' threads are idle between steps). Results do not depend on the split.
    ThreadPool::global().parallel_for(drawn.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) sample(i);
    });
  }
  draw_fallbacks(rows, drawn, result);
  if (draw == DrawKind::kCandidates) result.candidate_rows = static_cast<int64_t>(drawn.size());
  if (draw == DrawKind::kSampled) result.device_drawn_rows = static_cast<int64_t>(drawn.size());
  // Rows that asked for logprobs always run with the logits draw, where sample() filled them.
  for (size_t i = 0; i < drawn.size(); ++i)
    if (rows.owners[i] != nullptr && rows.owners[i]->top_logprobs < 0) drawn[i].logprob = {drawn[i].token, 0, {}};
}

void StepLoop::check_first_logits(const Flight& flight, const StepOutputs& outputs, const Rows& rows) {
  // Rows drawn wholly on the device bring no values back: the first step that does is checked.
  if (logits_checked_ || rows.chunks.empty() || flight.draw == DrawKind::kSampled) return;
  const int64_t vocab = engine_.config().vocab_size;
  for (size_t i = 0; i < rows.chunks.size(); ++i) {
    const sched::ScheduledChunk* chunk = rows.chunks[i];
    if (rows.owners[i] != nullptr && rows.owners[i]->constraint) continue;  // masked ids are -inf by design
    if (adjust_.count(chunk->id)) continue;                                 // min_tokens masks are -inf on purpose
    logits_checked_ = true;
    const int64_t r = chunk->logit_row;
    bool finite = true;
    if (flight.draw == DrawKind::kGreedy) {
      finite = std::isfinite(outputs.maxima.at(chunk->micro_batch).at(chunk->replica).at(static_cast<size_t>(r)));
    } else if (flight.draw == DrawKind::kCandidates) {
      const sample::SampleCandidates& c = outputs.candidates.at(chunk->micro_batch).at(chunk->replica);
      finite = all_finite(c.values.data() + r * c.count, c.count) && std::isfinite(c.normaliser[r]);
    } else if (flight.draw == DrawKind::kLogits) {
      finite = all_finite(outputs.rows.at(chunk->micro_batch).at(chunk->replica).f32() + r * vocab, vocab);
    }
    if (!finite)
      throw EngineFailure(fmt::format(
          "model {} produced non-finite logits (NaN/Inf) at the first step: check its weights", engine_.model_name()));
  }
}

void StepLoop::draw_fallbacks(const Rows& rows, std::vector<DrawnToken>& drawn, StepResult& result) {
  // The rows' logits are still on the devices until the next step (one call per replica; only
  // the tokens come back). Steps in flight never draw kCandidates: a later step would
  // have overwritten these logits.
  std::map<int, std::vector<size_t>> fallback;  // replica -> indices into rows
  for (size_t i = 0; i < drawn.size(); ++i)
    if (drawn[i].token < 0) fallback[rows.chunks[i]->replica].push_back(i);
  for (const auto& [replica_key, indices] : fallback) {
    const int replica = replica_key;  // clang 14 cannot capture a structured binding in a lambda
    std::vector<int64_t> logit_rows;
    std::vector<ops::SamplingOptions> options;
    for (size_t i : indices) {
      logit_rows.push_back(rows.chunks[i]->logit_row);
      options.push_back(next_draw(rows.chunks[i]->id, *rows.owners[i]));
    }
    const std::vector<int32_t> tokens =
        on_engine([&] { return engine_.sample_logits_rows(replica, logit_rows, options); });
    for (size_t j = 0; j < indices.size(); ++j) drawn[indices[j]].token = tokens[j];
    result.fallback_rows += static_cast<int64_t>(indices.size());
  }
}

void StepLoop::collect_prompt_logits(const sched::ScheduledStep& step, const StepOutputs& outputs,
                                     StepResult& result) const {
  const int64_t vocab = engine_.config().vocab_size;
  for (const auto& chunk : step.chunks) {
    if (!chunk.prompt_rows || !requests_.count(chunk.id)) continue;
    const int64_t n = chunk.end - chunk.begin;
    Tensor rows(DType::F32, {n, vocab});
    const Tensor& all = outputs.rows.at(chunk.micro_batch).at(chunk.replica);
    std::memcpy(rows.f32(), all.f32() + chunk.first_prompt_row * vocab, rows.nbytes());
    result.prompt_logits.push_back({chunk.id, chunk.begin, std::move(rows)});
  }
}

}  // namespace moeserve::runtime
