// Every CUDA op against the CPU reference on fresh random inputs (label: gpu). Inputs are
// rounded to bf16 before the CPU runs them, so the comparison isolates the kernel's own
// error. The reference is the CPU backend with the CUDA backend's bf16 numerics (cpu-bf16:
// fp32 arithmetic rounded to bf16 where the kernels store bf16), and each output passes two
// checks (expect_close): the bf16 bound, a normalised error max |gpu - cpu| / max |cpu| <= 1e-2;
// and the same rounding points: every element within two bf16 ulps of itself plus 2^-10 of
// the largest, and at most 5% of a bf16 output's elements differing at all (only fp32
// summation order differs, which flips a rounding rarely; one rounding point that the kernel
// and the oracle do not share changes ~26% of the elements of silu(gate) * up or RMSNorm).
// Outputs are poisoned with NaN before each run, so an element the kernel forgets to write
// fails the comparison.
#include <array>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

TEST_F(CudaOps, EmbeddingWithVocabSlice) {
  const int64_t tokens = 37, hidden = 96, begin = 100, end = 228;
  auto table = random((end - begin) * hidden);
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 53) % 300);
  std::vector<float> ref(tokens * hidden);
  cpu->embedding({ids.data(), table.data(), ref.data(), tokens, hidden, begin, end});
  auto d_ids = to_gpu_raw(ids), d_table = to_gpu_bf16(table), d_out = poisoned_bf16(ref.size());
  gpu->embedding({static_cast<int32_t*>(d_ids->data()), d_table->data(), d_out->data(), tokens, hidden, begin, end});
  expect_close(from_gpu_bf16(*d_out, ref.size()), ref, "embedding");
}

TEST_F(CudaOps, RmsNormStridedAndInPlace) {
  for (int64_t dim : {64, 100, 512, 7168}) {  // 100: not a multiple of 8 (the scalar kernel)
    const int64_t rows = 9, stride = dim + 64;
    auto x = random(rows * stride, 3.0f), w = random(dim);
    std::vector<float> ref(rows * stride, 0.0f);
    cpu->rms_norm({x.data(), w.data(), ref.data(), rows, dim, stride, stride, 1e-6f});
    auto d_x = to_gpu_bf16(x), d_w = to_gpu_bf16(w);
    gpu->rms_norm({d_x->data(), d_w->data(), d_x->data(), rows, dim, stride, stride, 1e-6f});  // in place
    auto out = from_gpu_bf16(*d_x, x.size());
    std::vector<float> got, want;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i) {
        got.push_back(out[r * stride + i]);
        want.push_back(ref[r * stride + i]);
      }
    expect_close(got, want, "rms_norm");
  }
}

TEST_F(CudaOps, AddAndSiluMul) {
  const int64_t tokens = 5, inter = 200;
  auto acc = random(tokens * inter), x = random(tokens * inter);
  auto ref = acc;
  cpu->add({ref.data(), x.data(), tokens * inter});
  auto d_acc = to_gpu_bf16(acc), d_x = to_gpu_bf16(x);
  gpu->add({d_acc->data(), d_x->data(), tokens * inter});
  expect_close(from_gpu_bf16(*d_acc, ref.size()), ref, "add");

  // fp32 branch: rounded to bf16, then added.
  auto d_acc2 = to_gpu_bf16(acc), d_x32 = to_gpu_raw(x);
  gpu->add({d_acc2->data(), d_x32->data(), tokens * inter, /*x_f32=*/true});
  expect_close(from_gpu_bf16(*d_acc2, ref.size()), ref, "add (fp32 x)");
  // fp32 += fp32 (the chunk tree of --reduction-chunks): one IEEE addition, the CPU's bits.
  std::vector<float> acc32(acc.size()), x32(x.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    acc32[i] = acc[i] * 1.37f + 1e-3f;  // not bf16 values
    x32[i] = x[i] * 0.71f;
  }
  auto ref32 = acc32;
  ops::AddParams cpu_add{ref32.data(), x32.data(), tokens * inter};
  cpu_add.acc_f32 = true;
  cpu->add(cpu_add);
  auto d_acc32 = to_gpu_raw(acc32), d_x32b = to_gpu_raw(x32);
  ops::AddParams gpu_add{d_acc32->data(), d_x32b->data(), tokens * inter};
  gpu_add.acc_f32 = true;
  gpu->add(gpu_add);
  EXPECT_EQ(from_gpu_f32(*d_acc32, ref32.size()), ref32) << "add (fp32 acc and x)";

  auto gate_up = random(tokens * 2 * inter, 4.0f);
  std::vector<float> act(tokens * inter);
  cpu->silu_mul({gate_up.data(), act.data(), tokens, inter});
  auto d_gu = to_gpu_bf16(gate_up), d_act = poisoned_bf16(act.size());
  gpu->silu_mul({d_gu->data(), d_act->data(), tokens, inter});
  expect_close(from_gpu_bf16(*d_act, act.size()), act, "silu_mul");
}

TEST_F(CudaOps, AddRmsNormEqualsAddThenRmsNorm) {
  for (int64_t dim : {64, 100, 7168}) {
    const int64_t rows = 7;
    auto hidden = random(rows * dim, 2.0f), x = random(rows * dim, 2.0f), w = random(dim);
    auto ref_hidden = hidden;
    std::vector<float> ref_normed(rows * dim);
    cpu->add_rms_norm({ref_hidden.data(), x.data(), w.data(), ref_normed.data(), rows, dim, 1e-6f});
    for (bool x_f32 : {false, true}) {
      auto d_hidden = to_gpu_bf16(hidden), d_w = to_gpu_bf16(w), d_normed = poisoned_bf16(ref_normed.size());
      auto d_x = x_f32 ? to_gpu_raw(x) : to_gpu_bf16(x);
      gpu->add_rms_norm({d_hidden->data(), d_x->data(), d_w->data(), d_normed->data(), rows, dim, 1e-6f, x_f32});
      expect_close(from_gpu_bf16(*d_hidden, ref_hidden.size()), ref_hidden, "add_rms_norm (hidden)");
      expect_close(from_gpu_bf16(*d_normed, ref_normed.size()), ref_normed, "add_rms_norm (normed)");
    }
  }
}

TEST_F(CudaOps, LinearIncludingStridesAndFp32OutputWithAccumulation) {
  // Up to 4 rows with in % 8 == 0 take the streaming kernel (gemv.cu; 16384 and 2056 inputs
  // are split in 8 and 2 chunks, the last one shorter); the rest cuBLAS.
  for (auto [rows, in, out] : std::vector<std::array<int64_t, 3>>{{1, 7168, 512},
                                                                  {3, 1536, 77},
                                                                  {1, 16384, 40},
                                                                  {2, 2056, 33},
                                                                  {4, 100, 33},
                                                                  {33, 256, 96},
                                                                  {64, 512, 1000}}) {
    const int64_t x_stride = in + 8;
    auto x = random(rows * x_stride), w = random(out * in, 1.0f / std::sqrt(static_cast<float>(in)));
    auto d_x = to_gpu_bf16(x), d_w = to_gpu_bf16(w);
    std::vector<float> ref(rows * out);
    cpu->linear({x.data(), w.data(), ref.data(), rows, in, out, x_stride, out});
    auto d_y = poisoned_bf16(ref.size());
    gpu->linear({d_x->data(), d_w->data(), d_y->data(), rows, in, out, x_stride, out});
    expect_close(from_gpu_bf16(*d_y, ref.size()), ref, "linear");

    // fp32 output (logits, branch partials), written, then added to what it holds.
    for (bool accumulate : {false, true}) {
      std::vector<float> y0(rows * out);
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = 0.5f * uniform_pm1(99, i);
      std::vector<float> ref32 = y0;
      ops::LinearParams c{x.data(), w.data(), ref32.data(), rows, in, out, x_stride, out, accumulate, /*y_f32=*/true};
      cpu->linear(c);
      auto d_y32 = accumulate ? to_gpu_raw(y0) : poisoned_f32(ref32.size());
      ops::LinearParams g{d_x->data(), d_w->data(), d_y32->data(), rows, in, out, x_stride, out, accumulate, true};
      gpu->linear(g);
      expect_close(from_gpu_f32(*d_y32, ref32.size()), ref32,
                   accumulate ? "linear (fp32 out, accumulate)" : "linear (fp32 out)");
    }
  }
}

TEST_F(CudaOps, RopeInterleavedAndHalves) {
  for (bool interleaved : {true, false}) {
    const int64_t tokens = 6, heads = 3, head_stride = 24, rope = 8, token_stride = heads * head_stride;
    auto x = random(tokens * token_stride);
    std::vector<int32_t> pos = {0, 1, 5, 17, 300, 4095};
    std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.001f};
    auto ref = x;
    cpu->rope({ref.data() + 16, pos.data(), inv_freq.data(), tokens, heads, token_stride, head_stride, rope, 1.2f,
               interleaved});
    auto d_x = to_gpu_bf16(x), d_pos = to_gpu_raw(pos), d_f = to_gpu_raw(inv_freq);
    gpu->rope({static_cast<char*>(d_x->data()) + 16 * 2, static_cast<int32_t*>(d_pos->data()),
               static_cast<float*>(d_f->data()), tokens, heads, token_stride, head_stride, rope, 1.2f, interleaved});
    expect_close(from_gpu_bf16(*d_x, x.size()), ref, interleaved ? "rope interleaved" : "rope halves");
  }
}

TEST_F(CudaOps, MlaAbsorbAttentionAndValueUp) {
  const int64_t heads = 16, nope = 128, rope = 64, v = 128, latent = 512, qk = nope + rope;
  const int64_t page_size = 64, pages = 8, max_pages = 4;
  // Two sequences: one decoding at position 150, one prefilling 5 tokens at 0..4.
  std::vector<int32_t> positions = {150, 0, 1, 2, 3, 4}, seq_of = {0, 1, 1, 1, 1, 1};
  std::vector<int32_t> tables = {3, 0, 6, 1, /*seq 1*/ 5, 2, 4, 7};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  auto q = random(tokens * heads * qk), kv_b = random(heads * (nope + v) * latent, 0.05f);
  auto cache = random(pages * page_size * (latent + rope));

  std::vector<float> q_lat(tokens * heads * latent), att(tokens * heads * latent), out(tokens * heads * v);
  cpu->mla_q_absorb({q.data(), kv_b.data(), q_lat.data(), tokens, heads, qk, nope, v, latent});
  // cpu-bf16 stores the absorbed query and the attention output in bf16, as the GPU does, so
  // each later op compares like with like.
  ops::MlaAttentionParams a{q_lat.data(), q.data(),  cache.data(), tables.data(), seq_of.data(), positions.data(),
                            att.data(),   tokens,    heads,        latent,        rope,          qk,
                            nope,         page_size, max_pages,    0.07f};
  cpu->mla_attention(a);
  cpu->mla_v_up({att.data(), kv_b.data(), out.data(), tokens, heads, nope, v, latent});

  auto d_q = to_gpu_bf16(q), d_kvb = to_gpu_bf16(kv_b), d_cache = to_gpu_bf16(cache);
  auto d_qlat = poisoned_bf16(q_lat.size()), d_att = poisoned_bf16(att.size()), d_out = poisoned_bf16(out.size());
  auto d_tables = to_gpu_raw(tables), d_seq = to_gpu_raw(seq_of), d_pos = to_gpu_raw(positions);
  gpu->mla_q_absorb({d_q->data(), d_kvb->data(), d_qlat->data(), tokens, heads, qk, nope, v, latent});
  expect_close(from_gpu_bf16(*d_qlat, q_lat.size()), q_lat, "mla_q_absorb");
  // Feed the GPU attention the same (CPU-computed, bf16) absorbed query.
  auto d_qlat_ref = to_gpu_bf16(q_lat);
  ops::MlaAttentionParams g{d_qlat_ref->data(),
                            d_q->data(),
                            d_cache->data(),
                            static_cast<int32_t*>(d_tables->data()),
                            static_cast<int32_t*>(d_seq->data()),
                            static_cast<int32_t*>(d_pos->data()),
                            d_att->data(),
                            tokens,
                            heads,
                            latent,
                            rope,
                            qk,
                            nope,
                            page_size,
                            max_pages,
                            0.07f};
  gpu->mla_attention(g);
  expect_close(from_gpu_bf16(*d_att, att.size()), att, "mla_attention");
  auto d_att_ref = to_gpu_bf16(att);
  gpu->mla_v_up({d_att_ref->data(), d_kvb->data(), d_out->data(), tokens, heads, nope, v, latent});
  expect_close(from_gpu_bf16(*d_out, out.size()), out, "mla_v_up");
}

// The absorbed query and the value up-projection alone, at decode sizes (1-4 tokens: the
// streaming kernels) and above (cuBLAS), for DeepSeek-V3's head shape and a small one.
TEST_F(CudaOps, MlaQAbsorbAndValueUpAtEveryBatchSize) {
  struct Shape {
    int64_t heads, nope, v, latent, rope;
  };
  for (const Shape& sh : {Shape{16, 128, 128, 512, 64}, Shape{4, 16, 16, 32, 8}}) {
    for (int64_t tokens : {1, 3, 4, 6}) {
      const int64_t qk = sh.nope + sh.rope;
      auto q = random(tokens * sh.heads * qk), kv_b = random(sh.heads * (sh.nope + sh.v) * sh.latent, 0.05f);
      auto att = random(tokens * sh.heads * sh.latent);
      std::vector<float> q_lat(tokens * sh.heads * sh.latent), out(tokens * sh.heads * sh.v);
      cpu->mla_q_absorb({q.data(), kv_b.data(), q_lat.data(), tokens, sh.heads, qk, sh.nope, sh.v, sh.latent});
      cpu->mla_v_up({att.data(), kv_b.data(), out.data(), tokens, sh.heads, sh.nope, sh.v, sh.latent});
      auto d_q = to_gpu_bf16(q), d_kvb = to_gpu_bf16(kv_b), d_att = to_gpu_bf16(att);
      auto d_qlat = poisoned_bf16(q_lat.size()), d_out = poisoned_bf16(out.size());
      gpu->mla_q_absorb({d_q->data(), d_kvb->data(), d_qlat->data(), tokens, sh.heads, qk, sh.nope, sh.v, sh.latent});
      gpu->mla_v_up({d_att->data(), d_kvb->data(), d_out->data(), tokens, sh.heads, sh.nope, sh.v, sh.latent});
      SCOPED_TRACE(testing::Message() << "latent " << sh.latent << ", tokens " << tokens);
      expect_close(from_gpu_bf16(*d_qlat, q_lat.size()), q_lat, "mla_q_absorb");
      expect_close(from_gpu_bf16(*d_out, out.size()), out, "mla_v_up");
    }
  }
}

TEST_F(CudaOps, MlaAttentionLongContextOverManySplits) {
  // One decoding token at position 1000 (16 context splits) and one at 3 (most splits empty).
  const int64_t max_pages = 16;
  std::vector<int32_t> tables(2 * max_pages);
  for (int64_t i = 0; i < 2 * max_pages; ++i) tables[i] = static_cast<int32_t>((i * 11) % (2 * max_pages));
  check_mla_attention({8, 512, 64, 128, 64, max_pages, 2 * max_pages, {1000, 3}, {0, 1}, tables, 0.05f},
                      "mla_attention (long context)");
}

// DeepSeek-V3's shape (latent 512, rope 64) with 16, 32 and 128 heads: the tensor-core split
// kernel. Tokens: decoding at 1000 (many tiles and splits, a partial last tile), at 63 and 64
// (a tile boundary), a prefill of 20 tokens at 0..19 of one sequence (causal: each sees its own
// prefix, the first a single row), pages scattered.
// KernelPolicy::mla_tensor_cores off: the same shapes on the CUDA-core split kernels.
TEST_F(CudaOps, MlaAttentionForDeepSeekShapesOnTensorCoresAndCudaCores) {
  const int64_t max_pages = 16;
  std::vector<int32_t> positions = {1000, 63, 64}, seq_of = {0, 1, 2};
  for (int32_t p = 0; p < 20; ++p) {
    positions.push_back(p);
    seq_of.push_back(3);
  }
  std::vector<int32_t> tables(4 * max_pages);
  for (int64_t i = 0; i < 4 * max_pages; ++i) tables[i] = static_cast<int32_t>((i * 13) % (4 * max_pages));
  // 16, 32, 128: whole blocks of 16 heads; 1, 8 (K2 under tp8, Moonlight under tp2), 24: a
  // last block with missing heads, whose outputs must not reach the partials of real heads.
  for (bool tensor_cores : {true, false}) {
    gpu = cuda::make_cuda_backend_with_policy(0, {.mla_tensor_cores = tensor_cores});
    for (int64_t heads : {1, 8, 16, 24, 32, 128}) {
      SCOPED_TRACE(testing::Message() << heads << " heads");
      check_mla_attention({heads, 512, 64, 128, 64, max_pages, 4 * max_pages, positions, seq_of, tables, 0.06f},
                          tensor_cores ? "mla_attention (tensor cores)" : "mla_attention (CUDA cores)");
    }
  }
}

TEST_F(CudaOps, MlaAttentionSmallAndUnalignedShapes) {
  // (latent, rope): 32/8 takes the 16-byte-load kernel like the DeepSeek shapes; 40/6 (rows of
  // 46 elements) the element-wise one. Positions cover empty splits and partial pages.
  for (auto [latent, rope] : std::vector<std::array<int64_t, 2>>{{32, 8}, {40, 6}}) {
    const int64_t max_pages = 8;
    std::vector<int32_t> tables(4 * max_pages);
    for (int64_t i = 0; i < 4 * max_pages; ++i) tables[i] = static_cast<int32_t>((i * 7) % (4 * max_pages));
    check_mla_attention(
        {5, latent, rope, 16, 16, max_pages, 4 * max_pages, {100, 0, 17, 127}, {0, 1, 2, 3}, tables, 0.2f},
        latent == 32 ? "mla_attention 32/8" : "mla_attention 40/6");
  }
}

TEST_F(CudaOps, KvWriteToPagedSlots) {
  const int64_t width = 576, tokens = 4;
  auto entries = random(tokens * width);
  std::vector<int32_t> slots = {5, 130, 64, 0};
  auto cache = random(3 * 64 * width);
  auto ref = cache;
  cpu->kv_write({entries.data(), slots.data(), ref.data(), tokens, width});
  auto d_e = to_gpu_bf16(entries), d_s = to_gpu_raw(slots), d_c = to_gpu_bf16(cache);
  gpu->kv_write({d_e->data(), static_cast<int32_t*>(d_s->data()), d_c->data(), tokens, width});
  expect_close(from_gpu_bf16(*d_c, ref.size()), ref, "kv_write");
}

TEST_F(CudaOps, MoeRouteSelectsTheSameExperts) {
  // 384/1/1 and 64/4/4 (every group kept) take the register kernels (a block per token at
  // up to 8 tokens, a warp per token above), the others the grouped one.
  for (auto [experts, n_group, topk_group, top_k, tokens] : std::vector<std::array<int64_t, 5>>{{384, 1, 1, 8, 50},
                                                                                                {384, 1, 1, 8, 1},
                                                                                                {384, 1, 1, 8, 3},
                                                                                                {64, 4, 4, 6, 50},
                                                                                                {64, 4, 4, 6, 2},
                                                                                                {256, 8, 4, 8, 50},
                                                                                                {16, 4, 2, 4, 50}}) {
    const int64_t hidden = 512;
    auto x = random(tokens * hidden);
    std::vector<float> w(experts * hidden), bias(experts);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.2f * uniform_pm1(99, i);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.05f * uniform_pm1(98, i);
    std::vector<int32_t> ids(tokens * top_k);
    std::vector<float> weights(tokens * top_k);
    cpu->moe_route({x.data(), w.data(), bias.data(), ids.data(), weights.data(), tokens, hidden, experts, n_group,
                    topk_group, top_k, true, 2.5f});
    auto d_x = to_gpu_bf16(x), d_w = to_gpu_raw(w), d_b = to_gpu_raw(bias);
    auto d_ids = to_gpu_raw(std::vector<int32_t>(ids.size(), -1)), d_wt = poisoned_f32(weights.size());
    gpu->moe_route({d_x->data(), static_cast<float*>(d_w->data()), static_cast<float*>(d_b->data()),
                    static_cast<int32_t*>(d_ids->data()), static_cast<float*>(d_wt->data()), tokens, hidden, experts,
                    n_group, topk_group, top_k, true, 2.5f});
    std::vector<int32_t> g_ids(ids.size());
    gpu->download(g_ids.data(), *d_ids, 0, g_ids.size() * 4);
    auto g_w = from_gpu_f32(*d_wt, weights.size());
    // Same fp32 inputs and fp32 math: the same experts in the same (descending) order.
    EXPECT_EQ(g_ids, ids) << experts << " experts, " << tokens << " tokens";
    expect_close(g_w, weights, "moe_route weights", Check::kSameRoundings, 1e-5);
  }
}

TEST_F(CudaOps, MoeExpertsOwnedRangeAndAccumulate) {
  // 64: the tensor-core kernels (K % 32 == 0); 40: the CUDA-core kernels' 16-byte loads; 12: a
  // MoE-TP slice whose rows are not 16-byte aligned (element by element).
  for (int64_t inter : {64, 40, 12}) {
    const int64_t tokens = 19, top_k = 4, hidden = 256, experts = 12, begin = 4, end = 10;
    auto x = random(tokens * hidden);
    std::vector<int32_t> ids(tokens * top_k);
    std::vector<float> weights(tokens * top_k);
    for (int64_t i = 0; i < tokens * top_k; ++i) {
      ids[i] = static_cast<int32_t>((i * 7 + i / top_k) % experts);
      weights[i] = 0.5f + 0.25f * uniform_pm1(5, i);
    }
    const ExpertWeights w = expert_weights(end - begin, hidden, inter);
    auto out0 = random(tokens * hidden);
    auto ref = out0;
    ops::MoeExpertsParams p{x.data(),         ids.data(), weights.data(), w.w13_ptrs.data(),
                            w.w2_ptrs.data(), ref.data(), tokens,         top_k,
                            hidden,           inter,      begin,          end};
    p.accumulate = true;
    cpu->moe_experts(p);
    auto d_x = to_gpu_bf16(x), d_ids = to_gpu_raw(ids), d_wt = to_gpu_raw(weights), d_out = to_gpu_bf16(out0);
    ops::MoeExpertsParams g{d_x->data(),
                            static_cast<int32_t*>(d_ids->data()),
                            static_cast<float*>(d_wt->data()),
                            w.device_w13(),
                            w.device_w2(),
                            d_out->data(),
                            tokens,
                            top_k,
                            hidden,
                            inter,
                            begin,
                            end};
    g.accumulate = true;
    gpu->moe_experts(g);
    expect_close(from_gpu_bf16(*d_out, ref.size()), ref, ("moe_experts inter " + std::to_string(inter)).c_str());
    // fp32 output (the branch that is summed across ranks in fp32).
    auto d_out32 = to_gpu_raw(out0);
    g.out = d_out32->data();
    g.out_f32 = true;
    gpu->moe_experts(g);
    expect_close(from_gpu_f32(*d_out32, ref.size()), ref, "moe_experts (fp32 out)");
    // With host pointers the backend may take the per-expert GEMM path (76 rows over 6 experts).
    auto d_out_gemm = to_gpu_bf16(out0);
    g.out = d_out_gemm->data();
    g.out_f32 = false;
    g.w13_host = w.d13.data();
    g.w2_host = w.d2.data();
    gpu->moe_experts(g);
    expect_close(from_gpu_bf16(*d_out_gemm, ref.size()), ref, "moe_experts (GEMM path)");
  }
}

// The tensor-core expert kernels with more tokens per expert than one pass holds (32): 90
// tokens, top-2 of 4 experts, all local (~45 rows each, two passes over the weights); hidden 288
// is 9 chunks of 32 over 4 warps (3, 3, 3, 0), inter 96.
TEST_F(CudaOps, MoeExpertsOnTensorCoresWithManyTokensPerExpert) {
  const int64_t tokens = 90, top_k = 2, hidden = 288, inter = 96, experts = 4;
  auto x = random(tokens * hidden);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      ids[t * top_k + k] = static_cast<int32_t>((t + 3 * k + t / 7) % experts);
      weights[t * top_k + k] = 0.5f + 0.25f * uniform_pm1(9, t * top_k + k);
    }
  const ExpertWeights w = expert_weights(experts, hidden, inter);
  std::vector<float> ref(tokens * hidden);
  cpu->moe_experts({x.data(), ids.data(), weights.data(), w.w13_ptrs.data(), w.w2_ptrs.data(), ref.data(), tokens,
                    top_k, hidden, inter, 0, experts});
  auto d_x = to_gpu_bf16(x), d_ids = to_gpu_raw(ids), d_wt = to_gpu_raw(weights);
  auto d_out = poisoned_f32(ref.size());
  ops::MoeExpertsParams g{d_x->data(),
                          static_cast<int32_t*>(d_ids->data()),
                          static_cast<float*>(d_wt->data()),
                          w.device_w13(),
                          w.device_w2(),
                          d_out->data(),
                          tokens,
                          top_k,
                          hidden,
                          inter,
                          0,
                          experts};
  g.out_f32 = true;
  gpu->moe_experts(g);
  expect_close(from_gpu_f32(*d_out, ref.size()), ref, "moe_experts (tensor cores, two passes)");
}

TEST_F(CudaOps, FillUniformMatchesTheHostGenerator) {
  const int64_t rows = 7, cols = 33, full_cols = 100;
  std::vector<float> ref(rows * cols);
  cpu->fill_uniform({ref.data(), rows, cols, full_cols, 3, 40, 777, 1.0f, 0.1f, true});
  auto d32 = poisoned_f32(ref.size());
  gpu->fill_uniform({d32->data(), rows, cols, full_cols, 3, 40, 777, 1.0f, 0.1f, true});
  EXPECT_EQ(from_gpu_f32(*d32, ref.size()), ref);  // bit-identical
}

TEST_F(CudaOps, FillRandomWordsMatchesTheHostGenerator) {
  const int64_t words = 1000, word0 = 12345;
  std::vector<uint32_t> ref(words);
  cpu->fill_random_words({ref.data(), words, word0, 99});
  auto d = gpu->alloc(words * 4);
  gpu->fill_random_words({static_cast<uint32_t*>(d->data()), words, word0, 99});
  std::vector<uint32_t> got(words);
  gpu->download(got.data(), *d, 0, words * 4);
  EXPECT_EQ(got, ref);  // bit-identical
}

// Two chains on two streams (side_begin / side_end / side_join), run directly and as a
// captured graph replayed on new input: the result is the in-order (CPU) result. rows 1 takes
// the streaming projection kernel, rows 8 cuBLAS (the side stream has its own handle).
TEST_F(CudaOps, SideStreamForkJoinDirectAndCaptured) {
  const int64_t in = 4096, out = 2048;
  for (int64_t rows : {1, 8}) {
    auto w1 = random(out * in, 1.0f / 64), w2 = random(out * in, 1.0f / 64), w3 = random(out * out, 1.0f / 45);
    auto norm_w = random(out);
    auto d_w1 = to_gpu_bf16(w1), d_w2 = to_gpu_bf16(w2), d_w3 = to_gpu_bf16(w3), d_nw = to_gpu_bf16(norm_w);
    auto d_x = gpu->alloc(rows * in * 2);
    auto d_y1 = poisoned_bf16(rows * out), d_y2 = poisoned_bf16(rows * out), d_z = poisoned_bf16(rows * out);
    // main: y1 = x W1^T; side: y2 = rms_norm(x W2^T); main: z = y1 W3^T; join; z += y2.
    auto issue = [&](ops::Backend& b, const void* x, void* y1, void* y2, void* z, const void* pw1, const void* pw2,
                     const void* pw3, const void* pnw) {
      b.linear({x, pw1, y1, rows, in, out, in, out});
      b.side_begin();
      b.linear({x, pw2, y2, rows, in, out, in, out});
      b.rms_norm({y2, pnw, y2, rows, out, out, out, 1e-6f});
      b.side_end();
      b.linear({y1, pw3, z, rows, out, out, out, out});
      b.side_join();
      b.add({z, y2, rows * out});
    };
    auto reference = [&](const std::vector<float>& x) {
      std::vector<float> y1(rows * out), y2(rows * out), z(rows * out);
      issue(*cpu, x.data(), y1.data(), y2.data(), z.data(), w1.data(), w2.data(), w3.data(), norm_w.data());
      return z;
    };
    auto upload_x = [&](const std::vector<float>& x) {
      std::vector<uint16_t> bits(x.size());
      for (size_t i = 0; i < x.size(); ++i) bits[i] = f32_to_bf16(x[i]);
      gpu->upload(*d_x, 0, bits.data(), bits.size() * 2);
    };
    auto x = random(rows * in);
    upload_x(x);
    issue(*gpu, d_x->data(), d_y1->data(), d_y2->data(), d_z->data(), d_w1->data(), d_w2->data(), d_w3->data(),
          d_nw->data());
    // y1 and y2 are rounded to bf16 on the GPU only (relative 2^-9 each): well inside 1e-2.
    expect_close(from_gpu_bf16(*d_z, rows * out), reference(x), "side stream, direct", Check::kBoundOnly);

    gpu->begin_capture();
    issue(*gpu, d_x->data(), d_y1->data(), d_y2->data(), d_z->data(), d_w1->data(), d_w2->data(), d_w3->data(),
          d_nw->data());
    auto graph = gpu->end_capture();
    ASSERT_NE(graph, nullptr);
    auto x2 = random(rows * in);
    upload_x(x2);
    std::vector<uint16_t> nan(rows * out, 0x7fc0);
    gpu->upload(*d_z, 0, nan.data(), nan.size() * 2);
    gpu->upload(*d_y2, 0, nan.data(), nan.size() * 2);
    gpu->replay(*graph);
    expect_close(from_gpu_bf16(*d_z, rows * out), reference(x2), "side stream, graph replay", Check::kBoundOnly);
  }
}

}  // namespace
}  // namespace moeserve
