// Plan presets by name ("tp8", "pp8", "ep8", "ep8-dp", "ep4tp2", "tp2pp4", "ep2pp2",
// "single") and validation against model dimensions.
#pragma once

#include <string>

#include "parallel/plan.h"

namespace moeserve::parallel {

// Parses a preset name. Throws Error naming the plan on bad grammar.
ParallelPlan parse_plan(const std::string& name);

// Checks that the plan divides the model: heads, experts, layers, vocab, intermediate
// sizes. Throws Error naming the plan, the dimension and the sizes.
void validate_plan(const ParallelPlan& plan, const ShardDims& dims);

}  // namespace moeserve::parallel
