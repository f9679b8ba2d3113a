#include "parallel/plan_parse.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace moeserve::parallel {

ParallelPlan parse_plan(const std::string& name) {
  ParallelPlan plan;
  plan.name = name;
  if (name == "single") return plan;
  const char* grammar = "expected 'single' or components tpN, epN, ppN (each at most once) with an optional -dp";
  std::string body = name;
  bool dp_attention = false;
  const std::string dp_suffix = "-dp";
  if (body.size() > dp_suffix.size() &&
      body.compare(body.size() - dp_suffix.size(), dp_suffix.size(), dp_suffix) == 0) {
    dp_attention = true;
    body.resize(body.size() - dp_suffix.size());
  }
  MS_CHECK(!body.empty(), "plan '{}': empty plan; {}", name, grammar);
  int tp = 0, ep = 0, pp = 0;
  size_t i = 0;
  while (i < body.size()) {
    MS_CHECK(i + 2 <= body.size() && std::isalpha(static_cast<unsigned char>(body[i])) &&
                 std::isalpha(static_cast<unsigned char>(body[i + 1])),
             "plan '{}': unexpected '{}' at offset {}; {}", name, body.substr(i), i, grammar);
    const std::string kind = body.substr(i, 2);
    int* slot = kind == "tp" ? &tp : kind == "ep" ? &ep : kind == "pp" ? &pp : nullptr;
    MS_CHECK(slot != nullptr, "plan '{}': unknown component '{}' (use tp, ep, pp)", name, kind);
    i += 2;
    size_t digits = i;
    while (digits < body.size() && std::isdigit(static_cast<unsigned char>(body[digits]))) ++digits;
    MS_CHECK(digits > i, "plan '{}': '{}' needs a size, as in {}8", name, kind, kind);
    MS_CHECK(digits - i <= 4, "plan '{}': size '{}' of '{}' is too large", name, body.substr(i, digits - i), kind);
    const int size = std::stoi(body.substr(i, digits - i));
    MS_CHECK(size >= 1, "plan '{}': size of '{}' must be at least 1", name, kind);
    MS_CHECK(*slot == 0, "plan '{}': '{}' given twice", name, kind);
    *slot = size;
    i = digits;
  }
  plan.pp = pp ? pp : 1;
  plan.moe_ep = ep ? ep : 1;
  plan.moe_tp = tp ? tp : 1;
  const int stage_ranks = plan.moe_ep * plan.moe_tp;
  if (dp_attention) {
    MS_CHECK(ep > 0, "plan '{}': '-dp' (attention data parallelism) needs expert parallelism, as in ep8-dp", name);
    plan.attn_dp = stage_ranks;
    plan.attn_tp = 1;
  } else {
    plan.attn_tp = stage_ranks;
    plan.attn_dp = 1;
  }
  return plan;
}

ParallelPlan plan_from_flags(const PlanFlags& f) {
  auto positive = [](const char* flag, int value) {
    MS_CHECK(value >= 0, "{} {}: sizes must be at least 1", flag, value);
  };
  positive("--tp-size", f.tp_size);
  positive("--ep-size", f.ep_size);
  positive("--pp-size", f.pp_size);
  positive("--dp-size", f.dp_size);
  const int tp = f.tp_size ? f.tp_size : 1;
  const int ep = f.ep_size ? f.ep_size : 1;
  ParallelPlan plan;
  plan.pp = f.pp_size ? f.pp_size : 1;
  MS_CHECK(tp % ep == 0, "--ep-size {} does not divide --tp-size {} (the ranks of a pipeline stage)", ep, tp);
  plan.moe_ep = ep;
  plan.moe_tp = tp / ep;
  if (f.enable_dp_attention) {
    const int dp = f.dp_size ? f.dp_size : tp;
    MS_CHECK(dp >= 2,
             "--enable-dp-attention with --dp-size {} (--tp-size {}) leaves one attention replica; drop the "
             "flag for attention TP or raise --dp-size",
             dp, tp);
    MS_CHECK(tp % dp == 0, "--dp-size {} does not divide --tp-size {} (the ranks of a pipeline stage)", dp, tp);
    plan.attn_dp = dp;
    plan.attn_tp = tp / dp;
  } else {
    MS_CHECK(f.dp_size <= 1,
             "--dp-size {} without --enable-dp-attention: replicating whole engines is not supported; "
             "add --enable-dp-attention for data-parallel attention",
             f.dp_size);
    plan.attn_tp = tp;
    plan.attn_dp = 1;
  }
  plan.name = canonical_plan_name(plan);
  return plan;
}

ParallelPlan resolve_plan(const std::string& preset, const PlanFlags& flags) {
  if (!preset.empty() && flags.any())
    fail(
        "--plan {} conflicts with --tp-size/--ep-size/--pp-size/--dp-size/--enable-dp-attention: give one or the "
        "other",
        preset);
  if (!preset.empty()) return parse_plan(preset);
  if (flags.any()) return plan_from_flags(flags);
  return parse_plan("single");
}

std::vector<std::string> preset_names(int max_world) {
  std::vector<std::string> names = {"single"};
  std::vector<int> sizes = {0};  // 0: component absent
  for (int n = 2; n <= max_world; n *= 2) sizes.push_back(n);
  for (int ep : sizes)
    for (int tp : sizes)
      for (int pp : sizes) {
        const int world = std::max(ep, 1) * std::max(tp, 1) * std::max(pp, 1);
        if (world == 1 || world > max_world) continue;
        std::string name;
        if (ep) name += fmt::format("ep{}", ep);
        if (tp) name += fmt::format("tp{}", tp);
        if (pp) name += fmt::format("pp{}", pp);
        names.push_back(name);
        if (ep) names.push_back(name + "-dp");
      }
  return names;
}

std::string canonical_plan_name(const ParallelPlan& p) {
  const int stage = p.attn_tp * p.attn_dp;
  if ((p.attn_tp > 1 && p.attn_dp > 1) || (p.attn_dp > 1 && p.moe_ep == 1))
    return fmt::format("pp{}.attn_tp{}.attn_dp{}.moe_ep{}.moe_tp{}", p.pp, p.attn_tp, p.attn_dp, p.moe_ep, p.moe_tp);
  std::string name;
  if (p.moe_ep > 1) name += fmt::format("ep{}", p.moe_ep);
  if (p.moe_tp > 1 || (stage > 1 && p.moe_ep == 1)) name += fmt::format("tp{}", p.moe_tp);
  if (p.pp > 1) name += fmt::format("pp{}", p.pp);
  if (name.empty()) return "single";
  return p.attn_dp > 1 ? name + "-dp" : name;
}

void validate_plan(const ParallelPlan& plan, const ShardDims& dims) {
  const std::string& n = plan.name;
  MS_CHECK(plan.pp >= 1 && plan.attn_tp >= 1 && plan.attn_dp >= 1 && plan.moe_ep >= 1 && plan.moe_tp >= 1,
           "plan '{}': every size must be at least 1", n);
  MS_CHECK(plan.moe_ep * plan.moe_tp == plan.attn_tp * plan.attn_dp,
           "plan '{}': moe_ep x moe_tp ({} x {}) must equal attn_tp x attn_dp ({} x {}), the ranks of a stage", n,
           plan.moe_ep, plan.moe_tp, plan.attn_tp, plan.attn_dp);
  auto divides = [&](const char* what, int64_t total, int parts, const char* by) {
    MS_CHECK(total % parts == 0, "plan '{}': model {} = {} is not divisible by {} = {}", n, what, total, by, parts);
  };
  MS_CHECK(dims.layers >= plan.pp, "plan '{}': {} pipeline stages for {} layers (each stage needs a layer)", n, plan.pp,
           dims.layers);
  divides("attention heads", dims.heads, plan.attn_tp, "attention TP size");
  divides("vocab size", dims.vocab, plan.attn_tp, "attention TP size");
  if (dims.dense_intermediate > 0)
    divides("intermediate_size", dims.dense_intermediate, plan.attn_tp, "attention TP size");
  if (dims.experts > 0) {
    divides("routed experts", dims.experts, plan.moe_ep, "EP size");
    divides("moe_intermediate_size", dims.expert_intermediate, plan.moe_tp, "MoE TP size");
    if (dims.shared_intermediate > 0)
      divides("shared-expert intermediate size", dims.shared_intermediate, plan.attn_tp, "attention TP size");
  }
}

}  // namespace moeserve::parallel
