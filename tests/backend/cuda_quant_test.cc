// The CUDA quantized kernels (quant_linear.cu, quant_moe.cu) against the cpu-bf16 backend's
// quantized ops (the exact dequantized reference) on the same packed weights: int4 groups of
// 32 / 64 / 128 and fp8 128x128 blocks, K2.6 expert shapes (hidden 7168, moe inter 2048) and
// their tensor-parallel slices, odd row counts, 1 to 300 rows, NaN-poisoned outputs, the
// fixture's bf16 checks (cuda_test_fixture.h). Label gpu: skipped without a device.
#include <array>
#include <string>
#include <vector>

#include "tests/backend/cuda_test_fixture.h"
#include "tests/backend/quant_test_weights.h"

namespace moeserve {
namespace {

struct NamedLayout {
  const char* name;
  ops::QuantLayout layout;
};
const NamedLayout kQuantLayouts[] = {{"int4 g32", test::int4_layout(32)},
                                     {"int4 g64", test::int4_layout(64)},
                                     {"int4 g128", test::int4_layout(128)},
                                     {"fp8 128x128", test::fp8_layout()}};

class CudaQuant : public CudaOps {
 protected:
  // Packed weights: scales make |w| ~ 1 / sqrt(k) so that outputs stay O(1).
  test::QuantWeight weight(int64_t n, int64_t k, const ops::QuantLayout& layout) {
    const float scale = layout.quant == ops::WeightQuant::int4_group ? 0.5f : 8.0f;
    return test::make_quant_weight(n, k, layout, seed_++, scale / std::sqrt(static_cast<float>(k)));
  }
};

TEST_F(CudaQuant, LinearMatchesCpuBf16) {
  // (rows, in, out): K2.6 expert projections (w13 4096 x 7168 as 2 x 2048 halves, w2 7168 x
  // 2048), their TP8 slices (inter 256), odd output counts.
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 7168, 2048},  {8, 2048, 7168}, {64, 7168, 256},
                                                      {300, 256, 7168}, {3, 512, 200},   {33, 1024, 77}};
  for (const NamedLayout& l : kQuantLayouts) {
    for (auto [rows, in, out] : shapes) {
      const std::string what = std::string("quant linear ") + l.name + " " + std::to_string(rows) + "x" +
                               std::to_string(in) + "->" + std::to_string(out);
      const int64_t x_stride = in + 8;
      const auto x = random(rows * x_stride);
      const test::QuantWeight w = weight(out, in, l.layout);
      auto d_x = to_gpu_bf16(x), d_w = to_gpu_raw(w.packed);
      ops::LinearParams c{x.data(), w.packed.data(), nullptr, rows, in, out, x_stride, out};
      c.weight_quant = l.layout;
      ops::LinearParams g = c;
      g.x = d_x->data();
      g.weight = d_w->data();
      std::vector<float> ref(rows * out);
      c.y = ref.data();
      cpu->linear(c);
      auto d_y = poisoned_bf16(ref.size());
      g.y = d_y->data();
      gpu->linear(g);
      expect_close(from_gpu_bf16(*d_y, ref.size()), ref, what.c_str());
      // fp32 output added to what it holds (logits, partial sums).
      std::vector<float> ref32(rows * out);
      for (size_t i = 0; i < ref32.size(); ++i) ref32[i] = 0.5f * uniform_pm1(99, i);
      auto d_y32 = to_gpu_raw(ref32);
      c.y = ref32.data();
      c.y_f32 = c.accumulate = true;
      cpu->linear(c);
      g.y = d_y32->data();
      g.y_f32 = g.accumulate = true;
      gpu->linear(g);
      expect_close(from_gpu_f32(*d_y32, ref32.size()), ref32, (what + " (fp32 accumulate)").c_str());
    }
  }
}

// Routed experts [begin, end) of `experts` with packed weights on both backends.
struct QuantExperts {
  std::vector<test::QuantWeight> w13, w2;
  std::vector<const void*> host13, host2;
  std::vector<ops::BufferPtr> buffers;
  std::vector<const void*> dev13, dev2;
  ops::BufferPtr table13, table2;
};

struct MoeCase {
  int64_t tokens, top_k, hidden, inter, experts, begin, end;
};

class CudaQuantMoe : public CudaQuant {
 protected:
  QuantExperts upload_experts(const MoeCase& c, const ops::QuantLayout& layout) {
    QuantExperts q;
    for (int64_t e = c.begin; e < c.end; ++e) {
      q.w13.push_back(weight(2 * c.inter, c.hidden, layout));
      q.w2.push_back(weight(c.hidden, c.inter, layout));
    }
    for (size_t e = 0; e < q.w13.size(); ++e) {
      q.host13.push_back(q.w13[e].packed.data());
      q.host2.push_back(q.w2[e].packed.data());
      q.buffers.push_back(to_gpu_raw(q.w13[e].packed));
      q.dev13.push_back(q.buffers.back()->data());
      q.buffers.push_back(to_gpu_raw(q.w2[e].packed));
      q.dev2.push_back(q.buffers.back()->data());
    }
    q.table13 = to_gpu_raw(q.dev13);
    q.table2 = to_gpu_raw(q.dev2);
    return q;
  }
  // Random routing: distinct experts per token (some outside [begin, end)), weights ~ 0.1-0.4.
  void routing(const MoeCase& c, std::vector<int32_t>& ids, std::vector<float>& weights) {
    ids.assign(c.tokens * c.top_k, 0);
    weights.assign(c.tokens * c.top_k, 0.0f);
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t first = random_word(seed_, t) % c.experts, stride = 1 + random_word(seed_ + 1, t) % 3;
      for (int64_t k = 0; k < c.top_k; ++k) {
        ids[t * c.top_k + k] = static_cast<int32_t>((first + k * stride) % c.experts);
        weights[t * c.top_k + k] = 0.1f + 0.3f * uniform01(seed_ + 2, t * c.top_k + k);
      }
    }
    seed_ += 3;
  }
  void check(const MoeCase& c, const NamedLayout& l, Check rounding = Check::kSameRoundings) {
    const std::string what = std::string("quant moe_experts ") + l.name + " tokens " + std::to_string(c.tokens) +
                             " hidden " + std::to_string(c.hidden) + " inter " + std::to_string(c.inter);
    const auto x = random(c.tokens * c.hidden);
    std::vector<int32_t> ids;
    std::vector<float> weights;
    routing(c, ids, weights);
    const QuantExperts q = upload_experts(c, l.layout);
    std::vector<float> ref(c.tokens * c.hidden);
    ops::MoeExpertsParams cp{x.data(), ids.data(), weights.data(), q.host13.data(), q.host2.data(), ref.data(),
                             c.tokens, c.top_k,    c.hidden,       c.inter,         c.begin,        c.end};
    cp.routed_experts = c.experts;
    cp.expert_quant = l.layout;
    cpu->moe_experts(cp);
    auto d_x = to_gpu_bf16(x), d_ids = to_gpu_raw(ids), d_wt = to_gpu_raw(weights);
    auto d_out = poisoned_bf16(ref.size());
    ops::MoeExpertsParams g = cp;
    g.x = d_x->data();
    g.topk_ids = static_cast<const int32_t*>(d_ids->data());
    g.topk_weights = static_cast<const float*>(d_wt->data());
    g.w13 = static_cast<const void* const*>(q.table13->data());
    g.w2 = static_cast<const void* const*>(q.table2->data());
    g.w13_host = q.dev13.data();  // offered, as the model does; the quantized path needs no host sync
    g.w2_host = q.dev2.data();
    g.out = d_out->data();
    gpu->moe_experts(g);
    expect_close(from_gpu_bf16(*d_out, ref.size()), ref, what.c_str(), rounding);
  }
};

// The per-op rounding check (kSameRoundings) holds for expert chains only at the small shapes
// cuda_ops_test.cc checks moe_experts at (hidden 256-288); at hidden 1024-7168 the chain (gate
// and up, silu(gate) with the kernels' __expf against std::exp, their product, each down
// projection: four bf16 roundings, any of which the fp32 summation order can flip, each flip
// moving later values by an ulp of an intermediate as large as the output) leaves a few
// elements beyond two ulps + 2^-10 of the largest for the unquantized kernels too: on an H200
// (2026-12-01, CudaQuantChainControl in cuda_quant_bench.cc) the bf16 moe.cu kernels had 10 of
// 57344 such elements and 4.9% differing values at hidden 7168 / inter 2048, 8 tokens, top-8,
// the int4 kernels 0 and 1.1%. Those shapes take the fixture's bound-only check for chains
// (max error <= 1e-2 of the largest output, every element written).
TEST_F(CudaQuantMoe, K26ExpertShapesMatchCpuBf16) {
  // The full expert (hidden 7168, inter 2048), 16 routed experts of which 8 are this rank's.
  for (const NamedLayout& l : kQuantLayouts)
    for (int64_t tokens : {1, 8, 64}) check({tokens, 8, 7168, 2048, 16, 4, 12}, l, Check::kBoundOnly);
}

TEST_F(CudaQuantMoe, TensorParallelSlicesAndManyRowsMatchCpuBf16) {
  // inter 256: K2.6's expert split over 8 ranks; 300 and 37 tokens: many rows per expert
  // (four token tiles per pass) and an odd count.
  for (const NamedLayout& l : kQuantLayouts) {
    check({300, 8, 256, 128, 12, 0, 12}, l);  // the unquantized tests' scale: per-op check
    check({37, 4, 256, 256, 8, 2, 8}, l);
    check({300, 8, 1024, 256, 12, 0, 12}, l, Check::kBoundOnly);  // larger: see above
    check({37, 4, 7168, 256, 8, 2, 8}, l, Check::kBoundOnly);
  }
}

TEST_F(CudaQuantMoe, DecodeStepCapturedInAGraphReplaysTheSameResult) {
  const MoeCase c{4, 8, 1024, 256, 32, 0, 32};
  const NamedLayout& l = kQuantLayouts[0];
  const auto x = random(c.tokens * c.hidden);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  routing(c, ids, weights);
  const QuantExperts q = upload_experts(c, l.layout);
  auto d_x = to_gpu_bf16(x), d_ids = to_gpu_raw(ids), d_wt = to_gpu_raw(weights);
  auto eager = poisoned_bf16(c.tokens * c.hidden), replayed = poisoned_bf16(c.tokens * c.hidden);
  ops::MoeExpertsParams g{d_x->data(),
                          static_cast<const int32_t*>(d_ids->data()),
                          static_cast<const float*>(d_wt->data()),
                          static_cast<const void* const*>(q.table13->data()),
                          static_cast<const void* const*>(q.table2->data()),
                          eager->data(),
                          c.tokens,
                          c.top_k,
                          c.hidden,
                          c.inter,
                          c.begin,
                          c.end};
  g.expert_quant = l.layout;
  gpu->moe_experts(g);  // sizes the workspace before capture
  g.out = replayed->data();
  gpu->begin_capture();
  gpu->moe_experts(g);
  auto graph = gpu->end_capture();
  ASSERT_NE(graph, nullptr);
  gpu->replay(*graph);
  gpu->synchronize();
  const auto a = from_gpu_bf16(*eager, c.tokens * c.hidden), b = from_gpu_bf16(*replayed, c.tokens * c.hidden);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(b[i])) << "element " << i << " not written by the replay";
    ASSERT_EQ(a[i], b[i]) << "element " << i;
  }
}

TEST_F(CudaQuant, UnsupportedShapesAreRefusedNamingTheField) {
  std::vector<float> x(64 * 96);
  auto d_x = to_gpu_bf16(x), d_w = poisoned_bf16(8192), d_y = poisoned_bf16(64);
  ops::LinearParams p{d_x->data(), d_w->data(), d_y->data(), 1, 96, 8, 96, 8};
  p.weight_quant = test::int4_layout(64);
  try {
    gpu->linear(p);
    ADD_FAILURE() << "in_features 96 with int4 group 64 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("in_features 96 is not a multiple of the int4 group_size 64"),
              std::string::npos)
        << e.what();
  }
  p.in_features = p.x_stride = 64;
  p.weight_quant = test::fp8_layout(128, 32);
  try {
    gpu->linear(p);
    ADD_FAILURE() << "fp8 block_k 32 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("block_k must be a power of two, a multiple of 64"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moeserve
