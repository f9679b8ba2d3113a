// moeserve plan show: what each rank of a plan owns and how much memory it needs.
#include <fmt/format.h>

#include <cstdio>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "apps/plan_advise.h"
#include "apps/plan_cli.h"
#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "parallel/memory_fit.h"

namespace moeserve::apps {

namespace {

// Weights as deployed: as the checkpoint stores them (stored_bytes()), the unquantized ones in
// bf16, 2 bytes per parameter (the fp32 router is counted at 2 bytes as well, so that for a
// bf16 checkpoint the per-rank sum matches count_parameters x 2 exactly).
constexpr int64_t kDeployedBytes = 2;

std::string range_str(const parallel::Range& r) { return fmt::format("[{},{})", r.begin, r.end); }

void run_plan_show(const PlanCliArgs& args, const std::string& spec) {
  const ModelSource model = open_model(spec);
  const ModelConfig& c = model.config;
  parallel::MemoryFit fit;
  const parallel::ParallelPlan plan = plan_for_model(args, c, kDeployedBytes, &fit);
  const parallel::ShardDims dims = shard_dims(c);
  const ParameterCounts params = count_parameters(c);
  std::printf("plan %s: world %d = pp %d x attn_tp %d x attn_dp %d; MoE ep %d x tp %d\n", plan.name.c_str(),
              plan.world(), plan.pp, plan.attn_tp, plan.attn_dp, plan.moe_ep, plan.moe_tp);
  const std::string stored =
      c.quantization.method == QuantMethod::none
          ? ""
          : fmt::format("; stored {} ({})", parallel::format_bytes(static_cast<double>(stored_model_bytes(c))),
                        c.quantization.describe());
  std::printf("model %s: %lld layers, %lld heads, %lld routed experts, vocab %lld; %s parameters = %s in bf16%s\n",
              spec.c_str(), (long long)c.num_hidden_layers, (long long)c.num_attention_heads,
              (long long)c.n_routed_experts, (long long)c.vocab_size,
              human_count(static_cast<double>(params.total)).c_str(),
              parallel::format_bytes(static_cast<double>(params.total * kDeployedBytes)).c_str(), stored.c_str());
  std::printf("%-4s %-5s %-3s %-3s %-9s %-9s %-11s %-11s %-15s %-12s %-12s %s\n", "rank", "stage", "dp", "tp", "layers",
              "heads", "experts", "expert-cols", "vocab", "weights", "owned", "KV/token");
  int64_t held_total = 0, owned_total = 0;
  for (int r = 0; r < plan.world(); ++r) {
    const parallel::RankShard s = parallel::shard_of(plan, dims, r);
    const RankWeights w = rank_weights(c, plan, r);
    held_total += w.held_bytes;
    owned_total += w.owned_bytes;
    const std::string vocab = s.first_stage || s.last_stage ? range_str(s.vocab) : "-";
    std::printf("%-4d %-5d %-3d %-3d %-9s %-9s %-11s %-11s %-15s %-12s %-12s %s\n", r, s.coord.stage, s.coord.dp_index,
                s.coord.tp_index, range_str(s.layers).c_str(), range_str(s.heads).c_str(), range_str(s.experts).c_str(),
                range_str(s.expert_intermediate).c_str(), vocab.c_str(),
                parallel::format_bytes(static_cast<double>(w.held_bytes)).c_str(),
                parallel::format_bytes(static_cast<double>(w.owned_bytes)).c_str(),
                parallel::format_bytes(static_cast<double>(kv_bytes_per_token(c, plan, r, kDeployedBytes))).c_str());
  }
  std::printf("weights held by all ranks: %s = model %s (owned, %lld bytes) + replicas %s\n",
              parallel::format_bytes(static_cast<double>(held_total)).c_str(),
              parallel::format_bytes(static_cast<double>(owned_total)).c_str(), (long long)owned_total,
              parallel::format_bytes(static_cast<double>(held_total - owned_total)).c_str());
  if (!args.mem_per_rank.empty())
    std::printf(
        "fits --mem-per-rank %s: tightest rank %d needs %s = weights %s + KV cache %s; KV room after weights: "
        "%lld tokens per rank\n",
        parallel::format_bytes(static_cast<double>(parallel::parse_byte_size(args.mem_per_rank, "--mem-per-rank")))
            .c_str(),
        fit.tightest_rank, parallel::format_bytes(static_cast<double>(fit.needed_bytes)).c_str(),
        parallel::format_bytes(static_cast<double>(fit.weight_bytes)).c_str(),
        parallel::format_bytes(static_cast<double>(fit.needed_bytes - fit.weight_bytes)).c_str(),
        (long long)fit.kv_token_room);
}

// Presets up to max_world ranks that the model admits, one per line.
void run_plan_list(const std::string& spec, int max_world) {
  const ModelSource model = open_model(spec);
  const parallel::ShardDims dims = shard_dims(model.config);
  for (const std::string& name : parallel::preset_names(max_world)) {
    const parallel::ParallelPlan plan = parallel::parse_plan(name);
    try {
      parallel::validate_plan(plan, dims);
    } catch (const Error&) {
      continue;
    }
    std::printf("%s\n", name.c_str());
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan", "Parallel plans: show what each rank owns, advise on a hardware profile, calibrate one");
  plan->require_subcommand(1);
  auto args = std::make_shared<PlanCliArgs>();
  auto model = std::make_shared<std::string>("synthetic:tiny");
  CLI::App* show = plan->add_subcommand(
      "show",
      "Print, per rank, the layers, heads, experts, vocab slice, weight bytes (as stored) and KV bytes per token");
  show->add_option("plan", args->preset, "Plan preset (tp8, pp8, ep8, ep8-dp, ep4tp2, tp2pp4, ...), or use the flags");
  show->add_option("--model,-m", *model, "Model spec (synthetic:NAME, a model directory or a config.json)")
      ->capture_default_str();
  add_plan_flags(show, *args);
  show->callback([args, model] { run_plan_show(*args, *model); });

  auto max_world = std::make_shared<int>(8);
  CLI::App* list =
      plan->add_subcommand("list", "List the presets (powers of two up to --max-world ranks) the model admits");
  list->add_option("--model,-m", *model, "Model spec")->capture_default_str();
  list->add_option("--max-world", *max_world, "Largest world size")->capture_default_str();
  list->callback([model, max_world] { run_plan_list(*model, *max_world); });

  add_plan_advise_command(*plan);
  add_plan_calibrate_command(*plan);
}

}  // namespace moeserve::apps
