// EngineLoop's /metrics: moeserve's own series and SGLang's (serve/sglang_metrics.h).
#include <string>

#include "serve/engine_loop.h"

namespace moeserve::serve {

void EngineLoop::render_spec_metrics(std::string& out) const {
  render_metric("moeserve_spec_verify_steps_total", "counter",
                "Sequence steps that verified speculative drafts (one per request and step).",
                static_cast<double>(spec_verify_steps_.load()), out);
  render_metric("moeserve_spec_draft_tokens_total", "counter", "Speculative draft tokens verified.",
                static_cast<double>(spec_draft_tokens_.load()), out);
  render_metric("moeserve_spec_accepted_tokens_total", "counter", "Speculative draft tokens accepted.",
                static_cast<double>(spec_accepted_tokens_.load()), out);
  const int64_t verify_steps = spec_verify_steps_.load();
  render_metric("moeserve_spec_accept_length", "gauge",
                "Tokens per verify step (accepted drafts plus the target's own), since start.",
                verify_steps ? static_cast<double>(spec_accepted_tokens_.load() + verify_steps) / verify_steps : 0.0,
                out);
  render_metric("moeserve_spec_draft_budget", "gauge",
                "Drafts per sequence the next steps verify (chosen from measured step costs unless "
                "--speculative-fixed-drafts; 0: speculation backed off).",
                static_cast<double>(spec_draft_budget_.load()), out);
}

std::string EngineLoop::render_metrics() const {
  const EngineSnapshot s = snapshot();
  std::string out;
  render_metric("moeserve_requests_running", "gauge", "Requests being computed (admitted, holding KV pages).",
                static_cast<double>(s.running), out);
  render_metric("moeserve_requests_waiting", "gauge", "Requests queued for admission.", static_cast<double>(s.waiting),
                out);
  // Not "_total": promtool (promlint) keeps that suffix for counters.
  render_metric("moeserve_kv_pages_capacity", "gauge", "KV cache pages over all DP replicas.",
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
  render_metric(
      "moeserve_prefix_cache_hit_rate", "gauge", "Prefix cache hit tokens / queried tokens.",
      s.prefix_query_tokens ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prefix_query_tokens) : 0,
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
  render_spec_metrics(out);
  render_metric("moeserve_sampled_rows_total", "counter",
                "Sampled (non-greedy) rows drawn from device-reduced candidates.",
                static_cast<double>(sampled_rows_.load()), out);
  render_metric("moeserve_device_drawn_rows_total", "counter",
                "Rows of steps in flight or of several micro-batches, each drawn whole on the device after its "
                "micro-batch.",
                static_cast<double>(device_drawn_rows_.load()), out);
  render_metric(
      "moeserve_sampling_fallbacks_total", "counter",
      "Sampled rows whose draw reached past their candidates and was drawn over the full logits on the device.",
      static_cast<double>(sampling_fallbacks_.load()), out);
  render_metric("moeserve_scheduler_cpu_seconds_total", "counter",
                "Leader host time per step outside the forward (schedule, sample, commit, detokenize).",
                scheduler_cpu_seconds_.load(), out);
  render_labeled("moeserve_plan_info", "gauge", "The parallel plan being served (label plan).", {{plan_name(), 1.0}},
                 "plan", out);
  render_metric("moeserve_replans_total", "counter", "Successful live re-plans (POST /admin/replan).",
                static_cast<double>(replans_.load()), out);
  render_metric("moeserve_replans_failed_total", "counter", "Re-plans that failed and fell back to the old plan.",
                static_cast<double>(replans_failed_.load()), out);
  render_metric("moeserve_last_replan_ready_seconds", "gauge",
                "Time from the last successful re-plan's request to serving again.", last_replan_ready_s_.load(), out);
  render_replan_metrics(out);
  ttft_.render("moeserve_time_to_first_token_seconds", "Arrival to first generated token.", out);
  inter_token_.render("moeserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.", out);
  e2e_.render("moeserve_e2e_request_latency_seconds", "Arrival to the last token.", out);
  queue_time_.render("moeserve_queue_time_seconds", "Arrival to first scheduled.", out);
  step_time_.render("moeserve_step_duration_seconds", "Wall time of one engine step (schedule, forward, sample).", out);
  decode_step_time_.render("moeserve_decode_step_duration_seconds",
                           "Wall time of steps that only decode (no prefill chunk): the shape bench-step times.", out);
  return out;
}

LiveStats EngineLoop::live_stats() const {
  const int64_t verify_steps = spec_verify_steps_.load();
  return {verify_steps ? static_cast<double>(spec_accepted_tokens_.load() + verify_steps) / verify_steps : 0.0,
          sglang_.gen_throughput()};
}

void EngineLoop::render_sglang_metrics(const std::string& model_name, std::string& out) const {
  const EngineSnapshot s = snapshot();
  sglang_.render(model_name,
                 {.running = s.running,
                  .waiting = s.waiting,
                  .kv_pages_total = s.kv_pages_total,
                  .kv_pages_used = s.kv_pages_used,
                  .prefix_query_tokens = s.prefix_query_tokens,
                  .prefix_hit_tokens = s.prefix_hit_tokens,
                  .spec_accept_length = live_stats().spec_accept_length},
                 out);
}

}  // namespace moeserve::serve
