// Speculative decoding (NGRAM) is lossless: under single, tp2, ep2, pp2 (two pipeline groups in
// flight), ep2-dp and ep2tp2 on CPU ranks, requests arriving over time -- speculative and not,
// of different lengths, prompts with repetition so that drafts are accepted, chunked prefill
// and the prefix cache on -- get token for token the greedy outputs of the plain single-rank
// loop. Sampled speculative requests are reproducible from their seed. After the load every
// KV page is free or only cached, and flushing the prefix cache frees them all.
#include <gtest/gtest.h>

#include "tests/runtime/speculative_load.h"

namespace moeserve::runtime {
namespace {

using namespace testing_load;

const std::vector<Arrival>& arrivals() {
  static const std::vector<Arrival> a = {
      {0, {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7}, 24},
      {0, {1, 2, 1, 2, 1, 2, 1}, 16, false},
      {1, {100, 200, 300, 400, 100, 200, 300, 400, 100, 200}, 20},
      {3, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28}, 12},
      {4, {42}, 18},
      {6, {5, 6, 7, 8, 5, 6, 7, 8, 9, 9, 9, 9}, 22, false},
      {9, {9, 9, 9, 9, 9, 9}, 14},
      {9, {300, 301, 300, 301, 300}, 9},
  };
  return a;
}

// Fixed drafts: the accept counts below do not depend on the machine's timing.
spec::SpeculativeOptions ngram(int64_t draft_tokens) {
  return spec::speculative_options({.algorithm = "NGRAM", .num_draft_tokens = draft_tokens, .fixed_drafts = true});
}

const LoadResult& reference() {
  static const LoadResult r = [] {
    Engine engine(open_model("synthetic:tiny"), engine_options("single"));
    return run_load(engine, {}, arrivals());
  }();
  return r;
}

class SpeculativePlans : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativePlans, GreedyOutputsEqualThePlainLoop) {
  Engine engine(open_model("synthetic:tiny"), engine_options(GetParam()));
  const LoadResult spec = run_load(engine, ngram(5), arrivals());
  ASSERT_EQ(spec.tokens.size(), arrivals().size());
  for (const auto& [id, tokens] : reference().tokens)
    EXPECT_EQ(spec.tokens.at(id), tokens) << GetParam() << ": request " << id;
  EXPECT_GT(spec.accepted, 0) << "no draft was accepted: the test would not exercise verification";
  EXPECT_LT(spec.accepted, spec.drafted);  // and rejections happened too
}

INSTANTIATE_TEST_SUITE_P(CpuRanks, SpeculativePlans,
                         ::testing::Values("single", "tp2", "ep2", "pp2", "ep2-dp", "ep2tp2"), [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(SpeculativeSampling, ReproducibleFromTheSeedBesidePlainRequests) {
  std::vector<Arrival> load = arrivals();
  for (size_t i = 0; i < load.size(); i += 2) load[i].sampling = {.temperature = 0.7f, .top_p = 0.95f, .seed = 11 + i};
  Engine engine(open_model("synthetic:tiny"), engine_options("single"));
  const LoadResult a = run_load(engine, ngram(4), load), b = run_load(engine, ngram(4), load);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.drafted, 0);
  // Greedy requests beside sampled ones are unchanged.
  for (size_t i = 1; i < load.size(); i += 2) EXPECT_EQ(a.tokens.at(i), reference().tokens.at(i)) << "request " << i;
}

// The adaptive draft budget (the flags' default) changes each step's drafts from measured
// step costs, so what it picks depends on the machine; the outputs must not: greedy ones equal
// the plain loop's, seeded sampled ones the fixed budget's and the plain loop's, token for
// token (each token is the plain draw at its step, spec/verify.h).
TEST(SpeculativeAdaptive, OutputsDoNotDependOnTheDraftsChosen) {
  std::vector<Arrival> load = arrivals();
  for (size_t i = 0; i < load.size(); i += 2) load[i].sampling = {.temperature = 0.7f, .top_p = 0.95f, .seed = 11 + i};
  const spec::SpeculativeOptions adaptive = spec::speculative_options({.algorithm = "NGRAM", .num_draft_tokens = 5});
  ASSERT_TRUE(adaptive.adaptive);
  for (const char* plan : {"single", "ep2-dp"}) {
    Engine engine(open_model("synthetic:tiny"), engine_options(plan));
    const LoadResult plain = run_load(engine, {}, load), fixed = run_load(engine, ngram(5), load),
                     chosen = run_load(engine, adaptive, load);
    EXPECT_GT(fixed.drafted, 0) << plan;
    for (size_t i = 0; i < load.size(); ++i) {
      EXPECT_EQ(chosen.tokens.at(i), plain.tokens.at(i)) << plan << ": request " << i;
      EXPECT_EQ(fixed.tokens.at(i), plain.tokens.at(i)) << plan << ": request " << i;
      if (i % 2 == 1) {
        EXPECT_EQ(plain.tokens.at(i), reference().tokens.at(i)) << plan << ": request " << i;
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::runtime
