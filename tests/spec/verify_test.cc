// Verification: greedy keeps the longest prefix of drafts the target's argmax agrees with, plus
// the target's next token; sampled verification (rejection sampling with a point-mass draft)
// draws each token from the target distribution exactly. The sampled test is statistical: a
// chi-square over 2 x 10^5 draws (fixed seeds) on an 8-token vocabulary, against the exact
// distribution and against the plain sampler's draws.
#include "spec/verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/cpu/sampling.h"
#include "core/error.h"

namespace moeserve::spec {
namespace {

using Tokens = std::vector<int32_t>;
constexpr int64_t kVocab = 8;
constexpr int64_t kDraws = 200000;

TEST(VerifyGreedy, LongestMatchingPrefixThenTheTargetsToken) {
  // Rows: the target's argmax after the last token, after draft 1, after draft 2, after draft 3.
  Verdict all = verify_greedy(Tokens{4, 5, 6}, Tokens{4, 5, 6, 7});
  EXPECT_EQ(all.accepted, 3);
  EXPECT_EQ(all.tokens, (Tokens{4, 5, 6, 7}));  // the bonus token after the last draft
  Verdict two = verify_greedy(Tokens{4, 5, 6}, Tokens{4, 5, 1, 7});
  EXPECT_EQ(two.accepted, 2);
  EXPECT_EQ(two.tokens, (Tokens{4, 5, 1}));
  Verdict none = verify_greedy(Tokens{4, 5, 6}, Tokens{3, 5, 6, 7});
  EXPECT_EQ(none.accepted, 0);
  EXPECT_EQ(none.tokens, (Tokens{3}));  // as a plain decode step
  EXPECT_THROW(verify_greedy(Tokens{4}, Tokens{4}), Error);
}

// Softmax at `temperature` (the exact distribution, computed here without the sampler).
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& x : p) x /= total;
  return p;
}

// The chi-square quantile at probability 0.999 (Wilson-Hilferty; within 1% for df >= 3).
double chi_square_999(int df) {
  const double z = 3.090232, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic of `counts` against probabilities `p` (cells with p > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int& df) {
  double stat = 0;
  df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double expected = p[i] * static_cast<double>(n);
    stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++df;
  }
  return stat;
}

// Two-sample chi-square (equal sample sizes) of two count vectors.
double two_sample_chi_square(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int& df) {
  double stat = 0;
  df = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] + b[i] == 0) continue;
    stat += static_cast<double>((a[i] - b[i]) * (a[i] - b[i])) / static_cast<double>(a[i] + b[i]);
    ++df;
  }
  return stat;
}

const std::vector<float> kRow0 = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f, 0.7f, 1.5f};
const std::vector<float> kRow1 = {-0.3f, 1.1f, 0.4f, 0.0f, 2.2f, -0.8f, 0.9f, 0.1f};

struct Counts {
  std::vector<int64_t> first = std::vector<int64_t>(kVocab, 0);
  std::vector<int64_t> second = std::vector<int64_t>(kVocab, 0);  // when the first draft was accepted
  int64_t accepted_first = 0;
};

// 10^5+ verifications of drafts {d0, d1} over rows kRow0, kRow1 (and a bonus row).
Counts speculative_counts(const ops::SamplingOptions& options, int32_t d0, int32_t d1) {
  std::vector<float> rows = kRow0;
  rows.insert(rows.end(), kRow1.begin(), kRow1.end());
  rows.insert(rows.end(), kRow0.begin(), kRow0.end());
  Counts c;
  for (int64_t i = 0; i < kDraws; ++i) {
    ops::SamplingOptions o = options;
    o.seed = 1000 + static_cast<uint64_t>(i);
    o.step = 7;
    const Verdict v = verify_sampled(Tokens{d0, d1}, rows.data(), kVocab, o);
    EXPECT_EQ(static_cast<int64_t>(v.tokens.size()), v.accepted + 1);
    ++c.first[v.tokens[0]];
    if (v.accepted >= 1) {
      ++c.accepted_first;
      ++c.second[v.tokens[1]];
    }
  }
  return c;
}

TEST(VerifySampled, TokensFollowTheTargetDistribution) {
  const ops::SamplingOptions options{.temperature = 0.8f};
  // Draft 1 is a likely token, draft 2 an unlikely one: both branches are exercised.
  const Counts c = speculative_counts(options, /*d0=*/3, /*d1=*/5);
  const std::vector<double> p0 = softmax(kRow0, 0.8), p1 = softmax(kRow1, 0.8);
  int df = 0;
  const double first = chi_square(c.first, p0, kDraws, df);
  EXPECT_LT(first, chi_square_999(df)) << "first token";
  // Accepted with probability p0(3): the second token is drawn from row 1's distribution.
  EXPECT_NEAR(static_cast<double>(c.accepted_first) / kDraws, p0[3], 4 * std::sqrt(p0[3] * (1 - p0[3]) / kDraws));
  const double second = chi_square(c.second, p1, c.accepted_first, df);
  EXPECT_LT(second, chi_square_999(df)) << "second token";
}

TEST(VerifySampled, EqualsThePlainSamplerUnderFilters) {
  // top_k 5 and top_p 0.9 cut the row; the rejected draft's residual must respect the cut.
  const ops::SamplingOptions options{.temperature = 1.0f, .top_k = 5, .top_p = 0.9f};
  const Counts c = speculative_counts(options, /*d0=*/0, /*d1=*/4);
  std::vector<int64_t> plain(kVocab, 0);
  for (int64_t i = 0; i < kDraws; ++i) {
    ops::SamplingOptions o = options;
    o.seed = 5000000 + static_cast<uint64_t>(i);
    ++plain[cpu::sample_row(kRow0.data(), kVocab, o)];
  }
  int df = 0;
  const double stat = two_sample_chi_square(c.first, plain, df);
  EXPECT_LT(stat, chi_square_999(df));
  const cpu::TokenDistribution p = cpu::row_distribution(kRow0.data(), kVocab, options);
  std::vector<double> exact(kVocab, 0.0);
  for (size_t i = 0; i < p.ids.size(); ++i) exact[p.ids[i]] = p.probs[i];
  EXPECT_LT(chi_square(c.first, exact, kDraws, df), chi_square_999(df));
  EXPECT_EQ(c.first[2] + c.first[5], 0);  // outside top_k
}

// Whatever is drafted, each token is the plain sampler's draw at its step: a step with drafts
// and a plain step at the same seed and step agree token for token (so the adaptive draft
// budget, which changes a step's drafts, cannot change a seeded request's output).
TEST(VerifySampled, EachTokenIsThePlainDrawAtItsStep) {
  std::vector<float> rows = kRow0;
  rows.insert(rows.end(), kRow1.begin(), kRow1.end());
  rows.insert(rows.end(), kRow0.begin(), kRow0.end());
  int64_t accepted = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    const ops::SamplingOptions o{.temperature = 0.9f, .top_p = 0.95f, .seed = seed, .step = 5};
    const int32_t d0 = static_cast<int32_t>(seed % kVocab), d1 = static_cast<int32_t>((seed / kVocab) % kVocab);
    const Verdict v = verify_sampled(Tokens{d0, d1}, rows.data(), kVocab, o);
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      ops::SamplingOptions plain = o;
      plain.step = o.step + i;
      ASSERT_EQ(v.tokens[i], cpu::sample_row(rows.data() + i * kVocab, kVocab, plain))
          << "seed " << seed << " token " << i;
    }
    ASSERT_EQ(verify_sampled(Tokens{}, rows.data(), kVocab, o).tokens, (Tokens{v.tokens[0]})) << "seed " << seed;
    accepted += v.accepted;
  }
  EXPECT_GT(accepted, 100);  // drafts were accepted, and not only rejected
}

TEST(VerifySampled, ReproducibleFromTheSeedAndGreedyAtTemperatureZero) {
  std::vector<float> rows = kRow0;
  rows.insert(rows.end(), kRow1.begin(), kRow1.end());
  const ops::SamplingOptions o{.temperature = 1.0f, .seed = 42, .step = 3};
  std::map<std::vector<int32_t>, int> seen;
  for (int i = 0; i < 3; ++i) ++seen[verify_sampled(Tokens{3}, rows.data(), kVocab, o).tokens];
  EXPECT_EQ(seen.size(), 1u);
  const Verdict greedy = verify_sampled(Tokens{3}, rows.data(), kVocab, {});
  EXPECT_EQ(greedy.tokens, (Tokens{3, 4}));  // argmax of row 0 is 3, of row 1 is 4
  const Verdict rejected = verify_sampled(Tokens{0}, rows.data(), kVocab, {});
  EXPECT_EQ(rejected.tokens, (Tokens{3}));
}

}  // namespace
}  // namespace moeserve::spec
