#include "parallel/plan_parse.h"

#include <cctype>

#include "core/error.h"

namespace moeserve::parallel {

ParallelPlan parse_plan(const std::string& name) {
  ParallelPlan plan;
  plan.name = name;
  if (name == "single") return plan;
  // Grammar: component+ ["-dp"], component = ("tp" | "ep" | "pp") N.
  std::string body = name;
  bool dp_attention = false;
  const std::string dp_suffix = "-dp";
  if (body.size() > dp_suffix.size() && body.compare(body.size() - dp_suffix.size(), dp_suffix.size(), dp_suffix) == 0) {
    dp_attention = true;
    body.resize(body.size() - dp_suffix.size());
  }
  int tp = 0, ep = 0, pp = 0;
  size_t i = 0;
  while (i < body.size()) {
    MS_CHECK(i + 2 < body.size() + 1 && std::isalpha(static_cast<unsigned char>(body[i])),
             "plan '{}': expected tpN, ppN, epN, epN-dp, epAtpB or tpAppB", name);
    const std::string kind = body.substr(i, 2);
    i += 2;
    size_t digits = i;
    while (digits < body.size() && std::isdigit(static_cast<unsigned char>(body[digits]))) ++digits;
    MS_CHECK(digits > i && digits - i <= 4, "plan '{}': '{}' needs a size", name, kind);
    const int size = std::stoi(body.substr(i, digits - i));
    MS_CHECK(size >= 1, "plan '{}': sizes must be at least 1", name);
    i = digits;
    int* slot = kind == "tp" ? &tp : kind == "ep" ? &ep : kind == "pp" ? &pp : nullptr;
    MS_CHECK(slot != nullptr, "plan '{}': unknown component '{}' (use tp, ep, pp)", name, kind);
    MS_CHECK(*slot == 0, "plan '{}': '{}' given twice", name, kind);
    *slot = size;
  }
  MS_CHECK(tp || ep || pp, "plan '{}': empty plan", name);
  plan.pp = pp ? pp : 1;
  const int moe_ep = ep ? ep : 1;
  const int moe_tp = tp && ep ? tp : (ep ? 1 : (tp ? tp : 1));
  const int stage_ranks = moe_ep * moe_tp;
  plan.moe_ep = moe_ep;
  plan.moe_tp = moe_tp;
  if (dp_attention) {
    MS_CHECK(ep > 0, "plan '{}': '-dp' (attention data parallelism) needs expert parallelism (epN-dp)", name);
    plan.attn_dp = stage_ranks;
    plan.attn_tp = 1;
  } else {
    plan.attn_tp = stage_ranks;
    plan.attn_dp = 1;
  }
  return plan;
}

void validate_plan(const ParallelPlan& plan, const ShardDims& dims) {
  const std::string& n = plan.name;
  MS_CHECK(plan.pp >= 1 && plan.attn_tp >= 1 && plan.attn_dp >= 1 && plan.moe_ep >= 1 && plan.moe_tp >= 1,
           "plan '{}': every size must be at least 1", n);
  MS_CHECK(plan.moe_ep * plan.moe_tp == plan.attn_tp * plan.attn_dp,
           "plan '{}': moe_ep x moe_tp ({} x {}) must equal attn_tp x attn_dp ({} x {})", n, plan.moe_ep,
           plan.moe_tp, plan.attn_tp, plan.attn_dp);
  auto divides = [&](const char* what, int64_t total, int parts, const char* by) {
    MS_CHECK(total % parts == 0, "plan '{}': {} {} = {} is not divisible by {} = {}", n, "model", what, total, by,
             parts);
  };
  MS_CHECK(dims.layers >= plan.pp, "plan '{}': {} pipeline stages for {} layers", n, plan.pp, dims.layers);
  divides("attention heads", dims.heads, plan.attn_tp, "attention TP size");
  divides("vocab size", dims.vocab, plan.attn_tp, "attention TP size");
  if (dims.dense_intermediate > 0) divides("intermediate_size", dims.dense_intermediate, plan.attn_tp, "attention TP size");
  if (dims.experts > 0) {
    divides("routed experts", dims.experts, plan.moe_ep, "EP size");
    divides("moe_intermediate_size", dims.expert_intermediate, plan.moe_tp, "MoE TP size");
    if (dims.shared_intermediate > 0)
      divides("shared-expert intermediate size", dims.shared_intermediate, plan.attn_tp, "attention TP size");
  }
}

}  // namespace moeserve::parallel
