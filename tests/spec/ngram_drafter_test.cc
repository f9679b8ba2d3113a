// NGRAM drafts: the continuation of the latest earlier occurrence of the longest matching
// suffix, extended past the sequence's end through its own drafts.
#include "spec/ngram_drafter.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace moeserve::spec {
namespace {

using Tokens = std::vector<int32_t>;

TEST(NgramDrafter, ContinuesTheLatestOccurrenceOfTheSuffix) {
  const NgramDrafter drafter({.min_window = 1, .max_window = 3});
  // Suffix [7, 8] occurs at 0 (followed by 1) and at 4 (followed by 2): the latest wins.
  EXPECT_EQ(drafter.propose(Tokens{7, 8, 1, 5, 7, 8, 2, 9, 7, 8}, 2), (Tokens{2, 9}));
}

TEST(NgramDrafter, PrefersTheLongestWindow) {
  const NgramDrafter drafter({.min_window = 1, .max_window = 3});
  // [8] alone last occurs at 6 (-> 4); [5, 8] occurs only at 1 (-> 3): the longer match wins.
  EXPECT_EQ(drafter.propose(Tokens{5, 8, 3, 0, 0, 0, 8, 4, 5, 8}, 1), (Tokens{3}));
}

TEST(NgramDrafter, RunsPastTheEndThroughItsOwnDrafts) {
  const NgramDrafter drafter({.min_window = 1, .max_window = 2});
  // A period-3 pattern: the match [2, 3] at 1 continues 1, 2, 3 and then its own drafts.
  EXPECT_EQ(drafter.propose(Tokens{1, 2, 3, 1, 2, 3}, 7), (Tokens{1, 2, 3, 1, 2, 3, 1}));
}

TEST(NgramDrafter, NothingWithoutAMatchOrBelowTheMinimumWindow) {
  EXPECT_TRUE(NgramDrafter({.min_window = 1, .max_window = 4}).propose(Tokens{1, 2, 3, 4}, 3).empty());
  // [9] repeats but [4, 9] does not: a minimum window of 2 finds nothing.
  EXPECT_TRUE(NgramDrafter({.min_window = 2, .max_window = 4}).propose(Tokens{9, 1, 4, 9}, 3).empty());
  EXPECT_EQ(NgramDrafter({.min_window = 1, .max_window = 4}).propose(Tokens{9, 1, 4, 9}, 3), (Tokens{1, 4, 9}));
  EXPECT_TRUE(NgramDrafter({.min_window = 1, .max_window = 4}).propose(Tokens{9, 1, 4, 9}, 0).empty());
  EXPECT_TRUE(NgramDrafter({.min_window = 1, .max_window = 4}).propose(Tokens{9}, 3).empty());
}

TEST(NgramDrafter, RejectsABadWindow) {
  EXPECT_THROW(NgramDrafter({.min_window = 0, .max_window = 4}), Error);
  EXPECT_THROW(NgramDrafter({.min_window = 5, .max_window = 4}), Error);
}

}  // namespace
}  // namespace moeserve::spec
