#include "model/model_source.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve {

namespace {

// Small, fast synthetic models. Dimensions are chosen so that every plan preset up to 8
// ranks divides them (8 heads, 16 experts, 8 layers).
ModelConfig tiny_config() {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.n_routed_experts = 16;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 1;
  c.routed_scaling_factor = 2.5;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  return c;
}

ModelConfig small_config() {
  ModelConfig c = tiny_config();
  c.vocab_size = 4096;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 16;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 32;
  c.n_shared_experts = 2;
  c.num_experts_per_tok = 6;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 2;
  c.max_position_embeddings = 16384;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  return c;
}

// Shapes of the published models (../shared/reference/configs), checked by a test.
ModelConfig deepseek_family(int64_t vocab, int64_t hidden, int64_t inter, int64_t moe_inter, int64_t layers,
                            int64_t heads, int64_t q_lora, int64_t experts, int64_t shared, int64_t topk,
                            int64_t n_group, int64_t topk_group, int64_t dense, double scaling) {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.moe_intermediate_size = moe_inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = experts;
  c.n_shared_experts = shared;
  c.num_experts_per_tok = topk;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.first_k_dense_replace = dense;
  c.routed_scaling_factor = scaling;
  c.rms_norm_eps = 1e-6;
  return c;
}

ModelConfig with_yarn(ModelConfig c, double theta, double factor, double beta_fast, int64_t max_pos) {
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = factor;
  c.rope_scaling.beta_fast = beta_fast;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  return c;
}

}  // namespace

QuantizationConfig published_quantization(const std::string& name, const std::string& tensor_prefix) {
  nlohmann::json q;
  if (name == "kimi-k2.6") {
    q = {{"quant_method", "compressed-tensors"},
         {"format", "pack-quantized"},
         {"config_groups",
          {{"group_0",
            {{"targets", {"Linear"}},
             {"weights",
              {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32}}}}}}},
         {"ignore",
          {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"}}};
  } else if (name == "deepseek-v3") {
    q = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  } else {
    return {};
  }
  return parse_quantization_config(q, "synthetic:" + name, "quantization_config.", tensor_prefix);
}

std::vector<std::string> synthetic_preset_names() {
  return {"tiny", "small", "kimi-k2.6", "kimi-k2", "deepseek-v3", "moonlight"};
}

ModelConfig synthetic_config(const std::string& name, int64_t layers, SyntheticDtype dtype) {
  ModelConfig c;
  if (name == "tiny") {
    c = tiny_config();
  } else if (name == "small") {
    c = small_config();
  } else if (name == "kimi-k2.6") {
    c = with_yarn(deepseek_family(163840, 7168, 18432, 2048, 61, 64, 1536, 384, 1, 8, 1, 1, 1, 2.827), 50000.0, 64.0,
                  32.0, 262144);
    c.model_type = "kimi_k2";
    c.rms_norm_eps = 1e-5;
  } else if (name == "kimi-k2") {
    c = with_yarn(deepseek_family(163840, 7168, 18432, 2048, 61, 64, 1536, 384, 1, 8, 1, 1, 1, 2.827), 50000.0, 64.0,
                  1.0, 262144);
    c.model_type = "kimi_k2";
    c.rms_norm_eps = 1e-6;
  } else if (name == "deepseek-v3") {
    c = with_yarn(deepseek_family(129280, 7168, 18432, 2048, 61, 128, 1536, 256, 1, 8, 8, 4, 3, 2.5), 10000.0, 40.0,
                  32.0, 163840);
  } else if (name == "moonlight") {
    c = deepseek_family(163840, 2048, 11264, 1408, 27, 16, 0, 64, 2, 6, 1, 1, 1, 2.446);
    c.rope_theta = 50000.0;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5;
  } else {
    std::string known;
    for (const auto& n : synthetic_preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("unknown synthetic model '{}'; known: {}", name, known);
  }
  if (dtype == SyntheticDtype::published) c.quantization = published_quantization(name, c.tensor_prefix);
  if (layers > 0) {
    c.num_hidden_layers = layers;
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, layers);
  }
  c.validate();
  return c;
}

std::unique_ptr<WeightSource> ModelSource::weights() const {
  if (synthetic) return std::make_unique<SyntheticWeightSource>(config, seed);
  MS_CHECK(checkpoint != nullptr, "{}: a bare config.json has no weights", spec);
  return std::make_unique<CheckpointWeightSource>(checkpoint);
}

ModelSource open_model(const std::string& spec) {
  namespace fs = std::filesystem;
  ModelSource source;
  source.spec = spec;
  const std::string prefix = "synthetic:";
  if (spec.rfind(prefix, 0) == 0) {
    // synthetic:NAME[:layers=N][:seed=S][:dtype=bf16]
    std::string rest = spec.substr(prefix.size());
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t colon; (colon = rest.find(':', start)) != std::string::npos; start = colon + 1)
      parts.push_back(rest.substr(start, colon - start));
    parts.push_back(rest.substr(start));
    int64_t layers = 0;
    SyntheticDtype dtype = SyntheticDtype::published;
    source.seed = 0;
    for (size_t i = 1; i < parts.size(); ++i) {
      const auto eq = parts[i].find('=');
      const std::string key = parts[i].substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
      try {
        if (key == "layers") {
          layers = std::stoll(value);
          MS_CHECK(layers > 0, "model '{}': layers must be positive", spec);
        } else if (key == "seed") {
          source.seed = std::stoull(value);
        } else if (key == "dtype") {
          MS_CHECK(value == "bf16", "model '{}': option 'dtype' is '{}'; supported: bf16 (every weight unquantized)",
                   spec, value);
          dtype = SyntheticDtype::bf16;
        } else {
          fail("model '{}': unknown option '{}' (use layers=N, seed=S or dtype=bf16)", spec, key);
        }
      } catch (const std::logic_error&) {
        fail("model '{}': option '{}' needs an integer value, got '{}'", spec, key, value);
      }
    }
    source.config = synthetic_config(parts[0], layers, dtype);
    source.synthetic = true;
    return source;
  }
  const fs::path path(spec);
  if (fs::is_regular_file(path)) {
    source.config = ModelConfig::from_file(spec);
    return source;
  }
  MS_CHECK(fs::is_directory(path), "model '{}': not a directory, a config.json file or synthetic:NAME", spec);
  source.directory = spec;
  source.config = ModelConfig::from_file((path / "config.json").string());
  source.checkpoint = Checkpoint::open(spec);
  return source;
}

}  // namespace moeserve
