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
  c.max_pages = *std::max_element(pages_of.begin(), pages_of.end());
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

// One batch of every kind of context: a single row, a tile boundary (31, 32, 33 rows), one
// tile short of a page, long ones cut over many SMs, and a prefill run whose tokens see 1 ..
// 40 rows of their shared sequence.
TEST_F(CudaOps, MlaDecodeMixedContextsInOneBatch) {
  check_mla_attention(paged_case(64, 64, {39999, 0, 30, 31, 32, 1000, 4095, 16, 12000}, 40),
                      "mla_decode (mixed contexts, 64 heads)");
}

// A batch of one: its context spread over every SM (at 40000 rows ~10 tiles a block, the
// combine merging one piece per SM) or over too few tiles to fill them.
TEST_F(CudaOps, MlaDecodeOneSequenceAlone) {
  for (int32_t position : {0, 32, 511, 39999}) {
    SCOPED_TRACE(testing::Message() << "position " << position);
    check_mla_attention(paged_case(64, 64, {position}), "mla_decode (batch of one)");
  }
}

// 128 heads (two groups of 64 per token, DeepSeek-V3 on one GPU) and page sizes 1, 16 and 128:
// tiles that span pages and pages that span tiles.
TEST_F(CudaOps, MlaDecodeHeadGroupsAndPageSizes) {
  for (int64_t page_size : {1, 16, 128}) {
    SCOPED_TRACE(testing::Message() << "page size " << page_size);
    check_mla_attention(paged_case(128, page_size, {0, 63, 64, 65, 2047, 300}, 5), "mla_decode (128 heads)");
  }
}

// A decode batch of 32 equal contexts: several whole sequences per block and none cut, or
// cut at uneven places (1024 rows: 32 tiles each, 1024 tiles over the SMs).
TEST_F(CudaOps, MlaDecodeBatchOfEqualContexts) {
  for (int32_t position : {100, 1023}) {
    SCOPED_TRACE(testing::Message() << "position " << position);
    check_mla_attention(paged_case(64, 64, std::vector<int32_t>(32, position)), "mla_decode (batch of 32)");
  }
}

}  // namespace
}  // namespace moeserve
