#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
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
  EXPECT_EQ(k26.quantization, "int4-pack-quantized");
  const ModelConfig k2 = ModelConfig::from_file(kConfigs + "kimi-k2-instruct-0905.config.json");
  EXPECT_EQ(k2.model_type, "kimi_k2");
  EXPECT_EQ(k2.rope_scaling.beta_fast, 1.0);
  const ModelConfig v3 = ModelConfig::from_file(kConfigs + "deepseek-v3.config.json");
  EXPECT_EQ(v3.n_group, 8);
  EXPECT_EQ(v3.topk_group, 4);
  EXPECT_EQ(v3.first_k_dense_replace, 3);
  EXPECT_EQ(v3.quantization, "fp8");
  const ModelConfig moon = ModelConfig::from_file(kConfigs + "moonlight-16b-a3b.config.json");
  EXPECT_EQ(moon.q_lora_rank, 0);
  EXPECT_EQ(moon.rope_scaling.type, "default");
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
