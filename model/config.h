// ModelConfig: the DeepSeek-V3 architecture as the forward needs it, parsed from a Hugging
// Face config.json (model_type deepseek_v3, kimi_k2, or kimi_k25 with the language model
// nested under text_config) and validated field by field.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/quantization.h"

namespace moeserve {

struct RopeScaling {
  std::string type = "default";  // "default" or "yarn"
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: absent
  double mscale_all_dim = 0.0;    // 0: absent
  double attention_factor = 0.0;  // 0: derived from factor and mscales
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;
};

struct ModelConfig {
  std::string model_type;     // deepseek_v3 | kimi_k2 | kimi_k25
  std::string tensor_prefix;  // "" or "language_model." (K2.5-style wrappers)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP (first_k_dense_replace layers)
  int64_t moe_intermediate_size = 0;  // per routed expert; shared = this * n_shared_experts
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA (q_proj directly)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool rope_interleave = true;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  std::string torch_dtype = "bfloat16";
  QuantizationConfig quantization;  // quantization_config (top level or under text_config)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t num_moe_layers() const { return num_hidden_layers - first_k_dense_replace; }
  int64_t shared_intermediate_size() const { return moe_intermediate_size * n_shared_experts; }
  // Softmax scale of MLA, including YaRN's mscale_all_dim correction.
  double attention_scale() const;
  // Multiplier of RoPE's cos/sin (YaRN attention factor; 1 without scaling).
  double rope_attention_factor() const;

  // Throws Error naming the first inconsistent field.
  void validate() const;

  // Parses a config.json text; `source` names the file in errors.
  static ModelConfig from_json(const nlohmann::json& root, const std::string& source);
  static ModelConfig from_file(const std::string& path);
};

// The most parameters a config may describe (ModelConfig::validate).
constexpr int64_t kMaxParameters = int64_t{1} << 50;

// Parameter counts computed from the architecture; an Error when they overflow int64 (a config
// that validate() accepted never does).
struct ParameterCounts {
  int64_t total = 0;
  int64_t active_per_token = 0;  // embeddings + attention + dense + shared + top-k experts + head
  int64_t routed_experts = 0;    // all routed expert weights
};
ParameterCounts count_parameters(const ModelConfig& config);

}  // namespace moeserve
