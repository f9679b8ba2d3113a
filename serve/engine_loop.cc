#include "serve/engine_loop.h"

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
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
};

EngineLoop::EngineLoop(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, EngineLoopOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      scheduler_(options_.scheduler),
      ttft_(latency_buckets_seconds()),
      inter_token_(latency_buckets_seconds()),
      e2e_(latency_buckets_seconds()),
      queue_time_(latency_buckets_seconds()),
      step_time_(latency_buckets_seconds()) {
  MS_CHECK(options_.max_queued_requests >= 0, "--max-queued-requests must be >= 0");
  if (options_.warmup)
    for (const runtime::StepPlan& plan : scheduler_.warmup_steps()) engine_.execute(plan);
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
    evicted = scheduler_.flush_prefix_cache();
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
  s.running = scheduler_.running();
  s.waiting = scheduler_.waiting();
  for (int d = 0; d < scheduler_.num_replicas(); ++d) {
    const kv::KvCache& kv = scheduler_.kv(d);
    s.kv_pages_total += kv.num_pages();
    s.kv_pages_used += kv.used_pages();
    s.kv_pages_cached += kv.cached_pages();
    s.kv_pages_free += kv.free_pages();
    s.prefix_query_tokens += kv.stats().query_tokens;
    s.prefix_hit_tokens += kv.stats().hit_tokens;
  }
  s.preemptions = scheduler_.preemptions();
  std::lock_guard<std::mutex> lock(mutex_);
  s.steps = snapshot_.steps;
  s.waiting += static_cast<int64_t>(incoming_.size());
  snapshot_ = s;
}

void EngineLoop::finish(uint64_t id, OutputEvent event) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  scheduler_.finish(id);
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
        return stop_ || !incoming_.empty() || !cancels_.empty() || !controls_.empty() ||
               (!scheduler_.idle() && failure_.empty());
      });
      if (stop_) {
        incoming = std::move(incoming_);
        incoming_.clear();
      } else {
        incoming.swap(incoming_);
        cancels.swap(cancels_);
        controls.swap(controls_);
      }
    }
    for (auto& [id, active] : incoming) {
      active_.emplace(id, std::move(active));
      try {
        scheduler_.add(id, active_.at(id)->request.prompt);
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
      if (!active_.count(id)) continue;
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
      continue;
    }
    try {
      if (!scheduler_.idle()) step();
    } catch (const std::exception& e) {  // a bookkeeping bug: stop serving rather than serve wrong tokens
      {
        std::lock_guard<std::mutex> lock(mutex_);
        failure_ = e.what();
      }
      fail_all(500, std::string("the engine loop failed: ") + e.what());
    }
    publish_snapshot();
  }
  fail_all(503, "the server is shutting down");
  publish_snapshot();
}

void EngineLoop::step() {
  const auto start = Clock::now();
  sched::ScheduledStep step = scheduler_.schedule();
  if (step.empty()) {
    // Nothing can run (the waiting head does not fit yet and nothing runs to free pages):
    // cannot happen for requests that passed the size checks; fail them rather than spin.
    fail_all(500, "the scheduler could not place any request");
    return;
  }
  for (const auto& chunk : step.chunks) {
    Active& a = *active_.at(chunk.id);
    if (!a.admitted) {
      a.admitted = true;
      queue_time_.observe(seconds_between(a.arrival, start));
    }
  }
  const auto host_before_forward = Clock::now();
  std::vector<std::vector<Tensor>> logits;
  try {
    logits = engine_.execute(step.plan);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = e.what();
    }
    fail_all(500, std::string("the engine failed: ") + e.what());
    return;
  }
  const auto after_forward = Clock::now();
  const int64_t vocab = engine_.config().vocab_size;
  std::vector<int32_t> sampled;
  std::vector<TokenLogprob> logprobs;
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    Active& a = *active_.at(chunk.id);
    const Tensor& rows = logits.at(chunk.micro_batch).at(chunk.replica);
    const float* row = rows.f32() + chunk.logit_row * vocab;
    ops::SamplingOptions options = a.request.sampling;
    options.step = static_cast<uint64_t>(a.output.generated());
    const int32_t token = cpu::sample_row(row, vocab, options);
    sampled.push_back(token);
    logprobs.push_back(a.request.top_logprobs >= 0 ? token_logprob(row, vocab, token, a.request.top_logprobs)
                                                   : TokenLogprob{token, 0, {}});
  }
  scheduler_.commit(step, sampled);
  const auto now = Clock::now();
  size_t next = 0;
  for (const auto& chunk : step.chunks) {
    if (chunk.logit_row < 0) continue;
    const int32_t token = sampled[next];
    TokenLogprob logprob = std::move(logprobs[next]);
    ++next;
    Active& a = *active_.at(chunk.id);
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
    event.cached_tokens = scheduler_.cached_prompt_tokens(chunk.id);
    finish(chunk.id, std::move(event));
  }
  const auto end = Clock::now();
  step_time_.observe(seconds_between(start, end));
  double host = seconds_between(start, host_before_forward) + seconds_between(after_forward, end);
  scheduler_cpu_seconds_.fetch_add(host);
  std::lock_guard<std::mutex> lock(mutex_);
  ++snapshot_.steps;
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
  render_metric("moeserve_scheduler_cpu_seconds_total", "counter",
                "Leader host time per step outside the forward (schedule, sample, commit, detokenize).",
                scheduler_cpu_seconds_.load(), out);
  ttft_.render("moeserve_time_to_first_token_seconds", "Arrival to first generated token.", out);
  inter_token_.render("moeserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.", out);
  e2e_.render("moeserve_e2e_request_latency_seconds", "Arrival to the last token.", out);
  queue_time_.render("moeserve_queue_time_seconds", "Arrival to first scheduled.", out);
  step_time_.render("moeserve_step_duration_seconds", "Wall time of one engine step (schedule, forward, sample).", out);
  return out;
}

}  // namespace moeserve::serve
