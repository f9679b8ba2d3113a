// The tiled MLA decode kernel (backend/cuda/mla_decode.cu: all 64 heads of a group per block,
// the context's tiles spread evenly over the SMs, cut sequences merged by the combine kernel)
// against the CPU reference: contexts 1 .. 40000, mixed in one batch, 64 and 128 heads, the
// page sizes the engine uses.
#include <algorithm>
#include <map>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

// A batch of decoding sequences (one token each, at `positions`) plus, optionally, a prefill
// run of `prefill` tokens of one more sequence at 0 .. prefill - 1; every sequence's pages are
// scattered over one pool holding just the pages needed.
MlaAttentionCase paged_case(int64_t heads, int64_t page_size, const std::vector<int32_t>& positions,
                            int32_t prefill = 0) {
  MlaAttentionCase c{heads, 512, 64, 128, page_size, 0, 0, positions, {}, {}, 0.1f};
  std::vector<int64_t> pages_of;  // per sequence
  for (size_t i = 0; i < positions.size(); ++i) {
    c.seq_of.push_back(static_cast<int32_t>(i));
    pages_of.push_back(positions[i] / page_size + 1);
  }
  if (prefill > 0) {
    for (int32_t p = 0; p < prefill; ++p) {
      c.positions.push_back(p);
      c.seq_of.push_back(static_cast<int32_t>(pages_of.size()));
    }
    pages_of.push_back((prefill - 1) / page_size + 1);
  }
  // Block tables of at least 4096 rows per sequence: the tiled kernel takes such batches
  // (mla_attention.cu kTiledMinContext).
  c.max_pages = std::max(*std::max_element(pages_of.begin(), pages_of.end()), (4096 + page_size - 1) / page_size);
  for (int64_t n : pages_of) c.cache_pages += n;
  // Page k of the pool goes to the (k * 7919 mod pool)-th slot of the sequences' pages in
  // order: a permutation (7919 is a prime larger than every pool here, so coprime to it).
  c.tables.assign(pages_of.size() * c.max_pages, 0);
  int64_t k = 0;
  for (size_t s = 0; s < pages_of.size(); ++s)
    for (int64_t j = 0; j < pages_of[s]; ++j, ++k)
      c.tables[s * c.max_pages + j] = static_cast<int32_t>((k * 7919) % c.cache_pages);
  return c;
}

// Its own suite (gtest wants one fixture class per suite, and CudaOps is per file).
class CudaMlaDecode : public CudaOps {
 protected:
  void check_fp8_attention(const MlaAttentionCase& c, float cache_scale, const char* what);
};

// One batch of every kind of context: a single row, a tile boundary (31, 32, 33 rows), one
// tile short of a page, long ones cut over many SMs, and a prefill run whose tokens see 1 ..
// 40 rows of their shared sequence.
TEST_F(CudaMlaDecode, MlaDecodeMixedContextsInOneBatch) {
  check_mla_attention(paged_case(64, 64, {39999, 0, 30, 31, 32, 1000, 4095, 16, 12000}, 40),
                      "mla_decode (mixed contexts, 64 heads)");
}

// A batch of one: its context spread over every SM (at 40000 rows ~10 tiles a block, the
// combine merging one piece per SM) or over too few tiles to fill them.
TEST_F(CudaMlaDecode, MlaDecodeOneSequenceAlone) {
  for (int32_t position : {0, 32, 511, 39999}) {
    SCOPED_TRACE(testing::Message() << "position " << position);
    check_mla_attention(paged_case(64, 64, {position}), "mla_decode (batch of one)");
  }
}

// 128 heads (two groups of 64 per token, DeepSeek-V3 on one GPU) and page sizes 1, 16 and 128:
// tiles that span pages and pages that span tiles.
TEST_F(CudaMlaDecode, MlaDecodeHeadGroupsAndPageSizes) {
  for (int64_t page_size : {1, 16, 128}) {
    SCOPED_TRACE(testing::Message() << "page size " << page_size);
    check_mla_attention(paged_case(128, page_size, {0, 63, 64, 65, 2047, 300}, 5), "mla_decode (128 heads)");
  }
}

// A decode batch of 32 equal contexts: several whole sequences per block and none cut, or
// cut at uneven places (1024 rows: 32 tiles each, 1024 tiles over the SMs).
TEST_F(CudaMlaDecode, MlaDecodeBatchOfEqualContexts) {
  for (int32_t position : {100, 1023}) {
    SCOPED_TRACE(testing::Message() << "position " << position);
    check_mla_attention(paged_case(64, 64, std::vector<int32_t>(32, position)), "mla_decode (batch of 32)");
  }
}

// fp8 cache (--kv-cache-dtype fp8_e4m3): the CPU reference reads the codes' values (exact
// floats) with the scale, the GPU the codes themselves. Values up to 3 / scale = 12 in codes:
// normal and subnormal e4m3 values alike.

void CudaMlaDecode::check_fp8_attention(const MlaAttentionCase& c, float cache_scale, const char* what) {
  CudaMlaDecode& f = *this;
  const int64_t tokens = static_cast<int64_t>(c.positions.size()), qk = c.nope + c.rope;
  auto q_lat = f.random(tokens * c.heads * c.latent), q = f.random(tokens * c.heads * qk);
  auto raw = f.random(c.cache_pages * c.page_size * (c.latent + c.rope), 3.0f);
  std::vector<uint8_t> codes(raw.size());
  std::vector<float> code_values(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    codes[i] = f32_to_f8_e4m3(raw[i] / cache_scale);
    code_values[i] = f8_e4m3_to_f32(codes[i]);
  }
  std::vector<float> att(tokens * c.heads * c.latent);
  f.cpu->mla_attention({q_lat.data(), q.data(), code_values.data(), c.tables.data(), c.seq_of.data(),
                        c.positions.data(), att.data(), tokens, c.heads, c.latent, c.rope, qk, c.nope, c.page_size,
                        c.max_pages, c.scale, true, cache_scale});
  auto d_ql = f.to_gpu_bf16(q_lat), d_q = f.to_gpu_bf16(q), d_c = f.to_gpu_raw(codes);
  auto d_out = f.poisoned_bf16(att.size());
  auto d_t = f.to_gpu_raw(c.tables), d_s = f.to_gpu_raw(c.seq_of), d_p = f.to_gpu_raw(c.positions);
  f.gpu->mla_attention({d_ql->data(), d_q->data(), d_c->data(), static_cast<int32_t*>(d_t->data()),
                        static_cast<int32_t*>(d_s->data()), static_cast<int32_t*>(d_p->data()), d_out->data(), tokens,
                        c.heads, c.latent, c.rope, qk, c.nope, c.page_size, c.max_pages, c.scale, true, cache_scale});
  f.expect_close(f.from_gpu_bf16(*d_out, att.size()), att, what);
}

TEST_F(CudaMlaDecode, MlaDecodeFp8CacheMixedContexts) {
  check_fp8_attention(paged_case(64, 64, {39999, 0, 31, 32, 1000, 4095}, 20), 0.25f, "mla_decode fp8 (mixed contexts)");
  check_fp8_attention(paged_case(128, 16, {0, 63, 64, 2047}, 3), 1.0f, "mla_decode fp8 (128 heads)");
}

// kv_write into an fp8 cache against the CPU backend's: the same code for every element,
// including saturated ones (|entry / scale| beyond 448) and subnormals.
TEST_F(CudaMlaDecode, KvWriteFp8MatchesCpuRounding) {
  const int64_t width = 576, tokens = 5;
  const float cache_scale = 0.5f;
  auto entries = random(tokens * width, 300.0f);
  entries[0] = 1e-3f, entries[1] = -2e-3f, entries[2] = 224.5f, entries[3] = -1e30f;
  for (float& e : entries) e = round_to_bf16(e);
  std::vector<int32_t> slots = {7, 130, 64, 0, 191};
  std::vector<float> ref(3 * 64 * width, 0.0f);
  cpu->kv_write({entries.data(), slots.data(), ref.data(), tokens, width, true, cache_scale});
  auto d_e = to_gpu_bf16(entries), d_s = to_gpu_raw(slots);
  auto d_c = to_gpu_raw(std::vector<uint8_t>(ref.size(), 0));
  gpu->kv_write({d_e->data(), static_cast<int32_t*>(d_s->data()), d_c->data(), tokens, width, true, cache_scale});
  std::vector<uint8_t> got(ref.size());
  gpu->download(got.data(), *d_c, 0, got.size());
  int64_t mismatches = 0;
  for (size_t i = 0; i < ref.size(); ++i) mismatches += f8_e4m3_to_f32(got[i]) != ref[i];
  EXPECT_EQ(mismatches, 0) << "of " << ref.size() << " cache bytes";
  EXPECT_EQ(got[7 * width + 3], 0xfe) << "-1e30 / 0.5 saturates to -448";
}

}  // namespace
}  // namespace moeserve
