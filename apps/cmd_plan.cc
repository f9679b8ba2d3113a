// moeserve plan show: what each rank of a plan owns.
#include <cstdio>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"

namespace moeserve::apps {

namespace {

parallel::ShardDims dims_of(const ModelConfig& c) {
  parallel::ShardDims d;
  d.layers = c.num_hidden_layers;
  d.heads = c.num_attention_heads;
  d.vocab = c.vocab_size;
  d.dense_intermediate = c.intermediate_size;
  d.shared_intermediate = c.shared_intermediate_size();
  d.experts = c.n_routed_experts;
  d.expert_intermediate = c.moe_intermediate_size;
  return d;
}

void run_plan_show(const std::string& plan_name, const std::string& spec) {
  const ModelSource model = open_model(spec);
  const parallel::ParallelPlan plan = parallel::parse_plan(plan_name);
  const parallel::ShardDims dims = dims_of(model.config);
  parallel::validate_plan(plan, dims);
  std::printf("plan %s: world %d = pp %d x attn_tp %d x attn_dp %d; MoE ep %d x tp %d\n", plan.name.c_str(),
              plan.world(), plan.pp, plan.attn_tp, plan.attn_dp, plan.moe_ep, plan.moe_tp);
  std::printf("%-5s %-6s %-11s %-11s %-13s %-11s\n", "rank", "stage", "layers", "heads", "experts", "vocab");
  for (int r = 0; r < plan.world(); ++r) {
    const parallel::RankShard s = parallel::shard_of(plan, dims, r);
    std::printf("%-5d %-6d [%lld,%lld)%*s [%lld,%lld)%*s [%lld,%lld)%*s [%lld,%lld)\n", r, s.coord.stage,
                (long long)s.layers.begin, (long long)s.layers.end, 1, "", (long long)s.heads.begin,
                (long long)s.heads.end, 1, "", (long long)s.experts.begin, (long long)s.experts.end, 1, "",
                (long long)s.vocab.begin, (long long)s.vocab.end);
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  CLI::App* plan = app.add_subcommand("plan", "Parallel plans: show what each rank owns");
  plan->require_subcommand(1);
  auto name = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>("synthetic:tiny");
  CLI::App* show = plan->add_subcommand("show", "Print, per rank, the layers, heads, experts and vocab slice");
  show->add_option("plan", *name, "Plan preset (tp8, pp8, ep8, ep8-dp, ep4tp2, tp2pp4, ...)")->required();
  show->add_option("--model,-m", *model, "Model spec")->capture_default_str();
  show->callback([name, model] { run_plan_show(*name, *model); });
}

}  // namespace moeserve::apps
