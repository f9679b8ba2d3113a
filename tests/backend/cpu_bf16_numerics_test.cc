// The CPU backend's bf16 numerics (CpuNumerics::kBf16, `--backend cpu-bf16`): fp32 arithmetic
// rounded to bf16 at exactly the points where the CUDA kernels store bf16 (backend/cuda), so
// that it is a tight host oracle for the CUDA engine. Each op is checked against the fp32
// backend's result rounded at those points: equal to the bit, since both backends sum in the
// same order. (The CUDA kernels are checked against it in tests/backend/cuda_ops_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"

namespace moeserve {
namespace {

using cpu::CpuNumerics;

class CpuBf16 : public ::testing::Test {
 protected:
  std::unique_ptr<ops::Backend> fp32 = cpu::make_cpu_backend(), bf16 = cpu::make_cpu_backend(CpuNumerics::kBf16);

  // bf16 values in [-scale, scale): inputs as they reach a kernel.
  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = round_to_bf16(scale * uniform_pm1(seed_, i));
    ++seed_;
    return v;
  }
  static std::vector<float> rounded(std::vector<float> v) {
    for (float& x : v) x = round_to_bf16(x);
    return v;
  }
  static void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int64_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
    EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << got.size() << " values differ";
  }
  static void expect_bf16_values(const std::vector<float>& v, const char* what) {
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], round_to_bf16(v[i])) << what << ": value " << i;
  }
  uint64_t seed_ = 77;
};

TEST_F(CpuBf16, NameAndActivationStorage) {
  EXPECT_EQ(fp32->name(), "cpu");
  EXPECT_EQ(bf16->name(), "cpu-bf16");
  EXPECT_EQ(bf16->activation_dtype(), DType::F32);  // bf16 values held in fp32 buffers
}

// Linear layers, RoPE and the MLA ops round once, at their output; fp32 outputs (logits,
// branch partials summed across ranks) are not rounded. A bf16 accumulation is refused.
TEST_F(CpuBf16, OpsRoundingOnceAtTheirOutputEqualTheFp32ResultRounded) {
  const int64_t rows = 5, in = 40, out = 24;
  const auto x = random(rows * in), w = random(out * in, 0.2f), y0 = random(rows * out);
  for (bool accumulate : {false, true})
    for (bool y_f32 : {false, true}) {
      if (accumulate && !y_f32) continue;  // accumulation is into fp32 outputs only (ops.h)
      auto y32 = y0, y16 = y0;
      fp32->linear({x.data(), w.data(), y32.data(), rows, in, out, in, out, accumulate, y_f32});
      bf16->linear({x.data(), w.data(), y16.data(), rows, in, out, in, out, accumulate, y_f32});
      expect_bits_equal(y16, y_f32 ? y32 : rounded(y32), y_f32 ? "linear, fp32 output" : "linear");
    }
  auto y = y0;
  EXPECT_THROW(bf16->linear({x.data(), w.data(), y.data(), rows, in, out, in, out, /*accumulate=*/true, false}), Error);

  const int64_t tokens = 3, heads = 4, head = 24, rope_dim = 8;
  const auto q = random(tokens * heads * head);
  const std::vector<int32_t> positions = {0, 7, 300};
  std::vector<float> inv_freq(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rope_dim);
  for (bool interleaved : {true, false}) {
    auto r32 = q, r16 = q;
    const ops::RopeParams base{nullptr, positions.data(), inv_freq.data(), tokens, heads, heads * head, head, rope_dim,
                               1.1f,    interleaved};
    ops::RopeParams p = base;
    p.x = r32.data();
    fp32->rope(p);
    p.x = r16.data();
    bf16->rope(p);
    expect_bits_equal(r16, rounded(r32), "rope");
  }

  // MLA absorbed form: q_nope (16) -> latent (32) -> attention over 9 cached rows -> v (8).
  const int64_t nope = 16, v = 8, latent = 32, rope = 8, page = 4, pages = 3;
  const auto kv_b = random(heads * (nope + v) * latent, 0.2f);
  std::vector<float> lat32(tokens * heads * latent), lat16 = lat32;
  fp32->mla_q_absorb({q.data(), kv_b.data(), lat32.data(), tokens, heads, head, nope, v, latent});
  bf16->mla_q_absorb({q.data(), kv_b.data(), lat16.data(), tokens, heads, head, nope, v, latent});
  expect_bits_equal(lat16, rounded(lat32), "mla_q_absorb");

  const auto cache = random(pages * page * (latent + rope));
  const std::vector<int32_t> table = {2, 0, 1}, seq_of = {0, 0, 0}, pos = {0, 4, 8};
  std::vector<float> att32(tokens * heads * latent), att16 = att32;
  ops::MlaAttentionParams a{lat16.data(), q.data(), cache.data(), table.data(), seq_of.data(), pos.data(),
                            att32.data(), tokens,   heads,        latent,       rope,          head,
                            nope,         page,     pages,        0.3f};
  fp32->mla_attention(a);
  a.out = att16.data();
  bf16->mla_attention(a);
  expect_bits_equal(att16, rounded(att32), "mla_attention");

  std::vector<float> o32(tokens * heads * v), o16 = o32;
  fp32->mla_v_up({att16.data(), kv_b.data(), o32.data(), tokens, heads, nope, v, latent});
  bf16->mla_v_up({att16.data(), kv_b.data(), o16.data(), tokens, heads, nope, v, latent});
  expect_bits_equal(o16, rounded(o32), "mla_v_up");

  // Weighted row combine (expert dispatch's combine), bf16 and fp32 outputs.
  const auto src = random(6 * 16);
  const std::vector<int32_t> offsets = {0, 2, 2, 5}, src_rows = {1, 4, 0, 5, 2};
  const std::vector<float> weights = {0.7f, 0.3f, 0.25f, 0.5f, 0.25f};
  for (bool out_f32 : {false, true}) {
    std::vector<float> c32(3 * 16, 1.5f), c16 = c32;
    ops::RowCombineParams rc{src.data(), offsets.data(), src_rows.data(), weights.data(), c32.data(), 3, 16};
    rc.accumulate = true;
    rc.out_f32 = out_f32;
    fp32->row_combine(rc);
    rc.out = c16.data();
    bf16->row_combine(rc);
    expect_bits_equal(c16, out_f32 ? c32 : rounded(c32), "row_combine");
  }
}

// RMSNorm, silu(gate) * up and the residual add round where transformers' bf16 modules do
// (and the CUDA kernels after them): weight * (x * rsqrt).to(bf16); silu(gate) rounded, then
// the product; an fp32 branch is rounded before it is added to the bf16 residual stream.
TEST_F(CpuBf16, NormSiluAndResidualAddRoundWhereTransformersBf16Does) {
  const int64_t rows = 3, dim = 48;
  const auto x = random(rows * dim, 3.0f), w = random(dim, 2.0f);
  std::vector<float> y(rows * dim);
  bf16->rms_norm({x.data(), w.data(), y.data(), rows, dim, dim, dim, 1e-6f});
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * dim;
    const float inv = 1.0f / std::sqrt(cpu::dot(xr, xr, dim) / static_cast<float>(dim) + 1e-6f);
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_EQ(y[r * dim + i], round_to_bf16(w[i] * round_to_bf16(xr[i] * inv))) << "rms_norm " << r << "," << i;
  }

  const int64_t tokens = 2, inter = 20;
  const auto gate_up = random(tokens * 2 * inter, 4.0f);
  std::vector<float> act(tokens * inter);
  bf16->silu_mul({gate_up.data(), act.data(), tokens, inter});
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t n = 0; n < inter; ++n) {
      const float g = gate_up[t * 2 * inter + n], u = gate_up[t * 2 * inter + inter + n];
      ASSERT_EQ(act[t * inter + n], round_to_bf16(round_to_bf16(g / (1.0f + std::exp(-g))) * u)) << "silu_mul " << n;
    }

  const auto h0 = random(64);
  std::vector<float> branch(64);
  for (size_t i = 0; i < branch.size(); ++i) branch[i] = 0.37f * uniform_pm1(5, i);  // fp32, not bf16 values
  auto h = h0;
  bf16->add({h.data(), branch.data(), 64, /*x_f32=*/true});
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], round_to_bf16(h0[i] + round_to_bf16(branch[i]))) << i;
  auto partial = branch;
  bf16->add({partial.data(), branch.data(), 64, false, /*acc_f32=*/true});
  for (size_t i = 0; i < partial.size(); ++i) ASSERT_EQ(partial[i], branch[i] + branch[i]) << "fp32 partials stay fp32";
}

// Routed experts: gate and up, silu(gate) and each expert's down projection are bf16 (as the
// CUDA expert kernels store them); the weighted sum over the token's experts is fp32, rounded
// once at the output unless it is an fp32 partial.
TEST_F(CpuBf16, ExpertsComposeTheRoundedLinearAndSiluOps) {
  const int64_t tokens = 3, top_k = 2, hidden = 32, inter = 12, experts = 3;
  const auto x = random(tokens * hidden);
  std::vector<std::vector<float>> w13, w2;
  std::vector<const void*> p13, p2;
  for (int64_t e = 0; e < experts; ++e) {
    w13.push_back(random(2 * inter * hidden, 0.3f));
    w2.push_back(random(hidden * inter, 0.3f));
    p13.push_back(w13.back().data());
    p2.push_back(w2.back().data());
  }
  const std::vector<int32_t> ids = {0, 2, 1, 0, 2, 1};
  const std::vector<float> weights = {0.6f, 0.4f, 1.3f, 0.2f, 0.5f, 0.5f};
  for (bool out_f32 : {false, true}) {
    std::vector<float> out(tokens * hidden);
    ops::MoeExpertsParams p{x.data(), ids.data(), weights.data(), p13.data(), p2.data(), out.data(),
                            tokens,   top_k,      hidden,         inter,      0,         experts};
    p.out_f32 = out_f32;
    bf16->moe_experts(p);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> routed(hidden, 0.0f);
      for (int64_t k = 0; k < top_k; ++k) {
        const int32_t e = ids[t * top_k + k];
        std::vector<float> gu(2 * inter), act(inter), down(hidden);
        bf16->linear({x.data() + t * hidden, w13[e].data(), gu.data(), 1, hidden, 2 * inter, hidden, 2 * inter});
        bf16->silu_mul({gu.data(), act.data(), 1, inter});
        bf16->linear({act.data(), w2[e].data(), down.data(), 1, inter, hidden, inter, hidden});
        for (int64_t n = 0; n < hidden; ++n) routed[n] += weights[t * top_k + k] * down[n];
      }
      for (int64_t n = 0; n < hidden; ++n)
        ASSERT_EQ(out[t * hidden + n], out_f32 ? routed[n] : round_to_bf16(routed[n]))
            << "moe_experts token " << t << " column " << n << (out_f32 ? " (fp32 out)" : "");
    }
  }
}

// Weights are bf16 on the GPU except those it keeps in fp32 (the router's); synthetic weights
// generated in place likewise.
TEST_F(CpuBf16, WeightsAreRoundedExceptTheOnesKeptInFp32) {
  Tensor host(DType::F32, {4, 8});
  for (int64_t i = 0; i < 32; ++i) host.f32()[i] = 0.1f + 0.013f * static_cast<float>(i);
  for (bool keep_f32 : {false, true}) {
    auto buffer = bf16->alloc(host.nbytes());
    bf16->upload_weight_into(*buffer, 0, host, keep_f32);
    const float* w = static_cast<const float*>(buffer->data());
    for (int64_t i = 0; i < 32; ++i) {
      const float v = host.f32()[i];
      ASSERT_EQ(w[i], keep_f32 ? v : round_to_bf16(v)) << "weight " << i;
    }
  }
  for (bool out_f32 : {false, true}) {
    std::vector<float> a(7 * 9), b(7 * 9);
    ops::FillUniformParams f{a.data(), 7, 9, 20, 3, 5, 99, 0.5f, 0.25f};
    f.out_f32 = out_f32;
    fp32->fill_uniform(f);
    f.out = b.data();
    bf16->fill_uniform(f);
    expect_bits_equal(b, out_f32 ? a : rounded(a), "fill_uniform");
    if (!out_f32) expect_bf16_values(b, "fill_uniform");
  }
}

}  // namespace
}  // namespace moeserve
