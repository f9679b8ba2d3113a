#include "serve/engine_loop.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "serve/api_error.h"

namespace moeserve::serve {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct EngineLoop::Active {
  Active(std::shared_ptr<RequestStream> s, EngineRequest r, const tokenizer::Tokenizer& tokenizer)
      : stream(std::move(s)), request(std::move(r)), output(tokenizer, request.limits) {}
  std::shared_ptr<RequestStream> stream;
  EngineRequest request;
  OutputProcessor output;
  Clock::time_point arrival = Clock::now();
  Clock::time_point last_token;
  bool admitted = false;
  // The options of this request's next draw: draws are a pure function of (seed, step).
  ops::SamplingOptions next_draw() const {
    ops::SamplingOptions options = request.sampling;
    options.step = static_cast<uint64_t>(output.generated());
    return options;
  }
};

EngineLoop::EngineLoop(std::unique_ptr<runtime::Engine> engine, const tokenizer::Tokenizer& tokenizer,
                       EngineLoopOptions options)
    : EngineLoop(*engine, tokenizer, std::move(options)) {
  // The engine thread already runs, but it only reads engine_, which stays the same object.
  owned_engine_ = std::move(engine);
}

EngineLoop::EngineLoop(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, EngineLoopOptions options)
    : engine_(&engine),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      scheduler_(std::make_unique<sched::Scheduler>(options_.scheduler)),
      ttft_(latency_buckets_seconds()),
      inter_token_(latency_buckets_seconds()),
      e2e_(latency_buckets_seconds()),
      queue_time_(latency_buckets_seconds()),
      step_time_(latency_buckets_seconds()),
      decode_step_time_(latency_buckets_seconds()) {
  MS_CHECK(options_.max_queued_requests >= 0, "--max-queued-requests must be >= 0");
  if (options_.warmup)
    for (const runtime::StepPlan& plan : scheduler_->warmup_steps()) engine_->execute(plan);
  publish_snapshot();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

std::shared_ptr<RequestStream> EngineLoop::submit(EngineRequest request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw ApiError(503, "the engine failed: " + failure_);
  if (draining_.load() || stop_) throw ApiError(503, "the server is shutting down");
  const int64_t capacity = options_.scheduler.max_running_requests + options_.max_queued_requests;
  if (in_system_ >= capacity) {
    ++rejected_queue_full_;
    throw ApiError(429,
                   fmt::format("the server is at capacity ({} requests running or queued); retry later", capacity),
                   "", "queue_full");
  }
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id);
  prompt_tokens_ += static_cast<int64_t>(request.prompt.size());
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
    evicted = scheduler_->flush_prefix_cache();
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
  s.running = scheduler_->running();
  s.waiting = scheduler_->waiting();
  for (int d = 0; d < scheduler_->num_replicas(); ++d) {
    const kv::KvCache& kv = scheduler_->kv(d);
    s.kv_pages_total += kv.num_pages();
    s.kv_pages_used += kv.used_pages();
    s.kv_pages_cached += kv.cached_pages();
    s.kv_pages_free += kv.free_pages();
    s.prefix_query_tokens += kv.stats().query_tokens;
    s.prefix_hit_tokens += kv.stats().hit_tokens;
  }
  s.preemptions = scheduler_->preemptions();
  std::lock_guard<std::mutex> lock(mutex_);
  s.steps = snapshot_.steps;
  s.waiting += static_cast<int64_t>(incoming_.size());
  snapshot_ = s;
}

void EngineLoop::finish(uint64_t id, OutputEvent event) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  scheduler_->finish(id);
  if (event.error_status == 0) {
    event.prompt_tokens = static_cast<int64_t>(it->second->request.prompt.size());
    event.completion_tokens = it->second->output.generated();
    e2e_.observe(seconds_between(it->second->arrival, Clock::now()));
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

void EngineLoop::run() {
  for (;;) {
    std::vector<std::pair<uint64_t, std::unique_ptr<Active>>> incoming;
    std::vector<uint64_t> cancels;
    std::vector<std::function<void()>> controls;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stop_ || (!incoming_.empty() && !pending_replan_) || !cancels_.empty() || !controls_.empty() ||
               ((!scheduler_->idle() || !in_flight_.empty()) && failure_.empty()) ||
               (pending_replan_ && scheduler_->idle() && in_flight_.empty());
      });
      if (stop_) {
        incoming = std::move(incoming_);
        incoming_.clear();
      } else {
        if (!pending_replan_) incoming.swap(incoming_);  // while switching, new requests wait
        cancels.swap(cancels_);
        controls.swap(controls_);
      }
    }
    for (auto& [id, active] : incoming) {
      active_.emplace(id, std::move(active));
      try {
        scheduler_->add(id, active_.at(id)->request.prompt);
      } catch (const std::exception& e) {  // the HTTP side checks sizes first; never take the loop down
        OutputEvent event;
        event.error_status = 400;
        event.error = e.what();
        ++failed_;
        finish(id, std::move(event));
      }
    }
    if (stop_) break;
    for (auto& control : controls) control();
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
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failed = !failure_.empty();
    }
    if (failed) {
      fail_all(500, "the engine failed: " + failure());
      abandon_replan("the engine failed: " + failure());
      continue;
    }
    bool switch_now;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switch_now = pending_replan_ && scheduler_->idle() && in_flight_.empty();
    }
    if (switch_now) {
      switch_plan();
      publish_snapshot();
      continue;
    }
    try {
      if (!scheduler_->idle() || !in_flight_.empty()) step();
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
  for (const Flight& flight : in_flight_) {
    try {
      engine_->wait(flight.ticket);
    } catch (const std::exception&) {  // the engine failed: the requests fail below anyway
    }
  }
  in_flight_.clear();
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
  owned_engine_.reset();
  engine_ = nullptr;
  auto scheduler = std::make_unique<sched::Scheduler>(target.scheduler);
  const auto build_start = Clock::now();
  std::unique_ptr<runtime::Engine> engine = target.build_engine();
  MS_CHECK(engine != nullptr, "replan: building the engine for plan '{}' gave nothing", target.plan_name);
  const auto warmup_start = Clock::now();
  build_s = seconds_between(build_start, warmup_start);
  if (options_.warmup)
    for (const runtime::StepPlan& plan : scheduler->warmup_steps()) engine->execute(plan);
  warmup_s = seconds_between(warmup_start, Clock::now());
  owned_engine_ = std::move(engine);
  engine_ = owned_engine_.get();
  scheduler_ = std::move(scheduler);
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
    error = fmt::format("re-plan to '{}' failed ({}); back on plan '{}'", target->plan_name, e.what(),
                        previous.plan_name);
    ++replans_failed_;
    try {
      double build_s = 0, warmup_s = 0;
      install(previous, build_s, warmup_s);
    } catch (const std::exception& e2) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = fmt::format("re-plan to '{}' failed ({}) and rebuilding plan '{}' failed too ({})",
                             target->plan_name, e.what(), previous.plan_name, e2.what());
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

HeadMode EngineLoop::choose_head(sched::ScheduledStep& step) const {
  // The least that lets every row draw: greedy rows without logprobs need only each row's
  // argmax; sampled rows their top candidates and softmax normaliser (both reduced on the
  // devices); full fp32 logits come to the host only for logprobs or a top_k beyond the
  // candidates. A step of several micro-batches (the candidates' fallback can fetch the last
  // one's logits only) and a pipeline group's step (a later group's step may replace its
  // logits on the devices before a fallback could fetch them) draw every row on the devices
  // right after its micro-batch instead (kSampled), under options uploaded with the batch.
  HeadMode head = HeadMode::kGreedy;
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    const EngineRequest& r = active_.at(chunk.id)->request;
    const bool greedy_row = r.sampling.temperature <= 0.0f || r.sampling.top_k == 1;
    if (r.top_logprobs >= 0 || r.sampling.top_k > DeepseekV3::kSampleCandidates) {
      head = HeadMode::kLogits;
    } else if (!greedy_row && head == HeadMode::kGreedy) {
      head = HeadMode::kCandidates;
    }
  }
  static const bool host_draw = env_switch("MOESERVE_PIPELINE_HOST_DRAW", false);  // the old way, for comparison
  if (head == HeadMode::kCandidates && (step.plan.micro_batches.size() != 1 || pipelined()))
    head = host_draw ? HeadMode::kLogits : HeadMode::kSampled;
  if (head == HeadMode::kSampled) {  // each logit row's draw (greedy rows: temperature 0)
    for (auto& micro_batch : step.plan.micro_batches)
      for (auto& replica : micro_batch.replicas) replica.batch.sampling.assign(replica.batch.logit_rows.size(), {});
    for (const auto& chunk : step.chunks) {
      if (chunk.logit_row < 0) continue;
      step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch.sampling[chunk.logit_row] =
          active_.at(chunk.id)->next_draw();
    }
  }
  if (head == HeadMode::kCandidates) {  // each logit row's temperature (greedy rows: 0)
    for (auto& micro_batch : step.plan.micro_batches)
      for (auto& replica : micro_batch.replicas) replica.batch.temperatures.assign(replica.batch.logit_rows.size(), 0.0f);
    for (const auto& chunk : step.chunks) {
      if (chunk.logit_row < 0) continue;
      const ops::SamplingOptions& o = active_.at(chunk.id)->request.sampling;
      step.plan.micro_batches[chunk.micro_batch].replicas[chunk.replica].batch.temperatures[chunk.logit_row] =
          o.top_k == 1 ? 0.0f : std::max(o.temperature, 0.0f);
    }
  }
  return head;
}

bool EngineLoop::engine_failed(const std::exception& e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = e.what();
  }
  in_flight_.clear();  // the engine has stopped: nothing submitted will complete
  fail_all(500, std::string("the engine failed: ") + e.what());
  return false;
}

bool EngineLoop::draw(const sched::ScheduledStep& step, HeadMode head, runtime::StepOutputs& outputs,
                      std::vector<int32_t>& sampled, std::vector<TokenLogprob>& logprobs) {
  const std::vector<std::vector<Tensor>>& logits = outputs.rows;  // or argmax ids when greedy
  const std::vector<std::vector<SampleCandidates>>& candidates = outputs.candidates;
  const int64_t vocab = engine_->config().vocab_size;
  std::vector<const sched::ScheduledChunk*> rows;  // the chunks that sample, in step order
  for (const auto& chunk : step.chunks)
    if (chunk.logit_row >= 0) rows.push_back(&chunk);
  sampled.assign(rows.size(), 0);
  logprobs.assign(rows.size(), TokenLogprob{});
  // A pipeline group's step may outlive a request (cancelled while it ran): nothing to draw.
  std::vector<const Active*> owner(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    auto it = active_.find(rows[i]->id);
    owner[i] = it == active_.end() ? nullptr : it->second.get();
  }
  auto sample = [&](size_t i) {
    if (owner[i] == nullptr) return;
    const sched::ScheduledChunk& chunk = *rows[i];
    if (head == HeadMode::kGreedy || head == HeadMode::kSampled) {  // ids drawn on the devices
      sampled[i] = logits.at(chunk.micro_batch).at(chunk.replica).i32()[chunk.logit_row];
      return;
    }
    if (head == HeadMode::kCandidates) {  // -1: drawn from the row's logits below
      const SampleCandidates& c = candidates.at(chunk.micro_batch).at(chunk.replica);
      const int64_t r = chunk.logit_row;
      sampled[i] = cpu::sample_candidates({c.values.data() + r * c.count, c.ids.data() + r * c.count, c.count,
                                           c.normaliser[r]},
                                          vocab, owner[i]->next_draw());
      return;
    }
    const int top_logprobs = owner[i]->request.top_logprobs;
    const float* row = logits.at(chunk.micro_batch).at(chunk.replica).f32() + chunk.logit_row * vocab;
    sampled[i] = cpu::sample_row(row, vocab, owner[i]->next_draw());
    if (top_logprobs >= 0) logprobs[i] = token_logprob(row, vocab, sampled[i], top_logprobs);
  };
  if (head != HeadMode::kLogits) {
    for (size_t i = 0; i < rows.size(); ++i) sample(i);
  } else {
    // Rows are independent and each sorts a vocabulary of logits: over the host's cores (the
    // ranks' threads are idle between steps). Results do not depend on the split.
    ThreadPool::global().parallel_for(rows.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) sample(i);
    });
  }
  // Draws that reached past their row's candidates (a top-p over a flat row): drawn on the
  // devices over the rows' whole logits, still there until the next step (one call per
  // replica; only the tokens come back). Steps in flight never take the candidates head: a
  // later step would have overwritten these logits.
  std::map<int, std::vector<size_t>> fallback;  // replica -> indices into rows
  for (size_t i = 0; i < rows.size(); ++i)
    if (sampled[i] < 0) fallback[rows[i]->replica].push_back(i);
  for (const auto& [replica, indices] : fallback) {
    std::vector<int64_t> logit_rows;
    std::vector<ops::SamplingOptions> options;
    for (size_t i : indices) {
      logit_rows.push_back(rows[i]->logit_row);
      options.push_back(owner[i]->next_draw());
    }
    std::vector<int32_t> tokens;
    try {
      tokens = engine_->sample_logits_rows(replica, logit_rows, options);
    } catch (const std::exception& e) {
      return engine_failed(e);
    }
    for (size_t j = 0; j < indices.size(); ++j) sampled[indices[j]] = tokens[j];
    sampling_fallbacks_ += static_cast<int64_t>(indices.size());
  }
  if (head == HeadMode::kCandidates) sampled_rows_ += static_cast<int64_t>(rows.size());
  if (head == HeadMode::kSampled) device_drawn_rows_ += static_cast<int64_t>(rows.size());
  // Rows that asked for logprobs always run with the logits head, where sample() filled them.
  for (size_t i = 0; i < rows.size(); ++i)
    if (owner[i] != nullptr && owner[i]->request.top_logprobs < 0) logprobs[i] = TokenLogprob{sampled[i], 0, {}};
  return true;
}

void EngineLoop::note_admissions(const sched::ScheduledStep& step, Clock::time_point start) {
  for (const auto& chunk : step.chunks) {
    Active& a = *active_.at(chunk.id);
    if (!a.admitted) {
      a.admitted = true;
      queue_time_.observe(seconds_between(a.arrival, start));
    }
  }
}

void EngineLoop::step() {
  if (pipelined()) {
    step_in_flight();
  } else {
    step_in_order();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++snapshot_.steps;
}

void EngineLoop::step_in_order() {
  const auto start = Clock::now();
  sched::ScheduledStep step = scheduler_->schedule();
  if (step.empty()) {
    // Nothing can run (the waiting head does not fit yet and nothing runs to free pages):
    // cannot happen for requests that passed the size checks; fail them rather than spin.
    fail_all(500, "the scheduler could not place any request");
    return;
  }
  note_admissions(step, start);
  const HeadMode head = choose_head(step);
  const auto forward_start = Clock::now();
  runtime::StepOutputs outputs;
  try {
    if (head == HeadMode::kGreedy) outputs.rows = engine_->execute_greedy(step.plan);
    if (head == HeadMode::kCandidates) outputs.candidates = engine_->execute_candidates(step.plan);
    if (head == HeadMode::kSampled) outputs.rows = engine_->execute_sampled(step.plan);
    if (head == HeadMode::kLogits) outputs.rows = engine_->execute(step.plan);
  } catch (const std::exception& e) {
    engine_failed(e);
    return;
  }
  const auto forward_end = Clock::now();
  std::vector<int32_t> sampled;
  std::vector<TokenLogprob> logprobs;
  if (!draw(step, head, outputs, sampled, logprobs)) return;
  complete(step, sampled, logprobs, start,
           seconds_between(start, forward_start) + seconds_between(forward_end, Clock::now()));
}

void EngineLoop::step_in_flight() {
  // Every group without a step in flight gets its next one (groups with nothing to run skip).
  const int groups = scheduler_->options().pipeline_groups;
  const auto top_up_start = Clock::now();
  for (int g = 0; g < groups; ++g) {
    if (std::any_of(in_flight_.begin(), in_flight_.end(), [&](const Flight& f) { return f.step.group == g; }))
      continue;
    const auto start = Clock::now();
    sched::ScheduledStep step = scheduler_->schedule(g);
    if (step.empty()) continue;
    note_admissions(step, start);
    const HeadMode head = choose_head(step);
    runtime::StepTicket ticket;
    try {
      ticket = engine_->submit(step.plan, head);
    } catch (const std::exception& e) {
      engine_failed(e);
      return;
    }
    in_flight_.push_back({std::move(step), head, ticket, start});
  }
  if (in_flight_.empty()) {
    fail_all(500, "the scheduler could not place any request");  // as in step_in_order
    return;
  }
  Flight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto wait_start = Clock::now();
  runtime::StepOutputs outputs;
  try {
    outputs = engine_->wait(oldest.ticket);
  } catch (const std::exception& e) {
    engine_failed(e);
    return;
  }
  const auto wait_end = Clock::now();
  std::vector<int32_t> sampled;
  std::vector<TokenLogprob> logprobs;
  if (!draw(oldest.step, oldest.head, outputs, sampled, logprobs)) return;
  // Host time of this call: the top-up (schedule, submit) and the draw; not the time the step
  // spent in flight behind the other groups'.
  complete(oldest.step, sampled, logprobs, oldest.start,
           seconds_between(top_up_start, wait_start) + seconds_between(wait_end, Clock::now()));
}

void EngineLoop::complete(const sched::ScheduledStep& step, const std::vector<int32_t>& sampled,
                          std::vector<TokenLogprob>& logprobs, Clock::time_point start, double host_seconds) {
  const auto commit_start = Clock::now();
  scheduler_->commit(step, sampled);
  const auto now = Clock::now();
  size_t next = 0;
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    const int32_t token = sampled[next];
    TokenLogprob logprob = std::move(logprobs[next]);
    ++next;
    auto it = active_.find(chunk.id);
    if (it == active_.end()) continue;  // ended while its step was in flight
    Active& a = *it->second;
    const bool first = a.output.generated() == 0;
    (first ? ttft_ : inter_token_).observe(seconds_between(first ? a.arrival : a.last_token, now));
    a.last_token = now;
    ++generation_tokens_;
    const OutputProcessor::Update update = a.output.push(token);
    OutputEvent event;
    event.text = update.text;
    event.token_ids.push_back(token);
    event.text_offsets.push_back(update.text_offset);
    if (a.request.top_logprobs >= 0) event.logprobs.push_back(std::move(logprob));
    if (update.finish_reason.empty()) {
      a.stream->push(std::move(event));
      continue;
    }
    event.finish_reason = update.finish_reason;
    event.cached_tokens = scheduler_->cached_prompt_tokens(chunk.id);
    finish(chunk.id, std::move(event));
  }
  const auto end = Clock::now();
  step_time_.observe(seconds_between(start, end));
  if (step.prefill_tokens == 0) decode_step_time_.observe(seconds_between(start, end));
  scheduler_cpu_seconds_.fetch_add(host_seconds + seconds_between(commit_start, end));
}

std::string EngineLoop::render_metrics() const {
  const EngineSnapshot s = snapshot();
  std::string out;
  render_metric("moeserve_requests_running", "gauge", "Requests being computed (admitted, holding KV pages).",
                static_cast<double>(s.running), out);
  render_metric("moeserve_requests_waiting", "gauge", "Requests queued for admission.", static_cast<double>(s.waiting),
                out);
  render_metric("moeserve_kv_pages_total", "gauge", "KV cache pages over all DP replicas.",
                static_cast<double>(s.kv_pages_total), out);
  render_metric("moeserve_kv_pages_used", "gauge", "KV pages held by requests.", static_cast<double>(s.kv_pages_used),
                out);
  render_metric("moeserve_kv_pages_cached", "gauge", "KV pages held only by the prefix cache (evictable).",
                static_cast<double>(s.kv_pages_cached), out);
  render_metric("moeserve_kv_pages_free", "gauge", "Free KV pages.", static_cast<double>(s.kv_pages_free), out);
  render_metric("moeserve_kv_usage_ratio", "gauge", "Fraction of KV pages held by requests.",
                s.kv_pages_total ? static_cast<double>(s.kv_pages_used) / static_cast<double>(s.kv_pages_total) : 0,
                out);
  render_metric("moeserve_prefix_cache_queried_tokens_total", "counter",
                "Prompt tokens looked up in the prefix cache at admission.", static_cast<double>(s.prefix_query_tokens),
                out);
  render_metric("moeserve_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.",
                static_cast<double>(s.prefix_hit_tokens), out);
  render_metric("moeserve_prefix_cache_hit_rate", "gauge", "Prefix cache hit tokens / queried tokens.",
                s.prefix_query_tokens ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prefix_query_tokens)
                                      : 0,
                out);
  render_metric("moeserve_preemptions_total", "counter", "Requests preempted (recomputed later) for lack of KV pages.",
                static_cast<double>(s.preemptions), out);
  render_metric("moeserve_engine_steps_total", "counter", "Engine steps run.", static_cast<double>(s.steps), out);
  render_metric("moeserve_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
                static_cast<double>(prompt_tokens_.load()), out);
  render_metric("moeserve_generation_tokens_total", "counter", "Generated tokens.",
                static_cast<double>(generation_tokens_.load()), out);
  render_labeled("moeserve_requests_finished_total", "counter", "Requests finished, by reason.",
                 {{"stop", static_cast<double>(finished_stop_.load())},
                  {"length", static_cast<double>(finished_length_.load())},
                  {"cancelled", static_cast<double>(cancelled_.load())},
                  {"error", static_cast<double>(failed_.load())}},
                 "reason", out);
  render_metric("moeserve_requests_rejected_queue_full_total", "counter", "Requests refused with 429.",
                static_cast<double>(rejected_queue_full_.load()), out);
  render_metric("moeserve_sampled_rows_total", "counter",
                "Sampled (non-greedy) rows drawn from device-reduced candidates.",
                static_cast<double>(sampled_rows_.load()), out);
  render_metric("moeserve_device_drawn_rows_total", "counter",
                "Rows of steps in flight or of several micro-batches, each drawn whole on the device after its "
                "micro-batch.",
                static_cast<double>(device_drawn_rows_.load()), out);
  render_metric("moeserve_sampling_fallbacks_total", "counter",
                "Sampled rows whose draw reached past their candidates and was drawn over the full logits on the device.",
                static_cast<double>(sampling_fallbacks_.load()), out);
  render_metric("moeserve_scheduler_cpu_seconds_total", "counter",
                "Leader host time per step outside the forward (schedule, sample, commit, detokenize).",
                scheduler_cpu_seconds_.load(), out);
  render_labeled("moeserve_plan_info", "gauge", "The parallel plan being served (label plan).",
                 {{plan_name(), 1.0}}, "plan", out);
  render_metric("moeserve_replans_total", "counter", "Successful live re-plans (POST /admin/replan).",
                static_cast<double>(replans_.load()), out);
  render_metric("moeserve_replans_failed_total", "counter", "Re-plans that failed and fell back to the old plan.",
                static_cast<double>(replans_failed_.load()), out);
  render_metric("moeserve_last_replan_ready_seconds", "gauge",
                "Time from the last successful re-plan's request to serving again.", last_replan_ready_s_.load(), out);
  ttft_.render("moeserve_time_to_first_token_seconds", "Arrival to first generated token.", out);
  inter_token_.render("moeserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.", out);
  e2e_.render("moeserve_e2e_request_latency_seconds", "Arrival to the last token.", out);
  queue_time_.render("moeserve_queue_time_seconds", "Arrival to first scheduled.", out);
  step_time_.render("moeserve_step_duration_seconds", "Wall time of one engine step (schedule, forward, sample).", out);
  decode_step_time_.render("moeserve_decode_step_duration_seconds",
                           "Wall time of steps that only decode (no prefill chunk): the shape bench-step times.", out);
  return out;
}

}  // namespace moeserve::serve
