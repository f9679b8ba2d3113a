#include "serve/engine_loop.h"

#include <fmt/format.h>

#include <thread>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/engine_loop_active.h"

namespace moeserve::serve {

EngineLoop::EngineLoop(std::unique_ptr<runtime::Engine> engine, const tokenizer::Tokenizer& tokenizer,
                       EngineLoopOptions options)
    : EngineLoop(*engine, tokenizer, std::move(options)) {
  // The engine thread already runs, but only the step loop uses the engine, through a
  // reference to this same object.
  owned_engine_ = std::move(engine);
}

EngineLoop::EngineLoop(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, EngineLoopOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      ttft_(latency_buckets_seconds()),
      inter_token_(latency_buckets_seconds()),
      e2e_(latency_buckets_seconds()),
      queue_time_(latency_buckets_seconds()),
      step_time_(latency_buckets_seconds()),
      decode_step_time_(latency_buckets_seconds()) {
  MS_CHECK(options_.max_queued_requests >= 0, "--max-queued-requests must be >= 0");
  loop_ = make_loop(engine, options_.scheduler);
  publish_snapshot();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

std::unique_ptr<runtime::StepLoop> EngineLoop::make_loop(runtime::Engine& engine,
                                                         const sched::SchedulerOptions& options, bool warm) {
  auto loop = std::make_unique<runtime::StepLoop>(
      engine,
      runtime::StepLoopOptions{.scheduler = options,
                               .speculative = options_.speculative,
                               .on_scheduled = [this](const sched::ScheduledStep& step, Clock::time_point start) {
                                 note_admissions(step, start);
                               }});
  if (options_.warmup && warm) loop->warm_up();
  return loop;
}

std::shared_ptr<RequestStream> EngineLoop::submit(EngineRequest request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw ApiError(503, "the engine failed: " + failure_);
  if (draining_.load() || stop_) throw ApiError(503, "the server is shutting down");
  const int64_t capacity = options_.scheduler.max_running_requests + options_.max_queued_requests;
  if (in_system_ >= capacity) {
    ++rejected_queue_full_;
    throw ApiError(429, fmt::format("the server is at capacity ({} requests running or queued); retry later", capacity),
                   "", "queue_full");
  }
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id);
  prompt_tokens_ += static_cast<int64_t>(request.prompt.size());
  sglang_.count_prompt_tokens(static_cast<int64_t>(request.prompt.size()));
  incoming_.emplace_back(id, std::make_unique<Active>(stream, std::move(request), tokenizer_));
  ++in_system_;
  wake_.notify_one();
  return stream;
}

void EngineLoop::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  cancels_.push_back(id);
  wake_.notify_one();
}

void EngineLoop::on_engine_thread(const std::function<void()>& fn) {
  std::mutex done_mutex;
  std::condition_variable done_cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    MS_CHECK(!stop_, "the engine loop has stopped");
    controls_.push_back([&] {
      fn();
      std::lock_guard<std::mutex> done_lock(done_mutex);
      done = true;
      done_cv.notify_one();
    });
    wake_.notify_one();
  }
  std::unique_lock<std::mutex> done_lock(done_mutex);
  done_cv.wait(done_lock, [&] { return done; });
}

int64_t EngineLoop::flush_prefix_cache() {
  int64_t evicted = 0;
  on_engine_thread([&] {
    if (loop_) evicted = loop_->scheduler().flush_prefix_cache();
    publish_snapshot();
  });
  return evicted;
}

bool EngineLoop::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  std::unique_lock<std::mutex> lock(mutex_);
  return all_done_.wait_for(lock, timeout, [&] { return in_system_ == 0 || stop_; });
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

std::string EngineLoop::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

EngineSnapshot EngineLoop::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_;
}

EngineSnapshot EngineLoop::current_snapshot() {
  on_engine_thread([&] { publish_snapshot(); });
  return snapshot();
}

void EngineLoop::publish_snapshot() {
  EngineSnapshot s;
  const sched::Scheduler* scheduler = loop_ ? &loop_->scheduler() : nullptr;
  s.running = scheduler ? scheduler->running() : 0;
  s.waiting = scheduler ? scheduler->waiting() : 0;
  for (int d = 0; scheduler && d < scheduler->num_replicas(); ++d) {
    const kv::KvCache& kv = scheduler->kv(d);
    s.kv_pages_total += kv.num_pages();
    s.kv_pages_used += kv.used_pages();
    s.kv_pages_cached += kv.cached_pages();
    s.kv_pages_free += kv.free_pages();
    s.prefix_query_tokens += kv.stats().query_tokens;
    s.prefix_hit_tokens += kv.stats().hit_tokens;
  }
  s.preemptions = scheduler ? scheduler->preemptions() : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  s.steps = snapshot_.steps;
  s.waiting += static_cast<int64_t>(incoming_.size());
  snapshot_ = s;
}

void EngineLoop::finish(uint64_t id, OutputEvent event) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  if (loop_) loop_->finish(id);
  // The request's pages are released (or cached) now: publish before its stream ends, so that a
  // client reading /metrics right after its last event sees them so.
  publish_snapshot();
  if (event.error_status == 0) {
    event.prompt_tokens = static_cast<int64_t>(it->second->request.prompt.size());
    event.completion_tokens = it->second->output.generated();
    const Active& a = *it->second;
    e2e_.observe(seconds_between(a.arrival, Clock::now()));
    sglang_.observe_finished({.prompt_tokens = event.prompt_tokens,
                              .output_tokens = event.completion_tokens,
                              .cached_tokens = event.cached_tokens,
                              .e2e_s = seconds_between(a.arrival, Clock::now()),
                              .ttft_s = seconds_between(a.arrival, a.first_token)});
    (event.finish_reason == "length" ? finished_length_ : finished_stop_)++;
  }
  it->second->stream->push(std::move(event));
  active_.erase(it);
  std::lock_guard<std::mutex> lock(mutex_);
  --in_system_;
  if (in_system_ == 0) all_done_.notify_all();
}

void EngineLoop::fail_all(int status, const std::string& message) {
  std::vector<uint64_t> ids;
  for (const auto& [id, active] : active_) ids.push_back(id);
  for (uint64_t id : ids) {
    OutputEvent event;
    event.error_status = status;
    event.error = message;
    ++failed_;
    finish(id, std::move(event));
  }
}

bool EngineLoop::wait_for_work(std::vector<std::pair<uint64_t, std::unique_ptr<Active>>>& incoming,
                               std::vector<uint64_t>& cancels, std::vector<std::function<void()>>& controls) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] {
    return stop_ || (!incoming_.empty() && !pending_replan_) || !cancels_.empty() || !controls_.empty() ||
           (busy() && failure_.empty()) || pending_replan_;
  });
  if (stop_) {
    incoming = std::move(incoming_);
    incoming_.clear();
    return false;
  }
  if (!pending_replan_) incoming.swap(incoming_);  // while switching, new requests wait
  cancels.swap(cancels_);
  controls.swap(controls_);
  return true;
}

void EngineLoop::admit(std::vector<std::pair<uint64_t, std::unique_ptr<Active>>>& incoming) {
  for (auto& [id, active] : incoming) {
    const EngineRequest& request = active->request;
    active_.emplace(id, std::move(active));
    try {
      MS_CHECK(loop_ != nullptr, "no engine to run request {}", id);
      loop_->add(id, {.prompt = request.prompt,
                      .sampling = request.sampling,
                      .top_logprobs = request.top_logprobs,
                      .prompt_logits = request.prompt_alternatives >= 0,
                      .max_new_tokens = request.limits.max_tokens,
                      .constraint = request.constraint,
                      .logit_adjust = request.logit_adjust});
    } catch (const std::exception& e) {  // the HTTP side checks sizes first; never take the loop down
      OutputEvent event;
      event.error_status = 400;
      event.error = e.what();
      ++failed_;
      finish(id, std::move(event));
    }
  }
}

void EngineLoop::cancel_now(const std::vector<uint64_t>& cancels) {
  for (uint64_t id : cancels) {
    if (!active_.count(id)) {  // still waiting out a re-plan in the incoming queue?
      std::unique_ptr<Active> waiting;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = incoming_.begin(); it != incoming_.end(); ++it)
          if (it->first == id) {
            waiting = std::move(it->second);
            incoming_.erase(it);
            break;
          }
      }
      if (!waiting) continue;
      active_.emplace(id, std::move(waiting));
    }
    ++cancelled_;
    OutputEvent event;
    event.error_status = 499;  // nobody reads it: the client is gone
    event.error = "cancelled";
    finish(id, std::move(event));
  }
}

void EngineLoop::run() {
  for (;;) {
    std::vector<std::pair<uint64_t, std::unique_ptr<Active>>> incoming;
    std::vector<uint64_t> cancels;
    std::vector<std::function<void()>> controls;
    const bool running = wait_for_work(incoming, cancels, controls);
    admit(incoming);
    if (!running) break;
    for (auto& control : controls) control();
    cancel_now(cancels);
    if (const std::string failed = failure(); !failed.empty()) {
      fail_all(500, "the engine failed: " + failed);
      abandon_replan("the engine failed: " + failed);
      continue;
    }
    bool switch_now;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switch_now = pending_replan_ != nullptr;  // between steps: no request waits for another
    }
    if (switch_now) {
      switch_plan();
      publish_snapshot();
      continue;
    }
    try {
      if (busy()) step();
    } catch (const std::exception& e) {  // a bookkeeping bug: stop serving rather than serve wrong tokens
      {
        std::lock_guard<std::mutex> lock(mutex_);
        failure_ = e.what();
      }
      fail_all(500, std::string("the engine loop failed: ") + e.what());
    }
    publish_snapshot();
  }
  // Steps still in flight complete on the ranks (the engine may outlive this loop).
  if (loop_) loop_->finish_in_flight();
  fail_all(503, "the server is shutting down");
  publish_snapshot();
  abandon_replan("the server is shutting down");
}

std::string EngineLoop::plan_name() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_.plan_name;
}

void EngineLoop::engine_failed(const std::exception& e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = e.what();
  }
  fail_all(500, std::string("the engine failed: ") + e.what());
}

void EngineLoop::note_admissions(const sched::ScheduledStep& step, Clock::time_point start) {
  for (const auto& chunk : step.chunks) {
    Active& a = *active_.at(chunk.id);
    if (!a.admitted) {
      a.admitted = true;
      queue_time_.observe(seconds_between(a.arrival, start));
      sglang_.observe_queue_time(seconds_between(a.arrival, start));
    }
  }
}

void EngineLoop::step() {
  const Clock::time_point began = Clock::now();
  try {
    runtime::StepResult result = loop_->step();
    if (result.stalled) {
      // Nothing can run (the waiting head does not fit yet and nothing runs to free pages):
      // cannot happen for requests that passed the size checks; fail them rather than spin.
      fail_all(500, "the scheduler could not place any request");
    } else {
      complete(result);
    }
  } catch (const runtime::EngineFailure& e) {
    engine_failed(e);
  }
  if (options_.min_step.count() > 0) std::this_thread::sleep_until(began + options_.min_step);
  std::lock_guard<std::mutex> lock(mutex_);
  ++snapshot_.steps;
}

void EngineLoop::push_prompt_logprobs(const runtime::StepResult& result) {
  for (const runtime::PromptLogitRows& rows : result.prompt_logits) {
    auto it = active_.find(rows.id);
    if (it == active_.end()) continue;
    const EngineRequest& r = it->second->request;
    OutputEvent event;
    event.prompt_logprobs = runtime::prompt_token_logprobs(rows.rows.f32(), rows.rows.dim(0), rows.rows.dim(1),
                                                           rows.begin, r.prompt, r.prompt_alternatives);
    it->second->stream->push(std::move(event));
  }
}

void EngineLoop::complete(runtime::StepResult& result) {
  const auto stream_start = Clock::now();
  push_prompt_logprobs(result);
  spec_draft_budget_ = result.draft_budget;
  for (const runtime::VerifiedDrafts& v : result.verified) {
    ++spec_verify_steps_;
    spec_draft_tokens_ += v.drafted;
    spec_accepted_tokens_ += v.accepted;
    if (auto it = active_.find(v.id); it != active_.end()) {
      ++it->second->spec_verify_ct;
      it->second->spec_accepted_tokens += v.accepted;
    }
  }
  // Structured output: a request's matcher has taken all its tokens of the step; the grammar
  // completed with its last one.
  std::unordered_map<uint64_t, const runtime::DrawnToken*> last_of;
  for (const runtime::DrawnToken& drawn : result.tokens) last_of[drawn.id] = &drawn;
  // A request's tokens of the step (a speculative step's accepted drafts and next token) go
  // out as one event, one SSE chunk, as SGLang streams them: one wake-up of its handler per
  // step, not per token.
  std::vector<std::pair<uint64_t, OutputEvent>> events;
  std::unordered_map<uint64_t, size_t> event_of;
  for (runtime::DrawnToken& drawn : result.tokens) {
    auto it = active_.find(drawn.id);
    if (it == active_.end()) continue;  // ended while its step was in flight
    Active& a = *it->second;
    if (a.request.limits.max_tokens == 0) {  // prompt scoring: the drawn token is not output
      OutputEvent scored;
      scored.finish_reason = "length";
      finish(drawn.id, std::move(scored));
      continue;
    }
    const auto& script = a.request.scripted_output;
    if (a.output.generated() < static_cast<int64_t>(script.size())) drawn.token = script[a.output.generated()];
    const bool first = a.output.generated() == 0;
    const double since = seconds_between(first ? a.arrival : a.last_token, stream_start);
    (first ? ttft_ : inter_token_).observe(since);
    first ? sglang_.observe_first_token(since) : sglang_.observe_inter_token(since);
    if (first) a.first_token = stream_start;
    a.last_token = stream_start;
    ++generation_tokens_;
    const bool grammar_done = a.request.constraint && a.request.constraint->terminated() && last_of[drawn.id] == &drawn;
    a.generated.push_back(drawn.token);
    const OutputProcessor::Update update = a.output.push(drawn.token, grammar_done);
    auto [slot, added] = event_of.try_emplace(drawn.id, events.size());
    if (added) events.emplace_back(drawn.id, OutputEvent{});
    OutputEvent& event = events[slot->second].second;
    event.text += update.text;
    event.token_ids.push_back(drawn.token);
    event.text_offsets.push_back(update.text_offset);
    if (a.request.top_logprobs >= 0) event.logprobs.push_back(std::move(drawn.logprob));
    if (update.finish_reason.empty()) continue;
    event.finish_reason = update.finish_reason;
    event.stop_string = update.stop_string;
    event.stop_token = update.stop_token;
    event.cached_tokens = loop_->scheduler().cached_prompt_tokens(drawn.id);
    event.spec_verify_ct = a.spec_verify_ct;
    event.spec_accepted_tokens = a.spec_accepted_tokens;
    finish(drawn.id, std::move(event));
    event_of.erase(drawn.id);  // nothing more of it: finish() ended it
  }
  for (const auto& [id, slot] : event_of) active_.at(id)->stream->push(std::move(events[slot].second));
  sglang_.observe_generated(static_cast<int64_t>(result.tokens.size()), stream_start);
  const auto end = Clock::now();
  step_time_.observe(seconds_between(result.scheduled, end));
  if (result.prefill_tokens == 0) decode_step_time_.observe(seconds_between(result.scheduled, end));
  scheduler_cpu_seconds_.fetch_add(result.host_seconds + seconds_between(stream_start, end));
  sampled_rows_ += result.candidate_rows;
  sampling_fallbacks_ += result.fallback_rows;
  device_drawn_rows_ += result.device_drawn_rows;
}

}  // namespace moeserve::serve
