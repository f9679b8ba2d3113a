#include "bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace moeserve::bench {

using Json = nlohmann::ordered_json;

double per_request_tok_s(const BenchMetrics& m) { return m.tpot_ms.mean > 0 ? 1000.0 / m.tpot_ms.mean : 0.0; }

std::map<int64_t, std::string> best_plan_by_concurrency(const SweepResult& result) {
  std::map<int64_t, std::string> best;
  std::map<int64_t, double> best_value;
  for (const SweepPoint& p : result.points) {
    auto it = best_value.find(p.concurrency);
    if (it == best_value.end() || p.metrics.output_throughput > it->second) {
      best_value[p.concurrency] = p.metrics.output_throughput;
      best[p.concurrency] = p.plan;
    }
  }
  return best;
}

Json sweep_json(const SweepResult& r) {
  Json out;
  out["model"] = r.model;
  out["backend"] = r.backend;
  out["reduction_plan"] = r.reduction_plan;
  out["batch_invariant"] = r.batch_invariant;
  out["reference_plan"] = r.reference_plan;
  out["plans"] = r.plans;
  out["concurrency"] = r.concurrency;
  out["workload"] = r.workload;
  Json points = Json::array();
  for (const SweepPoint& p : r.points) {
    Json j;
    j["plan"] = p.plan;
    j["max_concurrency"] = p.concurrency;
    add_metrics_json(p.metrics, j);
    j["per_request_output_throughput"] = per_request_tok_s(p.metrics);
    j["outputs_equal_reference"] = p.same_outputs;
    j["outputs_compared"] = p.compared;
    if (p.predicted_output_throughput >= 0) {
      j["predicted_output_throughput"] = p.predicted_output_throughput;
      j["prediction_error"] = prediction_error(p);
    }
    if (p.runs > 1) {
      j["runs"] = p.runs;
      j["output_throughput_min"] = p.output_throughput_min;
      j["output_throughput_max"] = p.output_throughput_max;
    }
    points.push_back(std::move(j));
  }
  out["points"] = std::move(points);
  Json skipped = Json::array();
  for (const SweepSkip& s : r.skipped) skipped.push_back({{"plan", s.plan}, {"reason", s.reason}});
  out["skipped"] = std::move(skipped);
  Json best = Json::object();
  for (const auto& [c, plan] : best_plan_by_concurrency(r)) best[std::to_string(c)] = plan;
  out["best_plan_by_concurrency"] = std::move(best);
  out["switches"] = r.switches;
  return out;
}

SweepResult sweep_from_json(const Json& in) {
  SweepResult r;
  r.model = in.at("model").get<std::string>();
  r.backend = in.at("backend").get<std::string>();
  r.reduction_plan = in.value("reduction_plan", "single");  // absent in sweeps of earlier builds
  r.batch_invariant = in.value("batch_invariant", false);
  r.reference_plan = in.value("reference_plan", "");
  r.plans = in.at("plans").get<std::vector<std::string>>();
  r.concurrency = in.at("concurrency").get<std::vector<int64_t>>();
  r.workload = in.at("workload");
  for (const Json& j : in.at("points")) {
    SweepPoint p{j.at("plan").get<std::string>(),
                 j.at("max_concurrency").get<int64_t>(),
                 metrics_from_json(j),
                 j.value("outputs_equal_reference", int64_t{0}),
                 j.value("outputs_compared", int64_t{0}),
                 j.value("predicted_output_throughput", -1.0)};
    p.runs = j.value("runs", int64_t{1});
    p.output_throughput_min = j.value("output_throughput_min", p.metrics.output_throughput);
    p.output_throughput_max = j.value("output_throughput_max", p.metrics.output_throughput);
    r.points.push_back(std::move(p));
  }
  for (const Json& j : in.at("skipped"))
    r.skipped.push_back({j.at("plan").get<std::string>(), j.at("reason").get<std::string>()});
  r.switches = in.at("switches");
  return r;
}

namespace {

const SweepPoint* find_point(const SweepResult& r, const std::string& plan, int64_t c) {
  for (const SweepPoint& p : r.points)
    if (p.plan == plan && p.concurrency == c) return &p;
  return nullptr;
}

std::vector<std::string> measured_plans(const SweepResult& r) {
  std::vector<std::string> plans;
  for (const SweepPoint& p : r.points)
    if (std::find(plans.begin(), plans.end(), p.plan) == plans.end()) plans.push_back(p.plan);
  return plans;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A "nice" axis maximum and step: 1, 2 or 5 times a power of ten.
std::pair<double, double> nice_axis(double max_value, int ticks) {
  if (max_value <= 0) return {1.0, 1.0 / ticks};
  const double raw = max_value / ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * magnitude >= raw) {
      step = f * magnitude;
      break;
    }
  return {step * std::ceil(max_value / step), step};
}

std::string format_number(double v) {
  if (v == 0) return "0";
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                   "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39",
                                   "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"};

}  // namespace

std::map<std::string, std::string> plan_colors(const std::vector<std::string>& plans) {
  std::map<std::string, std::string> out;
  std::vector<bool> taken(std::size(kColors), false);
  for (const std::string& plan : plans) {
    if (out.count(plan)) continue;
    uint32_t hash = 2166136261u;  // FNV-1a of the name: the same colour in every sweep
    for (unsigned char c : plan) hash = (hash ^ c) * 16777619u;
    size_t k = hash % std::size(kColors);
    for (size_t tries = 0; taken[k] && tries < std::size(kColors); ++tries) k = (k + 1) % std::size(kColors);
    taken[k] = true;  // two plans of one sweep never share one (the later moves on)
    out[plan] = kColors[k];
  }
  return out;
}

namespace {

// One line chart: x = the concurrency values (evenly spaced, labelled), y from 0.
// spread: each repeated point's [min, max] output throughput as a vertical bar (the
// aggregate chart, whose value is that throughput).
std::string svg_chart(const SweepResult& r, const std::string& id, const std::string& title, const std::string& y_label,
                      double (*value)(const BenchMetrics&), bool spread = false) {
  const std::vector<std::string> plans = measured_plans(r);
  const std::map<std::string, std::string> colors = plan_colors(plans);
  const double width = 640, height = 380, left = 80, right = 150, top = 40, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double max_y = 0;
  for (const SweepPoint& p : r.points)
    max_y = std::max(max_y, spread && p.runs > 1 ? p.output_throughput_max : value(p.metrics));
  const auto [y_max, y_step] = nice_axis(max_y, 5);
  const size_t n = r.concurrency.size();
  auto x_of = [&](size_t i) { return left + (n == 1 ? plot_w / 2 : plot_w * static_cast<double>(i) / (n - 1)); };
  auto y_of = [&, y_max = y_max](double v) {
    return top + plot_h * (1.0 - v / y_max);
  };  // clang 14: no binding capture
  std::string s = fmt::format(
      "<svg id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\" role=\"img\" aria-label=\"{}\">\n",
      id, width, height, width, height, html_escape(title));
  s += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                   left + plot_w / 2, html_escape(title));
  // Grid and y ticks.
  for (double v = 0; v <= y_max + y_step / 2; v += y_step) {
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", left, y_of(v),
                     left + plot_w, y_of(v));
    s += fmt::format("<text class=\"y-tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6,
                     y_of(v) + 4, format_number(v));
  }
  for (size_t i = 0; i < n; ++i)
    s += fmt::format("<text class=\"x-tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(i),
                     top + plot_h + 18, r.concurrency[i]);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333\"/>\n", left, top, top + plot_h);
  s += fmt::format("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"#333\"/>\n", left, left + plot_w,
                   top + plot_h);
  s += fmt::format(
      "<text class=\"x-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">concurrency (requests in "
      "flight)</text>\n",
      left + plot_w / 2, height - 15);
  s += fmt::format(
      "<text class=\"y-label\" x=\"0\" y=\"0\" text-anchor=\"middle\" "
      "transform=\"translate(20,{}) rotate(-90)\">{}</text>\n",
      top + plot_h / 2, html_escape(y_label));
  // One line per plan, then the legend.
  for (size_t k = 0; k < plans.size(); ++k) {
    const std::string& color = colors.at(plans[k]);
    std::string points;
    std::string dots;
    for (size_t i = 0; i < n; ++i) {
      const SweepPoint* p = find_point(r, plans[k], r.concurrency[i]);
      if (!p) continue;
      const double v = value(p->metrics);
      points += fmt::format("{:.1f},{:.1f} ", x_of(i), y_of(v));
      if (spread && p->runs > 1)
        dots += fmt::format(
            "<line class=\"spread\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" "
            "stroke-width=\"6\" stroke-opacity=\"0.35\"><title>{4} at {5}: {6} to {7} over {8} runs</title></line>\n",
            x_of(i), y_of(p->output_throughput_min), y_of(p->output_throughput_max), color, html_escape(plans[k]),
            r.concurrency[i], format_number(p->output_throughput_min), format_number(p->output_throughput_max),
            p->runs);
      dots += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} at {}: {}</title></circle>\n", x_of(i),
          y_of(v), color, html_escape(plans[k]), r.concurrency[i], format_number(v));
    }
    s += fmt::format(
        "<polyline class=\"series\" data-plan=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" "
        "points=\"{}\"/>\n",
        html_escape(plans[k]), color, points);
    s += dots;
  }
  s += "<g class=\"legend\">\n";
  for (size_t k = 0; k < plans.size(); ++k) {
    const double y = top + 10 + 20 * static_cast<double>(k);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"/>\n",
                     left + plot_w + 15, y, left + plot_w + 35, y, colors.at(plans[k]));
    s += fmt::format("<text class=\"legend-entry\" x=\"{}\" y=\"{}\">{}</text>\n", left + plot_w + 40, y + 4,
                     html_escape(plans[k]));
  }
  s += "</g>\n</svg>\n";
  return s;
}

double output_tok_s(const BenchMetrics& m) { return m.output_throughput; }

struct Column {
  const char* heading;
  double (*value)(const BenchMetrics&);
};
const Column kColumns[] = {
    {"output tok/s", [](const BenchMetrics& m) { return m.output_throughput; }},
    {"per-request tok/s", [](const BenchMetrics& m) { return per_request_tok_s(m); }},
    {"mean TTFT (ms)", [](const BenchMetrics& m) { return m.ttft_ms.mean; }},
    {"mean TPOT (ms)", [](const BenchMetrics& m) { return m.tpot_ms.mean; }},
};

std::string workload_line(const SweepResult& r) {
  std::string items;
  for (const auto& [key, value] : r.workload.items())
    items += fmt::format("{}{} {}", items.empty() ? "" : ", ", key,
                         value.is_string() ? value.get<std::string>() : value.dump());
  const std::string reduction =
      (r.reduction_plan == "single" ? std::string() : fmt::format(", reduction plan {}", r.reduction_plan)) +
      (r.batch_invariant ? ", batch-invariant kernels" : "");
  return fmt::format("Model {}, backend {}{}; workload: {}.", r.model, r.backend, reduction, items);
}

// "same / compared" for a plan's point, "reference" for the reference plan's, "-" unmeasured.
std::string same_outputs_cell(const SweepResult& r, const std::string& plan, int64_t c) {
  const SweepPoint* p = find_point(r, plan, c);
  if (p == nullptr) return "-";
  if (plan == r.reference_plan) return "reference";
  return fmt::format("{} / {}", p->same_outputs, p->compared);
}

std::string same_outputs_heading(const SweepResult& r) {
  return fmt::format("Greedy outputs equal to {}'s (requests)", r.reference_plan);
}

// A plan's point shown in a table cell.
using Cell = std::function<std::string(const std::string& plan, int64_t concurrency)>;

// A column's value at a point, "-" where the plan was not measured.
Cell metric_cell(const SweepResult& r, const Column& col) {
  return [&r, &col](const std::string& plan, int64_t c) {
    const SweepPoint* p = find_point(r, plan, c);
    return p ? format_number(col.value(p->metrics)) : std::string("-");
  };
}

// One plan x concurrency table, a row per measured plan.
std::string markdown_table(const SweepResult& r, const std::string& heading, const Cell& cell) {
  std::string out = fmt::format("## {}\n\n| plan |", heading);
  for (int64_t c : r.concurrency) out += fmt::format(" c={} |", c);
  out += "\n|---|";
  for (size_t i = 0; i < r.concurrency.size(); ++i) out += "---:|";
  out += "\n";
  for (const std::string& plan : measured_plans(r)) {
    out += fmt::format("| {} |", plan);
    for (int64_t c : r.concurrency) out += fmt::format(" {} |", cell(plan, c));
    out += "\n";
  }
  return out + "\n";
}

std::string html_table(const SweepResult& r, const std::string& heading, const Cell& cell) {
  std::string out = fmt::format("<h2>{}</h2>\n<table>\n<tr><th>plan</th>", html_escape(heading));
  for (int64_t c : r.concurrency) out += fmt::format("<th>c={}</th>", c);
  out += "</tr>\n";
  for (const std::string& plan : measured_plans(r)) {
    out += fmt::format("<tr><td>{}</td>", html_escape(plan));
    for (int64_t c : r.concurrency) out += fmt::format("<td>{}</td>", cell(plan, c));
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

bool has_predictions(const SweepResult& r) {
  for (const SweepPoint& p : r.points)
    if (p.predicted_output_throughput >= 0) return true;
  return false;
}

// "measured / predicted (error)" of the output throughput.
std::string prediction_cell(const SweepResult& r, const std::string& plan, int64_t c) {
  const SweepPoint* p = find_point(r, plan, c);
  if (p == nullptr || p->predicted_output_throughput < 0) return "-";
  return fmt::format("{} / {} ({:+.0f}%)", format_number(p->metrics.output_throughput),
                     format_number(p->predicted_output_throughput), 100 * prediction_error(*p));
}

const char* const kPredictionHeading = "Output tok/s: measured / predicted by the plan advisor (error)";

bool has_repeats(const SweepResult& r) {
  for (const SweepPoint& p : r.points)
    if (p.runs > 1) return true;
  return false;
}

// "median [min, max]" of the output throughput over a point's runs.
std::string spread_cell(const SweepResult& r, const std::string& plan, int64_t c) {
  const SweepPoint* p = find_point(r, plan, c);
  if (p == nullptr) return "-";
  if (p->runs <= 1) return format_number(p->metrics.output_throughput);
  return fmt::format("{} [{}, {}]", format_number(p->metrics.output_throughput),
                     format_number(p->output_throughput_min), format_number(p->output_throughput_max));
}

std::string spread_heading(const SweepResult& r) {
  int64_t runs = 1;
  for (const SweepPoint& p : r.points) runs = std::max(runs, p.runs);
  return fmt::format("Output tok/s over repeated runs: median [min, max] ({} runs per point)", runs);
}

}  // namespace

double prediction_error(const SweepPoint& p) {
  if (p.predicted_output_throughput <= 0) return 0;
  return (p.metrics.output_throughput - p.predicted_output_throughput) / p.predicted_output_throughput;
}

std::string sweep_markdown(const SweepResult& r) {
  std::string out = "# Plan sweep\n\n" + workload_line(r) + "\n\n";
  for (const Column& col : kColumns) out += markdown_table(r, col.heading, metric_cell(r, col));
  if (!r.reference_plan.empty())
    out += markdown_table(r, same_outputs_heading(r),
                          [&r](const std::string& plan, int64_t c) { return same_outputs_cell(r, plan, c); });
  if (has_predictions(r))
    out += markdown_table(r, kPredictionHeading,
                          [&r](const std::string& plan, int64_t c) { return prediction_cell(r, plan, c); });
  if (has_repeats(r))
    out += markdown_table(r, spread_heading(r),
                          [&r](const std::string& plan, int64_t c) { return spread_cell(r, plan, c); });
  out += "## Best plan per concurrency (output tok/s)\n\n| concurrency | plan | output tok/s |\n|---:|---|---:|\n";
  for (const auto& [c, plan] : best_plan_by_concurrency(r))
    out += fmt::format("| {} | {} | {} |\n", c, plan, format_number(find_point(r, plan, c)->metrics.output_throughput));
  if (!r.skipped.empty()) {
    out += "\n## Skipped plans\n\n";
    for (const SweepSkip& s : r.skipped) out += fmt::format("- `{}`: {}\n", s.plan, s.reason);
  }
  if (!r.switches.empty()) {
    out += "\n## Switches\n\n| plan | how | time to ready (s) |\n|---|---|---:|\n";
    for (const Json& s : r.switches)
      out += fmt::format("| {} | {} | {:.3f} |\n", s.value("plan", ""), s.value("how", ""),
                         s.value("time_to_ready_s", 0.0));
  }
  return out;
}

std::string sweep_html(const SweepResult& r) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>moeserve plan sweep: " +
      html_escape(r.model) +
      "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px "
      "0}"
      "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}th:first-child,td:first-child{text-align:left}"
      ".charts{display:flex;flex-wrap:wrap;gap:16px}</style>\n</head>\n<body>\n";
  out += "<h1>Plan sweep: " + html_escape(r.model) + "</h1>\n<p>" + html_escape(workload_line(r)) + "</p>\n";
  out += "<div class=\"charts\">\n";
  out += svg_chart(r, "chart-aggregate", "Aggregate output throughput", "output tok/s (all requests)", output_tok_s,
                   /*spread=*/true);
  out += svg_chart(r, "chart-per-request", "Per-request output speed", "output tok/s per request",
                   [](const BenchMetrics& m) { return per_request_tok_s(m); });
  out += "</div>\n";
  for (const Column& col : kColumns) out += html_table(r, col.heading, metric_cell(r, col));
  if (!r.reference_plan.empty())
    out += html_table(r, same_outputs_heading(r),
                      [&r](const std::string& plan, int64_t c) { return same_outputs_cell(r, plan, c); });
  if (has_predictions(r))
    out += html_table(r, kPredictionHeading,
                      [&r](const std::string& plan, int64_t c) { return prediction_cell(r, plan, c); });
  if (has_repeats(r))
    out +=
        html_table(r, spread_heading(r), [&r](const std::string& plan, int64_t c) { return spread_cell(r, plan, c); });
  out +=
      "<h2>Best plan per concurrency (output tok/s)</h2>\n<table>\n<tr><th>concurrency</th><th>plan</th>"
      "<th>output tok/s</th></tr>\n";
  for (const auto& [c, plan] : best_plan_by_concurrency(r))
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", c, html_escape(plan),
                       format_number(find_point(r, plan, c)->metrics.output_throughput));
  out += "</table>\n";
  if (!r.skipped.empty()) {
    out += "<h2>Skipped plans</h2>\n<ul>\n";
    for (const SweepSkip& s : r.skipped)
      out += "<li><code>" + html_escape(s.plan) + "</code>: " + html_escape(s.reason) + "</li>\n";
    out += "</ul>\n";
  }
  if (!r.switches.empty()) {  // as the Markdown's "Switches"
    out += "<h2>Switches</h2>\n<table>\n<tr><th>plan</th><th>how</th><th>time to ready (s)</th></tr>\n";
    for (const Json& s : r.switches)
      out += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.3f}</td></tr>\n", html_escape(s.value("plan", "")),
                         html_escape(s.value("how", "")), s.value("time_to_ready_s", 0.0));
    out += "</table>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace moeserve::bench
