// The speculative flags: SGLang's names, chains of num_steps + 1 verified tokens, and a clear
// refusal of the algorithms not implemented yet.
#include "spec/speculative_options.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace moeserve::spec {
namespace {

std::string error_of(const SpeculativeFlags& flags) {
  try {
    speculative_options(flags);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpeculativeOptions, OffByDefault) {
  const SpeculativeOptions o = speculative_options({});
  EXPECT_FALSE(o.enabled());
  EXPECT_EQ(o.max_drafts(), 0);
  EXPECT_NE(error_of({.num_draft_tokens = 4}).find("--speculative-algorithm"), std::string::npos);
  EXPECT_NE(error_of({.fixed_drafts = true}).find("--speculative-algorithm"), std::string::npos);
}

// The flags' default is the adaptive draft budget; --speculative-fixed-drafts verifies the
// configured drafts every step.
TEST(SpeculativeOptions, DraftsAreAdaptiveUnlessFixed) {
  EXPECT_TRUE(speculative_options({.algorithm = "NGRAM"}).adaptive);
  EXPECT_FALSE(speculative_options({.algorithm = "NGRAM", .fixed_drafts = true}).adaptive);
  EXPECT_FALSE(SpeculativeOptions{}.adaptive);
}

TEST(SpeculativeOptions, DraftTokensAndStepsDescribeOneChain) {
  EXPECT_EQ(speculative_options({.algorithm = "NGRAM", .num_draft_tokens = 6}).max_drafts(), 5);
  EXPECT_EQ(speculative_options({.algorithm = "ngram", .num_steps = 3}).num_draft_tokens, 4);
  EXPECT_EQ(speculative_options({.algorithm = "NGRAM", .num_draft_tokens = 4, .num_steps = 3}).max_drafts(), 3);
  EXPECT_EQ(speculative_options({.algorithm = "NGRAM"}).num_draft_tokens, 5);
  EXPECT_NE(error_of({.algorithm = "NGRAM", .num_draft_tokens = 8, .num_steps = 3}).find("num_steps + 1"),
            std::string::npos);
  EXPECT_NE(error_of({.algorithm = "NGRAM", .num_draft_tokens = 1}).find("--speculative-num-draft-tokens"),
            std::string::npos);
}

TEST(SpeculativeOptions, NextnAndEagleAreTheMtpDrafter) {
  // SGLang runs DeepSeek-V3's MTP layer under either name.
  for (const char* name : {"NEXTN", "eagle"}) {
    const SpeculativeOptions o = speculative_options({.algorithm = name, .num_steps = 3});
    EXPECT_EQ(o.algorithm, Algorithm::kNextn) << name;
    EXPECT_EQ(o.max_drafts(), 3) << name;
  }
  EXPECT_STREQ(algorithm_name(Algorithm::kNextn), "NEXTN");
}

TEST(SpeculativeOptions, RefusesAlgorithmsNotImplemented) {
  for (const char* name : {"EAGLE3", "DFLASH", "STANDALONE"})
    EXPECT_NE(error_of({.algorithm = name}).find("not implemented yet"), std::string::npos) << name;
  EXPECT_NE(error_of({.algorithm = "MEDUSA"}).find("unknown"), std::string::npos);
  EXPECT_NE(error_of({.algorithm = "NGRAM", .ngram_min_match_window = 5, .ngram_max_match_window = 2})
                .find("--speculative-ngram-min-match-window-size"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::spec
