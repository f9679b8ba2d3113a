#include "apps/plan_cli.h"

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/memory_fit.h"

namespace moeserve::apps {

void add_reduction_plan_flag(CLI::App* cmd, std::string& reduction_plan) {
  cmd->add_option("--reduction-plan", reduction_plan,
                  "Split every sum as this plan's ranks do (tp8, ep8, ep4tp2, ...; a power of two, one stage) and "
                  "add the parts in a fixed tree: every plan that nests in it gives the same logits to the bit")
      ->capture_default_str();
}

ModelRunOptions run_options_for(const std::string& reduction_plan) {
  ModelRunOptions run;
  try {
    run.reduction_plan = parallel::parse_plan(reduction_plan);
  } catch (const std::exception& e) {
    fail("--reduction-plan {}: {}", reduction_plan, e.what());
  }
  return run;
}

void add_batch_invariant_flag(CLI::App* cmd, bool& batch_invariant) {
  cmd->add_flag("--batch-invariant", batch_invariant,
                "GPU kernels whose result for a row does not depend on its batch (size, other rows, micro-batches, "
                "prefill chunks): with --reduction-plan, identical outputs under any load; slower at large batches");
}

void add_kv_cache_dtype_flag(CLI::App* cmd, std::string& kv_cache_dtype) {
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "Latent cache: auto (bf16) or fp8_e4m3 (e4m3fn codes, scale 1, as SGLang and vLLM without "
                  "calibrated scales; half the bytes of a GPU cache)")
      ->capture_default_str();
}

bool kv_cache_fp8(const std::string& kv_cache_dtype) {
  MS_CHECK(kv_cache_dtype == "auto" || kv_cache_dtype == "bf16" || kv_cache_dtype == "fp8_e4m3",
           "--kv-cache-dtype: '{}' is not auto, bf16 or fp8_e4m3", kv_cache_dtype);
  return kv_cache_dtype == "fp8_e4m3";
}

void add_engine_flags(CLI::App* cmd, EngineCliArgs& args) {
  cmd->add_option("--page-size", args.page_size, "KV cache page size in tokens")->capture_default_str();
  cmd->add_option("--pp-max-micro-batch-size", args.pp_max_micro_batch_size,
                  "Sequences per pipeline micro-batch (0: the step's sequences / pp)")
      ->capture_default_str();
  cmd->add_option("--pp-async-batch-depth", args.pp_async_batch_depth,
                  "Micro-batches a pipeline stage may run ahead of the next, beyond one")
      ->capture_default_str();
  add_reduction_plan_flag(cmd, args.reduction_plan);
  add_batch_invariant_flag(cmd, args.batch_invariant);
  add_kv_cache_dtype_flag(cmd, args.kv_cache_dtype);
}

void add_plan_flags(CLI::App* cmd, PlanCliArgs& args) {
  cmd->add_option("--tp-size,--tensor-parallel-size", args.flags.tp_size,
                  "Ranks per pipeline stage (SGLang --tp-size)");
  cmd->add_option("--ep-size", args.flags.ep_size, "Expert-parallel groups of the MoE layers; MoE TP = tp / ep");
  cmd->add_option("--pp-size,--pipeline-parallel-size", args.flags.pp_size, "Pipeline stages");
  cmd->add_option("--dp-size,--data-parallel-size", args.flags.dp_size,
                  "Attention DP replicas per stage (with --enable-dp-attention; vLLM's --data-parallel-size)");
  cmd->add_flag("--enable-dp-attention", args.flags.enable_dp_attention,
                "Data-parallel attention; routed tokens travel to their experts by all-to-all");
  cmd->add_option("--mem-per-rank", args.mem_per_rank, "Check the plan fits this memory per rank (e.g. 141GiB)");
  cmd->add_option("--context-length,--max-model-len", args.context_length,
                  "Tokens of KV cache per sequence for --mem-per-rank (default: the model's context)");
  cmd->add_option("--max-running-requests,--max-num-seqs", args.max_running_requests,
                  "Sequences served at once for --mem-per-rank (spread over DP replicas)")
      ->capture_default_str();
}

parallel::ParallelPlan plan_for_model(const PlanCliArgs& args, const ModelConfig& config, int64_t bytes_per_element,
                                      parallel::MemoryFit* fit) {
  const parallel::ParallelPlan plan = parallel::resolve_plan(args.preset, args.flags);
  parallel::validate_plan(plan, shard_dims(config));
  if (args.mem_per_rank.empty()) return plan;
  parallel::MemoryBudget budget;
  budget.bytes_per_rank = parallel::parse_byte_size(args.mem_per_rank, "--mem-per-rank");
  budget.context_tokens = args.context_length > 0 ? args.context_length : config.max_position_embeddings;
  budget.max_running_requests = args.max_running_requests;
  std::vector<parallel::RankMemory> ranks;
  for (int r = 0; r < plan.world(); ++r)
    ranks.push_back({rank_weights(config, plan, r, bytes_per_element).held_bytes,
                     kv_bytes_per_token(config, plan, r, args.kv_cache_fp8 ? 1 : bytes_per_element)});
  const parallel::MemoryFit result = parallel::check_memory_fit(plan, ranks, budget);
  if (fit != nullptr) *fit = result;
  return plan;
}

}  // namespace moeserve::apps
