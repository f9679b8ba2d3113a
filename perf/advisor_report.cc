#include "perf/advisor_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace moeserve::perf {

namespace {

using Json = nlohmann::ordered_json;

const PlanPrediction* find_plan(const Advice& a, const std::string& name) {
  for (const PlanPrediction& p : a.plans)
    if (p.plan.name == name) return &p;
  return nullptr;
}

double share(double part, double whole) { return whole > 0 ? 100 * part / whole : 0; }

std::string collectives_text(const StepSplit& s) {
  std::string text;
  for (const auto& [site, us] : s.collectives_us)
    text += fmt::format("{}{} {:.0f}", text.empty() ? "" : ", ", site, us);
  return text.empty() ? "-" : text;
}

std::string concurrency_table(const Advice& a, size_t i) {
  const int64_t conc = a.workload.concurrency[i];
  std::string md = fmt::format(
      "\n### Concurrency {}\n\n| rank | plan | aggregate tok/s | tok/s per request | TTFT ms | round us | weights | kv "
      "| "
      "flops | layer overhead | collectives (us) | pp bubble | host | dominant |\n"
      "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n",
      conc);
  std::vector<std::string> order = a.ranking.count(conc) ? a.ranking.at(conc) : std::vector<std::string>{};
  for (const PlanPrediction& p : a.plans)
    if (!p.fits) order.push_back(p.plan.name);
  int rank = 0;
  for (const std::string& name : order) {
    const PlanPrediction& p = *find_plan(a, name);
    const PointPrediction& pt = p.points[i];
    const StepSplit& s = pt.round;
    md += fmt::format(
        "| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {} | {:.0f} | {:.0f} | {} "
        "|\n",
        p.fits ? std::to_string(++rank) : "does not fit", name, pt.aggregate_tok_s, pt.per_request_tok_s, pt.ttft_ms,
        s.total_us(), s.weights_us, s.kv_us, s.flops_us, s.overhead_us, collectives_text(s), s.bubble_us, s.host_us,
        s.dominant());
  }
  if (rank > 0) md += fmt::format("\nWinner at concurrency {}: **{}**.\n", conc, a.ranking.at(conc).front());
  return md;
}

}  // namespace

std::string plan_reasoning(const PlanPrediction& p) {
  if (p.points.empty()) return "";
  auto at = [](const PointPrediction& pt) {
    const StepSplit& s = pt.round;
    const std::string d = s.dominant();
    double us = s.collectives_us.count(d) ? s.collectives_us.at(d) : 0;
    if (d == "weights") us = s.weights_us;
    if (d == "kv") us = s.kv_us;
    if (d == "flops") us = s.flops_us;
    if (d == "layer_overhead") us = s.overhead_us;
    if (d == "pp_bubble") us = s.bubble_us;
    if (d == "host") us = s.host_us;
    return fmt::format("at c={} {} ({:.0f}% of the {:.0f} us round)", pt.concurrency, d, share(us, s.total_us()),
                       s.total_us());
  };
  std::string text = at(p.points.front());
  if (p.points.size() > 1) text += "; " + at(p.points.back());
  return text;
}

std::string advice_markdown(const Advice& a) {
  const AdviseWorkload& w = a.workload;
  std::string md = fmt::format("## Plan advice: {} on {} ({} ranks)\n\nWorkload: input {} tokens, output {} tokens",
                               a.model, a.hardware, a.gpus, w.input_len, w.output_len);
  if (!w.speculative_algorithm.empty())
    md += fmt::format(", speculative {} (accept length {}, {} tokens verified per sequence)", w.speculative_algorithm,
                      w.accept_length, w.verify_tokens);
  md += w.expert_load.empty() ? "; uniform routing.\n" : "; measured expert loads.\n";
  md += "Times are per decode round (every running sequence one step), in microseconds.\n";
  for (size_t i = 0; i < w.concurrency.size(); ++i) md += concurrency_table(a, i);
  md += "\n### Plans\n\n| plan | fits | memory | dominating term |\n|---|---|---|---|\n";
  for (const PlanPrediction& p : a.plans)
    md += fmt::format("| {} | {} | {} | {} |\n", p.plan.name, p.fits ? "yes" : "no", p.fit_note, plan_reasoning(p));
  for (const auto& [name, why] : a.skipped) md += fmt::format("\nNot admitted: {}: {}\n", name, why);
  return md;
}

Json split_json(const StepSplit& s) {
  Json collectives = Json::object();
  for (const auto& [site, us] : s.collectives_us) collectives[site] = us;
  return {{"total_us", s.total_us()},
          {"weights_us", s.weights_us},
          {"kv_us", s.kv_us},
          {"flops_us", s.flops_us},
          {"layer_overhead_us", s.overhead_us},
          {"collectives_us", collectives},
          {"pp_bubble_us", s.bubble_us},
          {"host_us", s.host_us},
          {"dominant", s.dominant()}};
}

Json advice_json(const Advice& a) {
  Json plans = Json::array();
  for (const PlanPrediction& p : a.plans) {
    Json points = Json::array();
    for (const PointPrediction& pt : p.points)
      points.push_back({{"concurrency", pt.concurrency},
                        {"aggregate_tok_s", pt.aggregate_tok_s},
                        {"per_request_tok_s", pt.per_request_tok_s},
                        {"tpot_ms", pt.tpot_ms},
                        {"ttft_ms", pt.ttft_ms},
                        {"prefill_us", pt.prefill_us},
                        {"round", split_json(pt.round)}});
    plans.push_back({{"plan", p.plan.name},
                     {"fits", p.fits},
                     {"memory", p.fit_note},
                     {"reasoning", plan_reasoning(p)},
                     {"points", points}});
  }
  Json ranking = Json::object();
  for (const auto& [conc, order] : a.ranking) ranking[std::to_string(conc)] = order;
  Json skipped = Json::array();
  for (const auto& [name, why] : a.skipped) skipped.push_back({{"plan", name}, {"reason", why}});
  const AdviseWorkload& w = a.workload;
  return {{"model", a.model},
          {"hardware", a.hardware},
          {"gpus", a.gpus},
          {"workload",
           {{"concurrency", w.concurrency},
            {"input_len", w.input_len},
            {"output_len", w.output_len},
            {"speculative_algorithm", w.speculative_algorithm},
            {"accept_length", w.accept_length},
            {"verify_tokens", w.verify_tokens},
            {"expert_loads", w.expert_load.empty() ? "uniform" : "measured"}}},
          {"plans", plans},
          {"ranking", ranking},
          {"skipped", skipped}};
}

}  // namespace moeserve::perf
