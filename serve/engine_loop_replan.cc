// EngineLoop's live re-plans (serve/engine_loop.h): the switch between two steps, the new
// engine built from the resident weights where it can, the admitted requests carried over.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/engine_loop.h"
#include "serve/engine_loop_active.h"
#include "serve/metrics.h"

namespace moeserve::serve {

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

void EngineLoop::install(const ReplanTarget& target, ReplanReport& report) {
  loop_.reset();  // the old engine's steps all completed (carry_admitted)
  const auto move_start = Clock::now();
  std::unique_ptr<runtime::Engine> engine;
  if (!target.reshard_engine || !owned_engine_) {
    report.fallback_reason = "no resident engine to reshard from";
  } else if (!target.in_place_refusal.empty()) {
    report.fallback_reason = target.in_place_refusal;
  } else {
    try {  // both engines exist while the new one's shards are copied from the old one's
      engine = target.reshard_engine(*owned_engine_);
      report.weights_from = "resident";
      for (const ReshardStats& s : engine->stats().reshard) {
        report.moved_local_bytes += s.local_bytes;
        report.moved_peer_bytes += s.peer_bytes;
        report.viewed_bytes += s.viewed_bytes;
        report.reused_cache_bytes += s.reused_cache_bytes;
      }
    } catch (const std::exception& e) {
      report.fallback_reason = e.what();
    }
  }
  const auto free_start = Clock::now();
  owned_engine_.reset();  // free it first otherwise: on GPUs both would not fit
  report.move_free_s = seconds_between(free_start, Clock::now());
  if (!engine) {
    report.weights_from = "source";
    engine = target.build_engine();
  }
  MS_CHECK(engine != nullptr, "replan: building the engine for plan '{}' gave nothing", target.plan_name);
  const auto graphs_start = Clock::now();
  report.move_s = seconds_between(move_start, graphs_start);
  report.move_build_s = report.move_s - report.move_free_s;
  std::unique_ptr<runtime::StepLoop> loop = make_loop(*engine, target.scheduler, /*warm=*/false);
  report.graphs_s = seconds_between(graphs_start, Clock::now());
  owned_engine_ = std::move(engine);
  loop_ = std::move(loop);
  std::lock_guard<std::mutex> lock(mutex_);
  options_.scheduler = target.scheduler;
  options_.plan_name = target.plan_name;
}

std::vector<EngineLoop::Carried> EngineLoop::carry_admitted() {
  if (loop_) loop_->finish_in_flight();  // a pipeline group's step in flight: its draws are redone
  std::vector<Carried> out;
  for (const auto& [id, a] : active_) {
    Carried c{id, a->request.prompt, static_cast<int64_t>(a->generated.size())};
    c.tokens.insert(c.tokens.end(), a->generated.begin(), a->generated.end());
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const Carried& a, const Carried& b) { return a.id < b.id; });
  return out;
}

int64_t EngineLoop::resume_carried(const std::vector<Carried>& carried) {
  int64_t recomputed = 0;
  for (const Carried& c : carried) {
    const EngineRequest& request = active_.at(c.id)->request;
    try {
      loop_->add(c.id, {.prompt = c.tokens,
                        .sampling = request.sampling,
                        .top_logprobs = request.top_logprobs,
                        .max_new_tokens = request.limits.max_tokens > 0 ? request.limits.max_tokens - c.generated : 0,
                        .first_step = c.generated});
      recomputed += static_cast<int64_t>(c.tokens.size());
    } catch (const std::exception& e) {  // e.g. no longer fits the new plan's KV cache
      OutputEvent event;
      event.error_status = 500;
      event.error = fmt::format("request {} could not continue under the new plan: {}", c.id, e.what());
      ++failed_;
      finish(c.id, std::move(event));
    }
  }
  return recomputed;
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
    previous = {options_.plan_name, options_.scheduler, options_.rebuild_engine, nullptr, ""};
  }
  report.plan = target->plan_name;
  report.previous_plan = previous.plan_name;
  const std::vector<Carried> carried = carry_admitted();
  report.pause_s = seconds_between(requested, Clock::now());
  std::string error;
  try {
    install(*target, report);
    std::lock_guard<std::mutex> lock(mutex_);
    options_.rebuild_engine = target->build_engine;
  } catch (const std::exception& e) {
    error =
        fmt::format("re-plan to '{}' failed ({}); back on plan '{}'", target->plan_name, e.what(), previous.plan_name);
    ++replans_failed_;
    try {
      ReplanReport ignored;
      install(previous, ignored);
    } catch (const std::exception& e2) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = fmt::format("re-plan to '{}' failed ({}) and rebuilding plan '{}' failed too ({})", target->plan_name,
                             e.what(), previous.plan_name, e2.what());
      error = failure_;
    }
  }
  finish_switch(report, carried, error, requested);
}

void EngineLoop::finish_switch(ReplanReport& report, const std::vector<Carried>& carried, const std::string& error,
                               Clock::time_point requested) {
  const auto resume_start = Clock::now();
  if (loop_) {
    report.tokens_recomputed = resume_carried(carried);
    report.requests_carried = static_cast<int64_t>(carried.size());
    // The carried requests' first step under the new plan (their KV recomputed) belongs to the switch.
    try {
      if (busy()) step();
    } catch (const std::exception& e) {  // a bookkeeping bug, as in run()
      {
        std::lock_guard<std::mutex> lock(mutex_);
        failure_ = e.what();
      }
      fail_all(500, std::string("the engine loop failed: ") + e.what());
    }
  } else {
    fail_all(500, "the engine failed: " + failure());
  }
  report.resume_s = seconds_between(resume_start, Clock::now());
  report.ready_s = seconds_between(requested, Clock::now());
  report.drain_s = report.pause_s;
  report.build_s = report.move_s;
  report.warmup_s = report.graphs_s;
  if (error.empty()) {
    ++replans_;
    if (report.weights_from == "resident") ++replans_resident_;
    last_replan_ready_s_ = report.ready_s;
  }
  replan_carried_ += report.requests_carried;
  replan_recomputed_tokens_ += report.tokens_recomputed;
  std::lock_guard<std::mutex> lock(mutex_);
  if (error.empty()) last_replan_ = report;
  report.requests_waited = static_cast<int64_t>(incoming_.size());
  pending_replan_.reset();
  replan_report_ = report;
  replan_error_ = error;
  replan_error_status_ = 500;
  replan_finished_ = true;
  replan_done_.notify_all();
}

void EngineLoop::render_replan_metrics(std::string& out) const {
  ReplanReport last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = last_replan_;
  }
  render_labeled("moeserve_last_replan_phase_seconds", "gauge",
                 "The last successful re-plan's phases: pause, move (weights), graphs (warm-up), resume.",
                 {{"pause", last.pause_s}, {"move", last.move_s}, {"graphs", last.graphs_s}, {"resume", last.resume_s}},
                 "phase", out);
  render_metric("moeserve_replans_from_resident_weights_total", "counter",
                "Re-plans whose weights were resharded from the ones the ranks held (not read from the source).",
                static_cast<double>(replans_resident_.load()), out);
  render_metric("moeserve_replan_carried_requests_total", "counter",
                "Requests that were running or admitted at a re-plan and went on under the new plan.",
                static_cast<double>(replan_carried_.load()), out);
  render_metric("moeserve_replan_recomputed_tokens_total", "counter",
                "Tokens of carried requests prefilled again under the new plan (their KV recomputed).",
                static_cast<double>(replan_recomputed_tokens_.load()), out);
}

}  // namespace moeserve::serve
