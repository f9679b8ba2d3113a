// moeserve inspect: config summary, parameter counts and bytes per dtype.
#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"

namespace moeserve::apps {

namespace {

void run_inspect(const std::string& spec) {
  const ModelSource model = open_model(spec);
  const ModelConfig& c = model.config;
  const ParameterCounts p = count_parameters(c);
  std::printf("model            %s\n", spec.c_str());
  std::printf("model_type       %s%s\n", c.model_type.c_str(),
              c.tensor_prefix.empty() ? "" : fmt::format(" (tensors prefixed '{}')", c.tensor_prefix).c_str());
  std::printf("layers           %lld (%lld dense, %lld MoE)\n", (long long)c.num_hidden_layers,
              (long long)c.first_k_dense_replace, (long long)c.num_moe_layers());
  std::printf("hidden           %lld, vocab %lld, heads %lld\n", (long long)c.hidden_size, (long long)c.vocab_size,
              (long long)c.num_attention_heads);
  std::printf("MLA              q_lora %lld, kv_lora %lld, qk_nope %lld, qk_rope %lld, v %lld\n",
              (long long)c.q_lora_rank, (long long)c.kv_lora_rank, (long long)c.qk_nope_head_dim,
              (long long)c.qk_rope_head_dim, (long long)c.v_head_dim);
  std::printf(
      "MoE              %lld routed experts (top-%lld, %lld groups, top-%lld groups), %lld shared, "
      "expert inter %lld\n",
      (long long)c.n_routed_experts, (long long)c.num_experts_per_tok, (long long)c.n_group, (long long)c.topk_group,
      (long long)c.n_shared_experts, (long long)c.moe_intermediate_size);
  std::printf("RoPE             theta %g, %s", c.rope_theta, c.rope_scaling.type.c_str());
  if (c.rope_scaling.type == "yarn")
    std::printf(" (factor %g, original context %lld)", c.rope_scaling.factor,
                (long long)c.rope_scaling.original_max_position_embeddings);
  std::printf(", context %lld\n", (long long)c.max_position_embeddings);
  if (c.quantization.method != QuantMethod::none)
    std::printf("quantization     %s (%s)\n", c.quantization.name().c_str(), c.quantization.describe().c_str());
  std::printf("parameters       %s total, %s active per token (%lld / %lld)\n", human_count(p.total).c_str(),
              human_count(p.active_per_token).c_str(), (long long)p.total, (long long)p.active_per_token);
  std::printf("bf16 weights     %s\n", human_bytes(2.0 * p.total).c_str());
  if (c.quantization.method != QuantMethod::none)
    std::printf("checkpoint       stored %s (%s)\n", human_bytes(static_cast<double>(stored_model_bytes(c))).c_str(),
                c.quantization.describe().c_str());
  if (model.checkpoint) {
    std::map<std::string, std::pair<int64_t, double>> by_dtype;  // dtype -> (tensors, bytes)
    for (const auto& name : model.checkpoint->tensor_names()) {
      const TensorInfo& info = model.checkpoint->info(name);
      auto& entry = by_dtype[std::string(dtype_name(info.dtype))];
      ++entry.first;
      entry.second += static_cast<double>(info.data_end - info.data_begin);
    }
    for (const auto& [dtype, entry] : by_dtype)
      std::printf("checkpoint %-6s%lld tensors, %s\n", dtype.c_str(), (long long)entry.first,
                  human_bytes(entry.second).c_str());
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto spec = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a model's architecture, parameter counts and bytes");
  cmd->add_option("model", *spec, "synthetic:NAME, a model directory, or a bare config.json")->required();
  cmd->callback([spec] { run_inspect(*spec); });
}

}  // namespace moeserve::apps
