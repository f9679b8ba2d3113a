#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/rope.h"

namespace moeserve {

namespace {
// The repo's copies of the published configs (tests run from the repo root and never read ../shared).
const std::string kConfigs = "tests/data/configs/";

std::string error_of(const nlohmann::json& j) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ModelConfig, ParsesEveryReferenceConfig) {
  const ModelConfig k26 = ModelConfig::from_file(kConfigs + "kimi-k2.6.config.json");
  EXPECT_EQ(k26.model_type, "kimi_k25");
  EXPECT_EQ(k26.tensor_prefix, "language_model.");
  EXPECT_EQ(k26.n_routed_experts, 384);
  EXPECT_EQ(k26.rope_scaling.type, "yarn");
  EXPECT_EQ(k26.rope_scaling.factor, 64.0);
  EXPECT_EQ(k26.quantization.name(), "int4-pack-quantized");
  const ModelConfig k2 = ModelConfig::from_file(kConfigs + "kimi-k2-instruct-0905.config.json");
  EXPECT_EQ(k2.model_type, "kimi_k2");
  EXPECT_EQ(k2.rope_scaling.beta_fast, 1.0);
  const ModelConfig v3 = ModelConfig::from_file(kConfigs + "deepseek-v3.config.json");
  EXPECT_EQ(v3.n_group, 8);
  EXPECT_EQ(v3.topk_group, 4);
  EXPECT_EQ(v3.first_k_dense_replace, 3);
  EXPECT_EQ(v3.quantization.name(), "fp8");
  const ModelConfig moon = ModelConfig::from_file(kConfigs + "moonlight-16b-a3b.config.json");
  EXPECT_EQ(moon.q_lora_rank, 0);
  EXPECT_EQ(moon.rope_scaling.type, "default");
}

TEST(QuantizationConfig, KimiK26IsInt4RoutedExpertsGroup32) {
  const QuantizationConfig q = ModelConfig::from_file(kConfigs + "kimi-k2.6.config.json").quantization;
  EXPECT_EQ(q.method, QuantMethod::int4_pack_quantized);
  EXPECT_EQ(q.group_size, 32);
  EXPECT_EQ(q.coverage, QuantCoverage::routed_experts);
  const std::vector<std::string> ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
  EXPECT_EQ(q.ignore, ignore);
  EXPECT_EQ(q.describe(), "INT4 routed experts, group 32");
  const std::string l = "language_model.model.layers.5.";
  EXPECT_TRUE(q.quantizes(l + "mlp.experts.17.down_proj", true));
  EXPECT_FALSE(q.quantizes(l + "mlp.shared_experts.down_proj", false));
  EXPECT_FALSE(q.quantizes(l + "self_attn.kv_b_proj", false));
  EXPECT_TRUE(q.ignored("language_model.model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(q.ignored("language_model.lm_head"));
  EXPECT_FALSE(q.ignored(l + "mlp.experts.0.gate_proj"));
}

TEST(QuantizationConfig, DeepSeekV3IsFp8Block128) {
  const QuantizationConfig q = ModelConfig::from_file(kConfigs + "deepseek-v3.config.json").quantization;
  EXPECT_EQ(q.method, QuantMethod::fp8_block);
  EXPECT_EQ(q.block_n, 128);
  EXPECT_EQ(q.block_k, 128);
  EXPECT_EQ(q.coverage, QuantCoverage::linears_except_ignored);
  EXPECT_EQ(q.describe(), "FP8 e4m3 linears, block 128x128");
  EXPECT_TRUE(q.quantizes("model.layers.3.self_attn.q_a_proj", false));
  EXPECT_TRUE(q.quantizes("model.layers.3.mlp.shared_experts.up_proj", false));
  EXPECT_FALSE(q.quantizes("lm_head", false));
  const QuantizationConfig none = ModelConfig::from_file(kConfigs + "moonlight-16b-a3b.config.json").quantization;
  EXPECT_EQ(none.method, QuantMethod::none);
  EXPECT_FALSE(none.quantizes("model.layers.3.mlp.experts.0.up_proj", true));
}

TEST(QuantizationConfig, StoredBytesOneFormulaPerFormat) {
  EXPECT_EQ(stored_bytes({2048, 7168}, {QuantMethod::none, 2, 0, 0, 0}), 2048 * 7168 * 2);
  EXPECT_EQ(stored_bytes({2048, 7168}, {QuantMethod::int4_pack_quantized, 2, 32, 0, 0}),
            2048 * 7168 / 2 + 2048 * (7168 / 32) * 2);
  EXPECT_EQ(stored_bytes({7168, 2048}, {QuantMethod::int4_pack_quantized, 2, 128, 0, 0}),
            7168 * 2048 / 2 + 7168 * (2048 / 128) * 2);
  EXPECT_EQ(stored_bytes({576, 7168}, {QuantMethod::fp8_block, 2, 0, 128, 128}), 576 * 7168 + 4 * 5 * 56);
  // The block count rounds up without forming n + block - 1 (which overflowed for huge blocks).
  EXPECT_EQ(stored_bytes({576, 7168}, {QuantMethod::fp8_block, 2, 0, INT64_MAX, INT64_MAX}), 576 * 7168 + 4);
}

namespace {
// A K2.6-style config (nested under text_config) whose quantization_config is edited by `edit`.
std::string quant_error(const std::function<void(nlohmann::json&)>& edit, bool fp8 = false) {
  std::ifstream in(kConfigs + (fp8 ? "deepseek-v3.config.json" : "kimi-k2.6.config.json"));
  nlohmann::json root = nlohmann::json::parse(in);
  nlohmann::json& q = root.at("quantization_config");
  edit(q);
  if (!fp8) {  // nested under text_config: the path names it
    root["text_config"]["quantization_config"] = q;
    root.erase("quantization_config");
  }
  return error_of(root);
}
}  // namespace

TEST(QuantizationConfig, NestedUnderTextConfigParses) {
  std::ifstream in(kConfigs + "kimi-k2.6.config.json");
  nlohmann::json root = nlohmann::json::parse(in);
  root["text_config"]["quantization_config"] = root.at("quantization_config");
  root.erase("quantization_config");
  const ModelConfig c = ModelConfig::from_json(root, "config.json");
  EXPECT_EQ(c.quantization.describe(), "INT4 routed experts, group 32");
}

TEST(QuantizationConfig, UnsupportedFieldsAreNamed) {
  using J = nlohmann::json;
  const std::string w = "text_config.quantization_config.config_groups.group_0.weights.";
  const std::string g = "text_config.quantization_config.config_groups.group_0.";
  const std::pair<std::function<void(J&)>, std::string> int4_cases[] = {
      {[](J& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; }, "'" + w + "symmetric' is false"},
      {[](J& q) {
         q["config_groups"]["group_0"]["input_activations"] = J{{"num_bits", 8}};
       },
       "'" + g + "input_activations' is set"},
      {[](J& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; }, "'" + w + "num_bits' is 8"},
      {[](J& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "channel"; },
       "'" + w + "strategy' is 'channel'"},
      {[](J& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 48; }, "'" + w + "group_size' is 48"},
      {[](J& q) { q["format"] = "float-quantized"; }, "'text_config.quantization_config.format' is 'float-quantized'"},
      {[](J& q) { q["quant_method"] = "awq"; }, "'text_config.quantization_config.quant_method' is 'awq'"},
  };
  for (const auto& [edit, message] : int4_cases)
    EXPECT_NE(quant_error(edit).find(message), std::string::npos) << quant_error(edit) << " / " << message;
  const std::pair<std::function<void(J&)>, std::string> fp8_cases[] = {
      {[](J& q) { q["weight_block_size"] = J::array({128}); }, "'quantization_config.weight_block_size' is [128]"},
      {[](J& q) {
         q["weight_block_size"] = J::array({128, 0});
       },
       "'quantization_config.weight_block_size' is [128,0]"},
      // Found by fuzz/config_fuzz: a block of INT64_MAX overflowed stored_bytes' ceil_div.
      {[](J& q) {
         q["weight_block_size"] = J::array({INT64_MAX, 128});
       },
       "'quantization_config.weight_block_size' is [9223372036854775807,128]; expected two integers [n, k] in [1, "
       "65536]"},
      {[](J& q) { q["activation_scheme"] = "static"; }, "'quantization_config.activation_scheme' is 'static'"},
  };
  for (const auto& [edit, message] : fp8_cases)
    EXPECT_NE(quant_error(edit, true).find(message), std::string::npos) << quant_error(edit, true) << " / " << message;
  EXPECT_EQ(quant_error([](J&) {}), "");
}

TEST(ModelConfig, AttentionScaleIncludesYarnMscale) {
  const ModelConfig v3 = ModelConfig::from_file(kConfigs + "deepseek-v3.config.json");
  const double mscale = 0.1 * 1.0 * std::log(40.0) + 1.0;
  EXPECT_NEAR(v3.attention_scale(), mscale * mscale / std::sqrt(192.0), 1e-12);
  EXPECT_DOUBLE_EQ(v3.rope_attention_factor(), 1.0);  // mscale == mscale_all_dim
}

TEST(ModelConfig, ErrorsNameTheField) {
  nlohmann::json j = nlohmann::json::parse(R"({"model_type": "deepseek_v3", "vocab_size": 10})");
  EXPECT_NE(error_of(j).find("missing field 'hidden_size'"), std::string::npos) << error_of(j);
  j = {{"model_type", "mistral"}};
  EXPECT_NE(error_of(j).find("'model_type' is 'mistral'"), std::string::npos);
  j = {{"model_type", "kimi_k25"}};
  EXPECT_NE(error_of(j).find("text_config"), std::string::npos);
}

// Found by fuzz/config_fuzz: every field within its bound, yet the parameter count overflowed
// int64 in count_parameters (UBSan: signed overflow), which `inspect` and `plan show` call.
TEST(ModelConfig, ParameterCountsThatOverflowAreRefused) {
  std::ifstream in(kConfigs + "deepseek-v3.config.json");
  const nlohmann::json published = nlohmann::json::parse(in);
  nlohmann::json j = published;
  j["hidden_size"] = 1 << 20;
  j["moe_intermediate_size"] = 1 << 20;
  j["n_routed_experts"] = 1 << 16;
  j["num_hidden_layers"] = 1 << 12;  // the most layers accepted
  j["first_k_dense_replace"] = 0;
  EXPECT_NE(error_of(j).find("more parameters than 64 bits count"), std::string::npos) << error_of(j);
  j["num_hidden_layers"] = 1 << 10;  // about 3 x 2^60 parameters: counted, but over the bound
  j["n_routed_experts"] = 1 << 10;
  EXPECT_NE(error_of(j).find("more than the supported 2^50"), std::string::npos) << error_of(j);
  for (const char* field : {"hidden_size", "moe_intermediate_size", "n_routed_experts", "num_hidden_layers"})
    j[field] = published[field];
  EXPECT_EQ(error_of(j), "");  // DeepSeek-V3's own sizes again
}

// Found by fuzz/safetensors_fuzz: a number beyond the double range is nlohmann's out_of_range,
// not a parse_error, and escaped the readers of config.json (and safetensors headers, tokenizer
// files) as an exception that named no file.
TEST(ModelConfig, NumberBeyondDoubleIsAnErrorNamingTheFile) {
  const std::string path = testing::TempDir() + "config_number_beyond_double.json";
  std::ofstream(path) << R"({"model_type": "deepseek_v3", "vocab_size": 1e999})";
  try {
    ModelConfig::from_file(path);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": invalid JSON"), std::string::npos) << e.what();
  }
}

TEST(Rope, DefaultAndYarnFrequencies) {
  ModelConfig c;
  c.qk_rope_head_dim = 64;
  c.rope_theta = 10000.0;
  auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[31], std::pow(10000.0, -62.0 / 64.0), 1e-9);
  // YaRN: high frequencies (short wavelengths) are kept, low ones divided by the factor.
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  auto y = rope_inv_freq(c);
  EXPECT_FLOAT_EQ(y[0], f[0]);
  EXPECT_NEAR(y[31], f[31] / 40.0f, 1e-9);
}

}  // namespace moeserve
