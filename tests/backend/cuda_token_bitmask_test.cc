// The CUDA token-bitmask kernel against the CPU op (label: gpu): the same logits bit for bit
// (masked ids -inf, the rest untouched) on random masks, whole rows and vocab parts that start
// inside a mask word, up to the 163840 ids of the Kimi / DeepSeek vocabularies.
#include <random>

#include "tests/backend/cuda_test_fixture.h"

namespace moeserve {
namespace {

class CudaTokenBitmask : public CudaOps {};

TEST_F(CudaTokenBitmask, MatchesTheCpu) {
  std::mt19937 rng(3);
  for (int64_t vocab : {33, 1000, 129280, 163840})
    for (int64_t parts : {1, 2, 8}) {
      const int64_t rows = 5, words = (vocab + 31) / 32, width = vocab / parts;
      std::vector<int32_t> mask(static_cast<size_t>(rows * words));
      for (int32_t& w : mask) w = static_cast<int32_t>(rng() & rng());
      std::fill_n(mask.begin() + 2 * words, words, -1);  // row 2: unconstrained
      auto d_mask = to_gpu_raw(mask);
      for (int64_t k = 0; k < parts; ++k) {
        std::vector<float> logits = random(static_cast<size_t>(rows * width), 4.0f);
        std::vector<float> want = logits;
        cpu->apply_token_bitmask({want.data(), mask.data(), rows, width, words, k * width});
        auto d_logits = to_gpu_raw(logits);
        gpu->apply_token_bitmask({static_cast<float*>(d_logits->data()), static_cast<const int32_t*>(d_mask->data()),
                                  rows, width, words, k * width});
        const std::vector<float> got = from_gpu_f32(*d_logits, logits.size());
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << ", part " << k << " of " << parts);
        EXPECT_EQ(got, want);
        EXPECT_TRUE(std::equal(got.begin() + 2 * width, got.begin() + 3 * width, logits.begin() + 2 * width));
      }
    }
}

}  // namespace
}  // namespace moeserve
