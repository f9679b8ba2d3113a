// The serving loop: one engine thread drives the step loop (runtime/step_loop.h: schedule ->
// run on every rank -> draw -> commit) and turns each step's tokens into output events:
// detokenize, stop checks, push to each request's stream; it also owns re-plans and metrics.
// HTTP threads submit requests and cancel them (client gone); they never touch the step loop.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ops/ops.h"
#include "runtime/engine.h"
#include "runtime/step_loop.h"
#include "sched/scheduler.h"
#include "serve/metrics.h"
#include "serve/output_processor.h"
#include "serve/request_stream.h"
#include "serve/sglang_metrics.h"
#include "spec/speculative_options.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::serve {

struct EngineRequest {
  std::vector<int32_t> prompt;
  ops::SamplingOptions sampling;
  OutputLimits limits;
  int top_logprobs = -1;  // -1: none
  // Tests only (--test-scripted-output): the first tokens streamed are these instead of the
  // model's, through the whole output path (detokenizer, stop checks, streams); the model's own
  // follow once they run out. The KV cache keeps the model's tokens: nothing reads them back.
  std::vector<int32_t> scripted_output;
  std::shared_ptr<TokenConstraint> constraint;  // structured output (null: none)
  ops::LogitAdjustOptions logit_adjust;         // bias, min_tokens masks, penalties (on the devices)
  int prompt_alternatives = -1;                 // >= 0: prompt logprobs with this many alternatives (-1: none)
};

// What a re-plan switches to: the plan's name, the scheduler's options under it (DP replicas,
// pipeline stages) and how to build its engine (called on the engine thread).
struct ReplanTarget {
  std::string plan_name;
  sched::SchedulerOptions scheduler;
  std::function<std::unique_ptr<runtime::Engine>()> build_engine;
  // Builds it from the serving engine's resident weights instead (runtime::Engine's
  // reshard_from constructor); null: always build_engine.
  std::function<std::unique_ptr<runtime::Engine>(runtime::Engine& from)> reshard_engine;
  // Why the weights cannot be resharded in place (both plans' shards do not fit), found by
  // whoever prepared the target before anything stopped; "" when they can.
  std::string in_place_refusal;
};

// How a re-plan went, in seconds. Phases: pause (from the call until the step running then
// completed), move (the new plan's weights: resharded from the resident ones, or loaded from
// the model's source), graphs (the step loop made; no warm-up: the step sizes in use are
// captured by the resume's first step, the rest lazily when first run), resume
// (the requests that were running re-admitted under the new plan and their first step, which
// recomputes their KV from their tokens); ready is their sum. drain_s, build_s and warmup_s
// are the older names of pause, move and graphs.
struct ReplanReport {
  std::string plan, previous_plan;
  double pause_s = 0, move_s = 0, graphs_s = 0, resume_s = 0, ready_s = 0;
  double drain_s = 0, build_s = 0, warmup_s = 0;
  std::string weights_from;     // "resident" (resharded in place) or "source" (checkpoint or generator)
  std::string fallback_reason;  // why not "resident"
  int64_t moved_local_bytes = 0, moved_peer_bytes = 0;  // copied
  int64_t viewed_bytes = 0;                             // shared with the old shards instead of copied
  int64_t reused_cache_bytes = 0;                       // KV cache buffers taken over from the old engine
  // Move's parts: the new engine built (weights, caches, workspaces), the old one freed.
  double move_build_s = 0, move_free_s = 0;
  int64_t requests_waited = 0;    // requests that arrived while switching and waited in the queue
  int64_t requests_carried = 0;   // admitted requests that went on under the new plan
  int64_t tokens_recomputed = 0;  // their prompt and generated tokens, prefilled again under it
};

struct EngineLoopOptions {
  sched::SchedulerOptions scheduler;
  spec::SpeculativeOptions speculative;  // --speculative-algorithm and its knobs
  // The plan being served (for /health and /metrics), and how to build its engine again: a
  // re-plan whose new engine fails to build falls back to it. Without it, replan is refused.
  std::string plan_name = "single";
  std::function<std::unique_ptr<runtime::Engine>()> rebuild_engine;
  int64_t max_queued_requests = 1024;  // beyond max_running_requests; more is 429
  // Run every padded step size once before serving (Scheduler::warmup_steps).
  bool warmup = true;
  // --min-step-ms: every step lasts at least this long (the engine thread sleeps out the
  // rest), as on a slower device. It lets a benchmark client be checked against another on a
  // loaded CPU machine: a step that is mostly waiting lasts as long whatever else runs.
  std::chrono::microseconds min_step{0};
};

// What the engine thread last published (for /metrics and tests).
// What SGLang's /get_server_info reports live (its internal_states).
struct LiveStats {
  double spec_accept_length = 0;   // tokens per verify step since start (0 without speculation)
  double last_gen_throughput = 0;  // generated tokens per second, recent window
};

struct EngineSnapshot {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_total = 0, kv_pages_used = 0, kv_pages_cached = 0, kv_pages_free = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0, steps = 0;
};

class EngineLoop {
 public:
  // Warms up (options.warmup) on the calling thread, then starts the engine thread.
  EngineLoop(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, EngineLoopOptions options);
  // The same, owning the engine (a re-plan then frees it before building the next one).
  EngineLoop(std::unique_ptr<runtime::Engine> engine, const tokenizer::Tokenizer& tokenizer, EngineLoopOptions options);
  ~EngineLoop();

  // Live re-plan: stops admitting (new requests wait in the queue) and, once the step running
  // completes, switches: builds `target`'s engine from the serving one's resident weights
  // (target.reshard_engine; else, or when that fails, frees the engine and builds from the
  // model's source), warms it up, and carries every admitted request over: it goes on from its
  // prompt and the tokens it generated (its KV recomputed under the new plan), nobody waits for
  // another to finish. When building throws, the previous plan's engine is rebuilt and an
  // ApiError 500 names what failed (if even that fails, the loop is failed). ApiError 409 while another re-plan runs,
  // 503 when draining or failed, 400 without options.rebuild_engine. Validate the plan before calling: nothing is
  // checked here before the server stops admitting.
  ReplanReport replan(ReplanTarget target);
  // The plan being served and the number of successful switches.
  std::string plan_name() const;
  int64_t replans() const { return replans_.load(); }

  // Queues a request; throws ApiError 429 when the queue is full, 503 when draining or the
  // engine failed.
  std::shared_ptr<RequestStream> submit(EngineRequest request);
  // Ends a request whose client is gone; its pages are freed before the next step.
  void cancel(uint64_t id);
  // Evicts every cached KV page (on the engine thread); returns how many.
  int64_t flush_prefix_cache();

  // Refuses new requests and waits until the ones in flight finish (or the timeout).
  // Returns true when all finished.
  bool drain(std::chrono::milliseconds timeout);
  // Stops the engine thread; requests still in flight fail with 503.
  void stop();

  bool draining() const { return draining_.load(); }
  // Empty while the engine works; the failure otherwise.
  std::string failure() const;
  // What the engine thread last published (cheap; may lag a step behind).
  EngineSnapshot snapshot() const;
  // The state now, taken on the engine thread between steps.
  EngineSnapshot current_snapshot();
  std::string render_metrics() const;
  // SGLang's series (serve/sglang_metrics.h) with model_name="`model_name`".
  void render_sglang_metrics(const std::string& model_name, std::string& out) const;
  LiveStats live_stats() const;

 private:
  struct Active;
  // The engine thread's loop, and its parts: take what the HTTP threads queued, then step.
  void run();
  // Waits for work; moves the queued requests, cancels and controls out under the lock.
  bool wait_for_work(std::vector<std::pair<uint64_t, std::unique_ptr<Active>>>& incoming,
                     std::vector<uint64_t>& cancels, std::vector<std::function<void()>>& controls);
  void admit(std::vector<std::pair<uint64_t, std::unique_ptr<Active>>>& incoming);
  void cancel_now(const std::vector<uint64_t>& cancels);
  // Runs one step loop step and streams its tokens (runtime::StepLoop::step).
  void step();
  // A step loop over `engine` with the metrics hooks, warmed up when options_.warmup and `warm`
  // (a re-plan does not: the carried requests' steps capture the sizes in use, the rest lazily).
  std::unique_ptr<runtime::StepLoop> make_loop(runtime::Engine& engine, const sched::SchedulerOptions& options,
                                               bool warm = true);
  bool busy() const { return loop_ && !loop_->idle(); }
  bool idle() const { return !loop_ || loop_->idle(); }
  // Observes the queue time of the step's first-scheduled requests.
  void note_admissions(const sched::ScheduledStep& step, std::chrono::steady_clock::time_point start);
  // Streams a step's tokens; ends finished requests; step metrics.
  void complete(runtime::StepResult& result);
  // Streams a step's prompt logprobs (EngineRequest::prompt_alternatives).
  void push_prompt_logprobs(const runtime::StepResult& result);
  // Records an engine failure and fails every request.
  void engine_failed(const std::exception& e);
  void finish(uint64_t id, OutputEvent event);
  void fail_all(int status, const std::string& message);
  void publish_snapshot();
  void render_spec_metrics(std::string& out) const;    // the moeserve_spec_* lines
  void render_replan_metrics(std::string& out) const;  // the re-plan phases and carried requests
  // Runs fn on the engine thread and waits for it.
  void on_engine_thread(const std::function<void()>& fn);
  // Engine thread: switches once nothing runs (pending_replan_).
  void switch_plan();
  // Engine thread: ends a pending re-plan with an error (shutdown, engine failure).
  void abandon_replan(const std::string& reason);
  // Engine thread: builds `target`'s engine (from the resident weights where it can, else
  // after freeing the old one) and warms it up; the report gets move and graphs.
  void install(const ReplanTarget& target, ReplanReport& report);
  // A request that was admitted when a re-plan switched: what it generated so far.
  struct Carried {
    uint64_t id;
    std::vector<int32_t> tokens;  // prompt then generated
    int64_t generated;
  };
  // Engine thread, at a switch: the admitted requests in arrival order (the step loop is gone after).
  std::vector<Carried> carry_admitted();
  // Engine thread: adds them to the new step loop; returns the tokens it will recompute.
  int64_t resume_carried(const std::vector<Carried>& carried);
  // Engine thread: resumes the carried requests, times the switch and hands the report over.
  void finish_switch(ReplanReport& report, const std::vector<Carried>& carried, const std::string& error,
                     std::chrono::steady_clock::time_point requested);

  std::unique_ptr<runtime::Engine> owned_engine_;  // null when the caller owns the engine
  const tokenizer::Tokenizer& tokenizer_;
  EngineLoopOptions options_;                // scheduler options and plan name change under mutex_ on a re-plan
  std::unique_ptr<runtime::StepLoop> loop_;  // engine thread only; null while a re-plan builds
  std::unordered_map<uint64_t, std::unique_ptr<Active>> active_;  // engine thread only

  mutable std::mutex mutex_;  // guards what follows up to the thread
  std::condition_variable wake_;
  std::condition_variable all_done_;
  std::vector<std::pair<uint64_t, std::unique_ptr<Active>>> incoming_;
  std::vector<uint64_t> cancels_;
  std::vector<std::function<void()>> controls_;
  int64_t in_system_ = 0;  // submitted and not finished
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::string failure_;
  EngineSnapshot snapshot_;
  std::atomic<bool> draining_{false};
  // Re-plan: admission paused while pending; the caller waits for the report or the error.
  std::condition_variable replan_done_;
  std::unique_ptr<ReplanTarget> pending_replan_;
  std::chrono::steady_clock::time_point replan_requested_;
  bool replan_finished_ = false;
  ReplanReport replan_report_;
  std::string replan_error_;
  int replan_error_status_ = 500;
  std::atomic<int64_t> replans_{0}, replans_failed_{0};
  std::atomic<double> last_replan_ready_s_{0};
  std::atomic<int64_t> replan_carried_{0}, replan_recomputed_tokens_{0}, replans_resident_{0};
  ReplanReport last_replan_;  // under mutex_: its phases for /metrics

  // Counters and histograms (thread-safe).
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0}, cancelled_{0}, rejected_queue_full_{0};
  std::atomic<int64_t> spec_verify_steps_{0}, spec_draft_tokens_{0}, spec_accepted_tokens_{0};
  std::atomic<int64_t> spec_draft_budget_{0};  // StepResult::draft_budget of the last step
  std::atomic<int64_t> finished_stop_{0}, finished_length_{0}, failed_{0};
  Histogram ttft_, inter_token_, e2e_, queue_time_, step_time_;
  Histogram decode_step_time_;  // steps with decode tokens only (the shape bench-step times)
  SglangMetrics sglang_;
  std::atomic<double> scheduler_cpu_seconds_{0};
  std::atomic<int64_t> sampled_rows_{0}, sampling_fallbacks_{0}, device_drawn_rows_{0};

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace moeserve::serve
