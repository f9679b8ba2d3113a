// Properties of the CPU reference ops that the transformers parity suite does not isolate:
// group-limited routing against brute force, and the sampler's filters and seeding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/random.h"

namespace moeserve {

TEST(MoeRoute, GroupLimitedTopKMatchesBruteForce) {
  auto backend = cpu::make_cpu_backend();
  const int64_t tokens = 64, hidden = 16, experts = 32, n_group = 8, topk_group = 3, top_k = 6;
  std::vector<float> x(tokens * hidden), w(experts * hidden), bias(experts);
  for (size_t i = 0; i < x.size(); ++i) x[i] = uniform_pm1(1, i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = uniform_pm1(2, i);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.3f * uniform_pm1(3, i);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  backend->moe_route({x.data(), w.data(), bias.data(), ids.data(), weights.data(), tokens, hidden, experts, n_group,
                      topk_group, top_k, true, 2.5f});
  const int64_t gsize = experts / n_group;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> score(experts), choice(experts);
    for (int64_t e = 0; e < experts; ++e) {
      const float logit = cpu::dot(w.data() + e * hidden, x.data() + t * hidden, hidden);
      score[e] = 1.0f / (1.0f + std::exp(-logit));
      choice[e] = score[e] + bias[e];
    }
    // Brute force: best top_k over every allowed combination of topk_group groups.
    std::vector<std::pair<float, int>> groups;
    for (int g = 0; g < n_group; ++g) {
      std::vector<float> s(choice.begin() + g * gsize, choice.begin() + (g + 1) * gsize);
      std::sort(s.rbegin(), s.rend());
      groups.push_back({s[0] + s[1], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    std::vector<std::pair<float, int>> allowed;
    for (int i = 0; i < topk_group; ++i)
      for (int e = groups[i].second * gsize; e < (groups[i].second + 1) * gsize; ++e) allowed.push_back({choice[e], e});
    std::sort(allowed.rbegin(), allowed.rend());
    std::set<int> expected, got;
    float denom = 0;
    for (int k = 0; k < top_k; ++k) {
      expected.insert(allowed[k].second);
      denom += score[allowed[k].second];
    }
    for (int k = 0; k < top_k; ++k) {
      const int e = ids[t * top_k + k];
      got.insert(e);
      // Weights use the unbiased score, normalised over the selection, then scaled.
      EXPECT_NEAR(weights[t * top_k + k], score[e] / denom * 2.5f, 1e-5f);
    }
    EXPECT_EQ(got, expected) << "token " << t;
  }
}

TEST(Sampler, GreedyAndFilters) {
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f, 2.0f};
  ops::SamplingOptions greedy;
  EXPECT_EQ(cpu::sample_row(logits.data(), 5, greedy), 1);
  ops::SamplingOptions top1{1.0f, 1};
  EXPECT_EQ(cpu::sample_row(logits.data(), 5, top1), 1);
  // top_k = 2 only ever draws ids 1 and 2; min_p = 0.5 drops ids whose probability is
  // below half the top one (ids 0, 3; id 4 has e^-1 ~ 0.37 < 0.5).
  std::set<int> seen_topk, seen_minp;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    ops::SamplingOptions k2{1.0f, 2, 1.0f, 0.0f, seed, 0};
    seen_topk.insert(cpu::sample_row(logits.data(), 5, k2));
    ops::SamplingOptions minp{1.0f, 0, 1.0f, 0.5f, seed, 0};
    seen_minp.insert(cpu::sample_row(logits.data(), 5, minp));
  }
  EXPECT_EQ(seen_topk, (std::set<int>{1, 2}));
  EXPECT_EQ(seen_minp, (std::set<int>{1, 2}));
  // top_p: probabilities ~ [0.03, 0.45, 0.41, 0.01, 0.10]; 0.5 of the mass needs ids 1 and 2.
  std::set<int> seen_topp;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    ops::SamplingOptions p{1.0f, 0, 0.5f, 0.0f, seed, 0};
    seen_topp.insert(cpu::sample_row(logits.data(), 5, p));
  }
  EXPECT_EQ(seen_topp, (std::set<int>{1, 2}));
}

// The definition sample_row implements, written the direct way: every candidate sorted,
// probabilities normalised over the top-k set (the vocabulary without top_k).
int32_t sample_by_full_sort(const std::vector<float>& logits, const ops::SamplingOptions& o) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int64_t keep = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
  std::vector<double> probs(keep);
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += probs[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / o.temperature);
  for (auto& q : probs) q /= total;
  if (o.min_p > 0.0f)
    while (keep > 1 && probs[keep - 1] < o.min_p * probs[0]) --keep;
  if (o.top_p < 1.0f) {
    double cumulative = 0.0;
    int64_t needed = 0;
    while (needed < keep && (cumulative += probs[needed++]) < o.top_p) {
    }
    keep = std::max<int64_t>(needed, 1);
  }
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i) mass += probs[i];
  const double u = uniform01(o.seed, o.step) * mass;
  double cumulative = 0.0;
  for (int64_t i = 0; i < keep; ++i)
    if (u < (cumulative += probs[i])) return ids[i];
  return ids[keep - 1];
}

// A row of logits in [-spread, spread] on a 1/64 grid (many exact ties), drawn from `seed`.
std::vector<float> quantised_row(int64_t vocab, float spread, uint64_t seed) {
  std::vector<float> logits(vocab);
  for (int64_t v = 0; v < vocab; ++v)
    logits[v] = std::round(spread * uniform_pm1(seed, static_cast<uint64_t>(v)) * 64.0f) / 64.0f;
  return logits;
}

TEST(Sampler, SortsOnlyThePrefixItNeedsAndDrawsWhatTheFullSortDraws) {
  // Vocabularies past the first 1024-candidate chunk, peaked and flat rows, ties, and every
  // filter alone and together; flat rows of 20000 and 70000 entries reach the radix sort of
  // the rest of the row (ids of 15 and 17 bits). The normaliser over the whole vocabulary is
  // summed in id order rather than sorted order: equal draws except within ~1e-16 of a boundary.
  int cases = 0;
  for (int64_t vocab : {5, 3000, 20000, 70000})
    for (float spread : {0.5f, 8.0f})
      for (int variant = 0; variant < 12; ++variant) {
        const std::vector<float> logits = quantised_row(vocab, spread, 7 + variant);
        const int32_t top_k = std::vector<int32_t>{0, 0, 50, 2000}[variant % 4];
        const float top_p = std::vector<float>{1.0f, 0.9f, 0.3f}[variant % 3];
        const float min_p = variant % 5 == 0 ? 0.05f : 0.0f;
        for (uint64_t step = 0; step < 20; ++step) {
          const ops::SamplingOptions o{0.8f, top_k, top_p, min_p, 11, step};
          EXPECT_EQ(cpu::sample_row(logits.data(), vocab, o), sample_by_full_sort(logits, o))
              << "vocab " << vocab << " spread " << spread << " top_k " << top_k << " top_p " << top_p << " min_p "
              << min_p << " step " << step;
          ++cases;
        }
      }
  EXPECT_EQ(cases, 4 * 2 * 12 * 20);
}

// Sampling from a row's top candidates draws what sampling the whole row draws, or says it
// cannot (-1, the caller then samples the row): never a different token. With every entry a
// candidate it never falls back; peaked rows with the usual filters rarely do.
TEST(Sampler, CandidatesDrawWhatTheFullRowDrawsOrFallBack) {
  int compared = 0, fell_back = 0;
  for (int64_t vocab : {50, 3000, 20000})
    for (float spread : {0.5f, 12.0f})
      for (int variant = 0; variant < 12; ++variant) {
        const std::vector<float> logits = quantised_row(vocab, spread, 19 + variant);
        const int32_t top_k = std::vector<int32_t>{0, 0, 40, 400}[variant % 4];
        const float top_p = std::vector<float>{1.0f, 0.9f, 0.5f}[variant % 3];
        const float min_p = variant % 5 == 0 ? 0.05f : 0.0f;
        const float temperature = variant % 2 ? 0.7f : 1.0f;
        for (int64_t count : {std::min<int64_t>(64, vocab), vocab}) {
          std::vector<float> values(count);
          std::vector<int32_t> ids(count);
          double normaliser = 0;
          cpu::top_candidates_row(logits.data(), vocab, count, temperature, values.data(), ids.data(), &normaliser);
          EXPECT_EQ(values[0], *std::max_element(logits.begin(), logits.end()));
          for (uint64_t step = 0; step < 10; ++step) {
            const ops::SamplingOptions o{temperature, top_k, top_p, min_p, 5, step};
            const int32_t got = cpu::sample_candidates({values.data(), ids.data(), count, normaliser}, vocab, o);
            if (got < 0) {
              EXPECT_LT(count, vocab) << "a complete candidate list never falls back";
              ++fell_back;
              continue;
            }
            EXPECT_EQ(got, cpu::sample_row(logits.data(), vocab, o))
                << "vocab " << vocab << " spread " << spread << " variant " << variant << " count " << count;
            ++compared;
          }
        }
      }
  // Peaked rows (spread 12) with 64 candidates mostly suffice; flat ones often do not.
  EXPECT_GT(compared, 3 * 2 * 12 * 10);
  EXPECT_GT(fell_back, 0);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = [0.25, 0.75]
  int ones = 0;
  const int draws = 4000;
  for (int step = 0; step < draws; ++step) {
    ops::SamplingOptions o{1.0f, 0, 1.0f, 0.0f, 42, static_cast<uint64_t>(step)};
    const int a = cpu::sample_row(logits.data(), 2, o);
    EXPECT_EQ(a, cpu::sample_row(logits.data(), 2, o));
    ones += a;
  }
  // Binomial(4000, 0.75): sd ~ 27; 5 sd.
  EXPECT_NEAR(ones, 3000, 140);
}

}  // namespace moeserve

namespace moeserve {

TEST(ArgmaxRows, FirstMaximumWithIdOffset) {
  auto backend = cpu::make_cpu_backend();
  const std::vector<float> logits = {0.5f,  2.0f,  2.0f,  -1.0f,  // tie: the first (id 1)
                                     -3.0f, -2.0f, -2.5f, -9.0f};
  std::vector<float> values(2);
  std::vector<int32_t> ids(2);
  backend->argmax_rows({logits.data(), values.data(), ids.data(), 2, 4, 100});
  EXPECT_EQ(ids, (std::vector<int32_t>{101, 101}));  // row ids are per row: offset + column
  EXPECT_EQ(values, (std::vector<float>{2.0f, -2.0f}));
}

}  // namespace moeserve
