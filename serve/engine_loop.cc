#include "serve/engine_loop.h"

#include <fmt/format.h>

#include "core/error.h"
#include "serve/api_error.h"

namespace moeserve::serve {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

struct EngineLoop::Active {
  Active(std::shared_ptr<RequestStream> s, EngineRequest r, const tokenizer::Tokenizer& tokenizer)
      : stream(std::move(s)), request(std::move(r)), output(tokenizer, request.limits) {}
  std::shared_ptr<RequestStream> stream;
  EngineRequest request;
  OutputProcessor output;
  Clock::time_point arrival = Clock::now();
  Clock::time_point first_token, last_token;
  bool admitted = false;
  int64_t spec_verify_ct = 0, spec_accepted_tokens = 0;
};

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
                                                         const sched::SchedulerOptions& options) {
  auto loop = std::make_unique<runtime::StepLoop>(
      engine,
      runtime::StepLoopOptions{.scheduler = options,
                               .speculative = options_.speculative,
                               .on_scheduled = [this](const sched::ScheduledStep& step, Clock::time_point start) {
                                 note_admissions(step, start);
                               }});
  if (options_.warmup) loop->warm_up();
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
           (busy() && failure_.empty()) || (pending_replan_ && idle());
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
                      .max_new_tokens = request.limits.max_tokens});
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
      switch_now = pending_replan_ && idle();
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

void EngineLoop::abandon_replan(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pending_replan_) return;
  pending_replan_.reset();
  replan_error_ = reason;
  replan_error_status_ = 503;
  replan_finished_ = true;
  replan_done_.notify_all();
}

ReplanReport EngineLoop::replan(ReplanTarget target) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!options_.rebuild_engine) throw ApiError(400, "this server cannot re-plan (no engine factory)", "plan");
  if (!failure_.empty()) throw ApiError(503, "the engine failed: " + failure_);
  if (draining_.load() || stop_) throw ApiError(503, "the server is shutting down");
  if (pending_replan_) throw ApiError(409, "a re-plan is already in progress", "plan");
  MS_CHECK(target.build_engine, "replan: the target plan '{}' has no engine factory", target.plan_name);
  pending_replan_ = std::make_unique<ReplanTarget>(std::move(target));
  replan_requested_ = Clock::now();
  replan_finished_ = false;
  replan_error_.clear();
  wake_.notify_one();
  replan_done_.wait(lock, [&] { return replan_finished_; });
  if (!replan_error_.empty()) throw ApiError(replan_error_status_, replan_error_, "plan");
  return replan_report_;
}

std::string EngineLoop::plan_name() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_.plan_name;
}

void EngineLoop::install(const ReplanTarget& target, double& build_s, double& warmup_s) {
  // Free the old engine first: on GPUs both would not fit.
  loop_.reset();
  owned_engine_.reset();
  const auto build_start = Clock::now();
  std::unique_ptr<runtime::Engine> engine = target.build_engine();
  MS_CHECK(engine != nullptr, "replan: building the engine for plan '{}' gave nothing", target.plan_name);
  const auto warmup_start = Clock::now();
  build_s = seconds_between(build_start, warmup_start);
  std::unique_ptr<runtime::StepLoop> loop = make_loop(*engine, target.scheduler);
  warmup_s = seconds_between(warmup_start, Clock::now());
  owned_engine_ = std::move(engine);
  loop_ = std::move(loop);
  std::lock_guard<std::mutex> lock(mutex_);
  options_.scheduler = target.scheduler;
  options_.plan_name = target.plan_name;
}

void EngineLoop::switch_plan() {
  // pending_replan_ stays set until the end: it is what keeps new requests in incoming_.
  std::unique_ptr<ReplanTarget> target;
  ReplanTarget previous;
  ReplanReport report;
  Clock::time_point requested;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    target = std::make_unique<ReplanTarget>(*pending_replan_);
    requested = replan_requested_;
    previous = {options_.plan_name, options_.scheduler, options_.rebuild_engine};
  }
  report.plan = target->plan_name;
  report.previous_plan = previous.plan_name;
  report.drain_s = seconds_between(requested, Clock::now());
  std::string error;
  try {
    install(*target, report.build_s, report.warmup_s);
    std::lock_guard<std::mutex> lock(mutex_);
    options_.rebuild_engine = target->build_engine;
  } catch (const std::exception& e) {
    error =
        fmt::format("re-plan to '{}' failed ({}); back on plan '{}'", target->plan_name, e.what(), previous.plan_name);
    ++replans_failed_;
    try {
      double build_s = 0, warmup_s = 0;
      install(previous, build_s, warmup_s);
    } catch (const std::exception& e2) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = fmt::format("re-plan to '{}' failed ({}) and rebuilding plan '{}' failed too ({})", target->plan_name,
                             e.what(), previous.plan_name, e2.what());
      error = failure_;
    }
  }
  report.ready_s = seconds_between(requested, Clock::now());
  if (error.empty()) {
    ++replans_;
    last_replan_ready_s_ = report.ready_s;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  report.requests_waited = static_cast<int64_t>(incoming_.size());
  pending_replan_.reset();
  replan_report_ = report;
  replan_error_ = error;
  replan_error_status_ = 500;
  replan_finished_ = true;
  replan_done_.notify_all();
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
  std::lock_guard<std::mutex> lock(mutex_);
  ++snapshot_.steps;
}

void EngineLoop::complete(runtime::StepResult& result) {
  const auto stream_start = Clock::now();
  for (const runtime::VerifiedDrafts& v : result.verified) {
    ++spec_verify_steps_;
    spec_draft_tokens_ += v.drafted;
    spec_accepted_tokens_ += v.accepted;
    if (auto it = active_.find(v.id); it != active_.end()) {
      ++it->second->spec_verify_ct;
      it->second->spec_accepted_tokens += v.accepted;
    }
  }
  for (runtime::DrawnToken& drawn : result.tokens) {
    auto it = active_.find(drawn.id);
    if (it == active_.end()) continue;  // ended while its step was in flight
    Active& a = *it->second;
    const bool first = a.output.generated() == 0;
    const double since = seconds_between(first ? a.arrival : a.last_token, stream_start);
    (first ? ttft_ : inter_token_).observe(since);
    first ? sglang_.observe_first_token(since) : sglang_.observe_inter_token(since);
    if (first) a.first_token = stream_start;
    a.last_token = stream_start;
    ++generation_tokens_;
    const OutputProcessor::Update update = a.output.push(drawn.token);
    OutputEvent event;
    event.text = update.text;
    event.token_ids.push_back(drawn.token);
    event.text_offsets.push_back(update.text_offset);
    if (a.request.top_logprobs >= 0) event.logprobs.push_back(std::move(drawn.logprob));
    if (update.finish_reason.empty()) {
      a.stream->push(std::move(event));
      continue;
    }
    event.finish_reason = update.finish_reason;
    event.cached_tokens = loop_->scheduler().cached_prompt_tokens(drawn.id);
    event.spec_verify_ct = a.spec_verify_ct;
    event.spec_accepted_tokens = a.spec_accepted_tokens;
    finish(drawn.id, std::move(event));
  }
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
