// Plans by preset name ("tp8", "pp8", "ep8", "ep8-dp", "ep4tp2", "tp2pp4", "ep2pp2",
// "single", and the same shapes at any size), by SGLang-style explicit flags, and their
// validation against model dimensions.
#pragma once

#include <string>
#include <vector>

#include "parallel/plan.h"

namespace moeserve::parallel {

// Parses a preset name. Grammar: "single" | component+ ["-dp"], component = ("tp" | "ep" |
// "pp") N, each kind at most once, in any order:
//   tpA      attention TP A, MoE TP A           epB      attention TP B, MoE EP B
//   epBtpA   attention TP A*B, MoE EP B x TP A  ppC      C pipeline stages
//   ...-dp   attention data parallel over the stage's ranks instead of TP (needs epB)
// Throws Error naming the plan on bad grammar.
ParallelPlan parse_plan(const std::string& name);

// SGLang's flags: --tp-size (ranks per pipeline stage), --ep-size (MoE expert-parallel
// groups; MoE TP = tp / ep), --pp-size, --enable-dp-attention with --dp-size (attention
// replicas per stage; attention TP = tp / dp; defaults to tp). 0 means "not given".
struct PlanFlags {
  int tp_size = 0;
  int ep_size = 0;
  int pp_size = 0;
  int dp_size = 0;
  bool enable_dp_attention = false;
  bool any() const { return tp_size || ep_size || pp_size || dp_size || enable_dp_attention; }
};
// Throws Error naming the flag and sizes when they do not describe a plan.
ParallelPlan plan_from_flags(const PlanFlags& flags);

// The plan of a command line: the preset when given, else the flags, else "single". Giving
// both is an error.
ParallelPlan resolve_plan(const std::string& preset, const PlanFlags& flags);

// Every preset name with a world of at most `max_world` ranks whose sizes are powers of two
// ("single", "tp2", "ep2pp2", "ep4tp2-dp", ...): the plans a sweep or a test covers.
std::vector<std::string> preset_names(int max_world);

// The preset name of a plan ("ep4tp2pp2", "ep8-dp", "single"); plans that no preset can
// express (attention TP and DP at once, or DP attention over MoE TP) are named by their sizes.
std::string canonical_plan_name(const ParallelPlan& plan);

// Checks that the plan divides the model: heads, experts, layers, vocab, intermediate
// sizes. Throws Error naming the plan, the dimension and the sizes.
void validate_plan(const ParallelPlan& plan, const ShardDims& dims);

}  // namespace moeserve::parallel
