// The CPU token-bitmask op (structured output) against xgrammar's own CPU implementation
// (ApplyTokenBitmaskInplaceCPU, the oracle) on random masks: whole rows, a vocab split into
// parts (each masks its own ids), vocabularies that are not a multiple of 32, and rows whose
// mask allows every id (left exactly as they were).
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>
#include <xgrammar/matcher.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace moeserve {
namespace {

std::vector<float> xgrammar_masked(std::vector<float> logits, std::vector<int32_t> mask, int64_t rows, int64_t vocab) {
  const int64_t words = (vocab + 31) / 32;
  int64_t logit_shape[2] = {rows, vocab}, mask_shape[2] = {rows, words};
  int64_t logit_strides[2] = {vocab, 1}, mask_strides[2] = {words, 1};  // xgrammar reads strides[0]
  DLTensor l{logits.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, logit_shape, logit_strides, 0};
  DLTensor m{mask.data(), {kDLCPU, 0}, 2, {kDLInt, 32, 1}, mask_shape, mask_strides, 0};
  xgrammar::ApplyTokenBitmaskInplaceCPU(&l, m, static_cast<int>(vocab));
  return logits;
}

struct Case {
  std::vector<float> logits;
  std::vector<int32_t> mask;
};

Case random_case(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t words = (vocab + 31) / 32;
  Case c{std::vector<float>(static_cast<size_t>(rows * vocab)),
         std::vector<int32_t>(static_cast<size_t>(rows * words))};
  for (float& x : c.logits) x = normal(rng);
  for (int32_t& w : c.mask) w = static_cast<int32_t>(rng() & rng());                // about a quarter of ids allowed
  for (int64_t w = 0; w < words; ++w) c.mask[static_cast<size_t>(words + w)] = -1;  // row 1: unconstrained
  return c;
}

TEST(CpuTokenBitmask, MatchesXgrammarOverWholeRows) {
  auto cpu = cpu::make_cpu_backend();
  for (int64_t vocab : {1, 31, 32, 33, 1000, 163840}) {
    const int64_t rows = 3, words = (vocab + 31) / 32;
    Case c = random_case(rows, vocab, static_cast<uint32_t>(vocab));
    const std::vector<float> want = xgrammar_masked(c.logits, c.mask, rows, vocab);
    std::vector<float> got = c.logits;
    cpu->apply_token_bitmask({got.data(), c.mask.data(), rows, vocab, words, 0});
    EXPECT_EQ(got, want) << "vocab " << vocab;
    EXPECT_TRUE(std::equal(got.begin() + vocab, got.begin() + 2 * vocab, c.logits.begin() + vocab));
  }
}

TEST(CpuTokenBitmask, EachVocabPartMasksItsOwnIds) {
  auto cpu = cpu::make_cpu_backend();
  const int64_t rows = 3, vocab = 1000, words = (vocab + 31) / 32;
  Case c = random_case(rows, vocab, 7);
  const std::vector<float> want = xgrammar_masked(c.logits, c.mask, rows, vocab);
  for (int64_t parts : {2, 4, 8}) {  // 1000 / 8 = 125: parts that start inside a mask word
    const int64_t width = vocab / parts;
    for (int64_t k = 0; k < parts; ++k) {
      std::vector<float> part(static_cast<size_t>(rows * width));
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(c.logits.begin() + r * vocab + k * width, width, part.begin() + r * width);
      cpu->apply_token_bitmask({part.data(), c.mask.data(), rows, width, words, k * width});
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < width; ++i)
          ASSERT_EQ(part[r * width + i], want[r * vocab + k * width + i])
              << "part " << k << " row " << r << " id " << i;
    }
  }
}

}  // namespace
}  // namespace moeserve
