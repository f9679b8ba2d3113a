// The CPU backend's quantized linear and moe_experts (ops/quant_layout.h): each equals the
// unquantized op on the weight's exact fp32 values, computed in the test from the format
// definitions, to the bit, under both numerics (cpu and cpu-bf16). Shape errors name the field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "tests/backend/quant_test_weights.h"

namespace moeserve {
namespace {

using cpu::CpuNumerics;
using test::QuantWeight;

std::vector<float> random_bf16(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = round_to_bf16(uniform_pm1(seed, i));
  return v;
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) count += !(a[i] == b[i]);
  return count;
}

struct Layouts {
  const char* name;
  ops::QuantLayout layout;
};
const Layouts kLayouts[] = {{"int4 g32", test::int4_layout(32)},
                            {"int4 g64", test::int4_layout(64)},
                            {"int4 g128", test::int4_layout(128)},
                            {"fp8 128x128", test::fp8_layout()},
                            {"fp8 32x64", test::fp8_layout(32, 64)}};

class CpuQuant : public ::testing::TestWithParam<CpuNumerics> {
 protected:
  std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend(GetParam());
};

TEST_P(CpuQuant, LinearEqualsTheUnquantizedLinearOnTheDequantizedWeight) {
  // 200 x 384: fp8 blocks of 128 leave partial blocks in both directions (ceil scales).
  const int64_t rows = 3, in = 384, out = 200;
  const auto x = random_bf16(rows * in, 5);
  for (const Layouts& l : kLayouts) {
    const QuantWeight w = test::make_quant_weight(out, in, l.layout, 11);
    for (bool y_f32 : {false, true}) {
      std::vector<float> got(rows * out, 0.25f), want(rows * out, 0.25f);
      ops::LinearParams p{x.data(), w.packed.data(), got.data(), rows, in, out, in, out, y_f32, y_f32};
      p.weight_quant = l.layout;
      backend->linear(p);
      ops::LinearParams ref{x.data(), w.values.data(), want.data(), rows, in, out, in, out, y_f32, y_f32};
      backend->linear(ref);
      EXPECT_EQ(differing(got, want), 0) << l.name << (y_f32 ? " fp32 accumulate" : "");
      // Not a comparison of two zero results: the weight's values reach the output.
      EXPECT_NE(got[0], 0.25f) << l.name;
    }
  }
}

TEST_P(CpuQuant, ExpertsEqualTheUnquantizedExpertsOnTheDequantizedWeights) {
  // Experts [2, 6) of 6 on this rank; token pairs routed to experts 0 and 1 are not ours.
  const int64_t tokens = 5, top_k = 3, hidden = 256, inter = 128, begin = 2, end = 6;
  const auto x = random_bf16(tokens * hidden, 7);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    ids[i] = static_cast<int32_t>(random_word(8, i) % end);
    weights[i] = 0.2f + 0.5f * uniform01(9, i);
  }
  for (const Layouts& l : kLayouts) {
    std::vector<QuantWeight> w13, w2;
    std::vector<const void*> packed13, packed2, values13, values2;
    for (int64_t e = begin; e < end; ++e) {
      w13.push_back(test::make_quant_weight(2 * inter, hidden, l.layout, 100 + e, 0.05f));
      w2.push_back(test::make_quant_weight(hidden, inter, l.layout, 200 + e, 0.05f));
    }
    for (size_t e = 0; e < w13.size(); ++e) {
      packed13.push_back(w13[e].packed.data());
      packed2.push_back(w2[e].packed.data());
      values13.push_back(w13[e].values.data());
      values2.push_back(w2[e].values.data());
    }
    for (bool out_f32 : {false, true}) {
      std::vector<float> got(tokens * hidden, 0.5f), want(tokens * hidden, 0.5f);
      ops::MoeExpertsParams p{x.data(), ids.data(), weights.data(), packed13.data(), packed2.data(), got.data(),
                              tokens,   top_k,      hidden,         inter,           begin,          end};
      p.accumulate = p.out_f32 = out_f32;
      p.expert_quant = l.layout;
      backend->moe_experts(p);
      ops::MoeExpertsParams ref = p;
      ref.w13 = values13.data();
      ref.w2 = values2.data();
      ref.out = want.data();
      ref.expert_quant = {};
      backend->moe_experts(ref);
      EXPECT_EQ(differing(got, want), 0) << l.name << (out_f32 ? " fp32 accumulate" : "");
      EXPECT_NE(got[0], 0.5f) << l.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Numerics, CpuQuant, ::testing::Values(CpuNumerics::kFp32, CpuNumerics::kBf16),
                         [](const auto& info) { return info.param == CpuNumerics::kFp32 ? "cpu" : "cpu_bf16"; });

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpuQuantShapes, ErrorsNameTheOperandAndField) {
  auto backend = cpu::make_cpu_backend();
  std::vector<float> x(96), y(8);
  std::vector<uint8_t> packed(4096);
  ops::LinearParams p{x.data(), packed.data(), y.data(), 1, 96, 8, 96, 8};
  p.weight_quant = test::int4_layout(64);  // 96 is not a multiple of 64
  EXPECT_NE(error_of([&] { backend->linear(p); }).find("linear weight: in_features 96 is not a multiple of the int4"),
            std::string::npos);
  p.weight_quant = test::int4_layout(12);
  EXPECT_NE(error_of([&] { backend->linear(p); }).find("group_size 12 is not a positive multiple of 8"),
            std::string::npos);
  p.weight_quant = test::fp8_layout(0, 128);
  EXPECT_NE(error_of([&] { backend->linear(p); }).find("fp8 block [0, 128]"), std::string::npos);

  const std::vector<int32_t> ids = {0};
  const std::vector<float> weights = {1.0f};
  const void* table[] = {packed.data()};
  ops::MoeExpertsParams m{x.data(), ids.data(), weights.data(), table, table, y.data(), 1, 1, 96, 4, 0, 1};
  m.expert_quant = test::int4_layout(32);  // w2 [96, 4]: inter 4 is not a multiple of 32
  EXPECT_NE(error_of([&] { backend->moe_experts(m); }).find("moe_experts w2: in_features 4"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
