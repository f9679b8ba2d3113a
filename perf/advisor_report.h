// The advisor's answer as Markdown (one table per concurrency: plans ranked, predicted tok/s,
// TTFT, the step's split and its dominating term; then each plan's fit and reasoning) and JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "perf/advisor.h"

namespace moeserve::perf {

std::string advice_markdown(const Advice& advice);
nlohmann::ordered_json advice_json(const Advice& advice);
nlohmann::ordered_json split_json(const StepSplit& split);

// One line per plan: what dominates its step at the lowest and the highest concurrency.
std::string plan_reasoning(const PlanPrediction& plan);

}  // namespace moeserve::perf
