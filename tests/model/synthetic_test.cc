#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/model_source.h"

namespace moeserve {

TEST(Synthetic, WeightsAreDeterministicAndSliceConsistent) {
  const ModelSource model = open_model("synthetic:tiny");
  auto a = model.weights();
  auto b = model.weights();
  const std::string name = "model.layers.1.mlp.experts.3.up_proj.weight";
  const Shape shape{32, 64};
  Tensor full = a->read(name, shape);
  Tensor again = b->read(name, shape);
  ASSERT_EQ(std::memcmp(full.raw(), again.raw(), full.nbytes()), 0);
  Tensor slice = a->read(name, shape, {8, 16}, {10, 20});
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 10; ++c) EXPECT_EQ(slice.f32()[r * 10 + c], full.f32()[(8 + r) * 64 + 10 + c]);
  EXPECT_EQ(a->touched().count(name), 1u);
}

TEST(Synthetic, ScalesKeepActivationsSane) {
  const ModelSource model = open_model("synthetic:small:seed=7");
  auto w = model.weights();
  Tensor proj = w->read("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {144, 256});
  double sum_sq = 0;
  for (int64_t i = 0; i < proj.numel(); ++i) sum_sq += proj.f32()[i] * proj.f32()[i];
  // Uniform(-a, a) with a = sqrt(3 / fan_in): row norm^2 ~ 1.
  EXPECT_NEAR(sum_sq / 144.0, 1.0, 0.1);
  Tensor norm = w->read("model.norm.weight", {256});
  for (int64_t i = 0; i < 256; ++i) EXPECT_NEAR(norm.f32()[i], 1.0f, 0.1f + 1e-6f);
}

TEST(Synthetic, PresetsAndOptions) {
  EXPECT_EQ(open_model("synthetic:kimi-k2.6:layers=3").config.num_hidden_layers, 3);
  EXPECT_EQ(open_model("synthetic:deepseek-v3:layers=2").config.first_k_dense_replace, 2);
  EXPECT_THROW(open_model("synthetic:nope"), Error);
  EXPECT_THROW(open_model("synthetic:tiny:layers=x"), Error);
  EXPECT_THROW(open_model("synthetic:tiny:depth=3"), Error);
  try {
    open_model("/no/such/dir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/dir"), std::string::npos);
  }
}

}  // namespace moeserve
