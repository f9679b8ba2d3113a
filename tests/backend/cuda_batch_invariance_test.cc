// Batch-invariant mode of the CUDA backend (label: gpu; skipped without a GPU): each op's rows
// run in a batch and alone give the same bits.
#include <array>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

// Batch-invariant mode (CudaBackendOptions::batch_invariant): every row of a batch gets the
// bits it gets when it runs alone, for each op whose kernel choice or work split otherwise
// depends on the batch (projections, absorbed query, value up-projection, router, experts,
// attention with the block-table width of the batch). Rows are compared bit for bit.
class CudaBatchInvariance : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    inv = cuda::make_cuda_backend(0, {/*batch_invariant=*/true});
  }
  // Inputs are uploaded through `gpu` (CudaOps' helpers), on its stream: wait for them before
  // `inv`, on another stream, reads them.
  void inputs_ready() { gpu->synchronize(); }
  static const char* at(const ops::BufferPtr& b, int64_t bytes) { return static_cast<const char*>(b->data()) + bytes; }
  static char* at(ops::BufferPtr& b, int64_t bytes) { return static_cast<char*>(b->data()) + bytes; }
  std::vector<uint8_t> bytes_of(ops::Buffer& b, size_t n) {
    std::vector<uint8_t> v(n);
    inv->download(v.data(), b, 0, n);
    return v;
  }
  std::unique_ptr<ops::Backend> inv;
};

TEST_F(CudaBatchInvariance, ProjectionsAbsorbAndValueUpGiveEachRowItsOwnBits) {
  // 4096 and 2100 outputs: the tensor-core kernel (in % 32 == 0, out >= the policy's
  // linear_mma_min_rows; 37 and 70 rows: passes of 32, the last partial); the others stream in
  // groups of 4 rows.
  for (auto [rows, in, out] : std::vector<std::array<int64_t, 3>>{
           {37, 7168, 4096}, {70, 2048, 2100}, {37, 7168, 512}, {9, 256, 96}, {6, 1536, 77}})
    for (bool y_f32 : {false, true}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << in << " -> " << out << (y_f32 ? " fp32" : " bf16"));
      const int64_t elem = y_f32 ? 4 : 2;
      auto x = random(rows * in), w = random(out * in, 1.0f / std::sqrt(static_cast<float>(in)));
      auto d_x = to_gpu_bf16(x), d_w = to_gpu_bf16(w);
      inputs_ready();
      auto all = inv->alloc(rows * out * elem), alone = inv->alloc(rows * out * elem);
      inv->linear({d_x->data(), d_w->data(), all->data(), rows, in, out, in, out, false, y_f32});
      for (int64_t r = 0; r < rows; ++r)
        inv->linear({at(d_x, r * in * 2), d_w->data(), at(alone, r * out * elem), 1, in, out, in, out, false, y_f32});
      EXPECT_EQ(bytes_of(*all, rows * out * elem), bytes_of(*alone, rows * out * elem)) << "linear";
      std::vector<float> ref(rows * out);
      cpu->linear({x.data(), w.data(), ref.data(), rows, in, out, in, out, false, y_f32});
      expect_close(y_f32 ? from_gpu_f32(*all, ref.size()) : from_gpu_bf16(*all, ref.size()), ref,
                   "linear (batch-invariant)");
    }

  const int64_t tokens = 9, heads = 16, nope = 128, v = 128, latent = 512, qk = nope + 64;
  auto q = random(tokens * heads * qk), kv_b = random(heads * (nope + v) * latent, 0.05f);
  auto att = random(tokens * heads * latent);
  auto d_q = to_gpu_bf16(q), d_kvb = to_gpu_bf16(kv_b), d_att = to_gpu_bf16(att);
  inputs_ready();
  auto lat_all = inv->alloc(tokens * heads * latent * 2), lat_alone = inv->alloc(tokens * heads * latent * 2);
  auto out_all = inv->alloc(tokens * heads * v * 2), out_alone = inv->alloc(tokens * heads * v * 2);
  inv->mla_q_absorb({d_q->data(), d_kvb->data(), lat_all->data(), tokens, heads, qk, nope, v, latent});
  inv->mla_v_up({d_att->data(), d_kvb->data(), out_all->data(), tokens, heads, nope, v, latent});
  for (int64_t t = 0; t < tokens; ++t) {
    inv->mla_q_absorb({at(d_q, t * heads * qk * 2), d_kvb->data(), at(lat_alone, t * heads * latent * 2), 1, heads, qk,
                       nope, v, latent});
    inv->mla_v_up({at(d_att, t * heads * latent * 2), d_kvb->data(), at(out_alone, t * heads * v * 2), 1, heads, nope,
                   v, latent});
  }
  EXPECT_EQ(bytes_of(*lat_all, tokens * heads * latent * 2), bytes_of(*lat_alone, tokens * heads * latent * 2))
      << "mla_q_absorb";
  EXPECT_EQ(bytes_of(*out_all, tokens * heads * v * 2), bytes_of(*out_alone, tokens * heads * v * 2)) << "mla_v_up";
}

TEST_F(CudaBatchInvariance, RouterAndExpertsGiveEachTokenItsOwnBits) {
  for (auto [experts, n_group, topk_group, top_k] :
       std::vector<std::array<int64_t, 4>>{{384, 1, 1, 8}, {64, 4, 4, 6}, {256, 8, 4, 8}}) {
    SCOPED_TRACE(testing::Message() << experts << " experts");
    const int64_t tokens = 50, hidden = 512;
    auto x = random(tokens * hidden);
    std::vector<float> w(experts * hidden), bias(experts);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.2f * uniform_pm1(99, i);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.05f * uniform_pm1(98, i);
    auto d_x = to_gpu_bf16(x), d_w = to_gpu_raw(w), d_b = to_gpu_raw(bias);
    inputs_ready();
    auto ids_all = inv->alloc(tokens * top_k * 4), ids_alone = inv->alloc(tokens * top_k * 4);
    auto wt_all = inv->alloc(tokens * top_k * 4), wt_alone = inv->alloc(tokens * top_k * 4);
    auto route = [&](int64_t t0, int64_t count, ops::BufferPtr& ids, ops::BufferPtr& wt) {
      inv->moe_route({at(d_x, t0 * hidden * 2), static_cast<float*>(d_w->data()), static_cast<float*>(d_b->data()),
                      reinterpret_cast<int32_t*>(at(ids, t0 * top_k * 4)),
                      reinterpret_cast<float*>(at(wt, t0 * top_k * 4)), count, hidden, experts, n_group, topk_group,
                      top_k, true, 2.5f});
    };
    route(0, tokens, ids_all, wt_all);
    for (int64_t t = 0; t < tokens; ++t) route(t, 1, ids_alone, wt_alone);
    EXPECT_EQ(bytes_of(*ids_all, tokens * top_k * 4), bytes_of(*ids_alone, tokens * top_k * 4)) << "moe_route ids";
    EXPECT_EQ(bytes_of(*wt_all, tokens * top_k * 4), bytes_of(*wt_alone, tokens * top_k * 4)) << "moe_route weights";
  }

  // 64: the tensor-core expert kernels; 40: the CUDA-core ones (K % 32 != 0). Host pointers are
  // given, so that the per-expert GEMM path of many rows would be open outside this mode.
  for (int64_t inter : {64, 40})
    for (bool out_f32 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "inter " << inter << (out_f32 ? ", fp32 out" : ", bf16 out"));
      const int64_t tokens = 40, top_k = 4, hidden = 256, experts = 6;
      auto x = random(tokens * hidden);
      std::vector<int32_t> ids(tokens * top_k);
      std::vector<float> weights(tokens * top_k);
      for (int64_t i = 0; i < tokens * top_k; ++i) {
        ids[i] = static_cast<int32_t>((i * 5 + i / top_k) % experts);
        weights[i] = 0.5f + 0.25f * uniform_pm1(5, i);
      }
      const ExpertWeights ew = expert_weights(experts, hidden, inter);
      auto d_x = to_gpu_bf16(x), d_ids = to_gpu_raw(ids), d_wt = to_gpu_raw(weights);
      inputs_ready();
      const int64_t elem = out_f32 ? 4 : 2;
      auto all = inv->alloc(tokens * hidden * elem), alone = inv->alloc(tokens * hidden * elem);
      auto run = [&](int64_t t0, int64_t count, ops::BufferPtr& out) {
        ops::MoeExpertsParams g{at(d_x, t0 * hidden * 2),
                                reinterpret_cast<const int32_t*>(at(d_ids, t0 * top_k * 4)),
                                reinterpret_cast<const float*>(at(d_wt, t0 * top_k * 4)),
                                ew.device_w13(),
                                ew.device_w2(),
                                at(out, t0 * hidden * elem),
                                count,
                                top_k,
                                hidden,
                                inter,
                                0,
                                experts};
        g.routed_experts = experts;
        g.out_f32 = out_f32;
        g.w13_host = ew.d13.data();
        g.w2_host = ew.d2.data();
        inv->moe_experts(g);
      };
      run(0, tokens, all);
      for (int64_t t = 0; t < tokens; ++t) run(t, 1, alone);
      EXPECT_EQ(bytes_of(*all, tokens * hidden * elem), bytes_of(*alone, tokens * hidden * elem)) << "moe_experts";
    }
}

// Attention: a batch of tokens of four sequences under a block table of 1024 positions, and each token
// alone under a table just wide enough for its own sequence (a step's table width is its
// widest sequence's), on the tensor-core kernel (latent 512) and a CUDA-core one (latent 32).
TEST_F(CudaBatchInvariance, AttentionGivesEachTokenItsOwnBitsWhateverTheTableWidth) {
  for (auto [heads, latent, rope, page_size] : std::vector<std::array<int64_t, 4>>{{16, 512, 64, 64}, {5, 32, 8, 16}}) {
    SCOPED_TRACE(testing::Message() << heads << " heads, latent " << latent);
    const int64_t width = page_size == 64 ? 16 : 64;  // pages per sequence: position 1000 fits
    const int64_t seqs = 4, nope = 16, qk = nope + rope, pages = seqs * width;
    const std::vector<int32_t> positions = {1000, 3, 63, 64, 300, 0, 17}, seq_of = {0, 1, 2, 3, 0, 1, 2};
    const int64_t tokens = static_cast<int64_t>(positions.size());
    std::vector<int32_t> tables(seqs * width);
    for (int64_t i = 0; i < seqs * width; ++i) tables[i] = static_cast<int32_t>((i * 13) % pages);
    auto q_lat = random(tokens * heads * latent), q = random(tokens * heads * qk);
    auto cache = random(pages * page_size * (latent + rope));
    auto d_ql = to_gpu_bf16(q_lat), d_q = to_gpu_bf16(q), d_c = to_gpu_bf16(cache);
    auto d_t = to_gpu_raw(tables), d_s = to_gpu_raw(seq_of), d_p = to_gpu_raw(positions);
    inputs_ready();
    auto all = inv->alloc(tokens * heads * latent * 2), alone = inv->alloc(tokens * heads * latent * 2);
    inv->mla_attention({d_ql->data(), d_q->data(), d_c->data(), static_cast<int32_t*>(d_t->data()),
                        static_cast<int32_t*>(d_s->data()), static_cast<int32_t*>(d_p->data()), all->data(), tokens,
                        heads, latent, rope, qk, nope, page_size, width, 0.06f});
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t own_width = positions[t] / page_size + 1;
      std::vector<int32_t> own_table(tables.begin() + seq_of[t] * width,
                                     tables.begin() + seq_of[t] * width + own_width);
      auto d_own = to_gpu_raw(own_table), d_zero = to_gpu_raw(std::vector<int32_t>{0});
      auto d_pos = to_gpu_raw(std::vector<int32_t>{positions[t]});
      inputs_ready();
      inv->mla_attention({at(d_ql, t * heads * latent * 2), at(d_q, t * heads * qk * 2), d_c->data(),
                          static_cast<int32_t*>(d_own->data()), static_cast<int32_t*>(d_zero->data()),
                          static_cast<int32_t*>(d_pos->data()), at(alone, t * heads * latent * 2), 1, heads, latent,
                          rope, qk, nope, page_size, own_width, 0.06f});
      inv->synchronize();  // the per-token tables are freed at the end of the iteration
    }
    EXPECT_EQ(bytes_of(*all, tokens * heads * latent * 2), bytes_of(*alone, tokens * heads * latent * 2))
        << "mla_attention";
    // And the batch result is the attention's (bf16 bound and rounding points against cpu-bf16).
    std::vector<float> ref(tokens * heads * latent);
    cpu->mla_attention({q_lat.data(), q.data(), cache.data(), tables.data(), seq_of.data(), positions.data(),
                        ref.data(), tokens, heads, latent, rope, qk, nope, page_size, width, 0.06f});
    expect_close(from_gpu_bf16(*all, ref.size()), ref, "mla_attention (batch-invariant)");
  }
}

}  // namespace
}  // namespace moeserve
