#include "kv/radix_cache.h"

#include <gtest/gtest.h>

namespace moeserve::kv {
namespace {

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> v;
  for (int32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

TEST(RadixCache, MatchesWholePagesOfTheLongestIndexedPrefix) {
  RadixCache cache(4);
  std::vector<bool> added;
  const auto tokens = range(0, 10);  // two whole pages and a partial one
  const std::vector<int32_t> pages = {7, 3};
  EXPECT_EQ(cache.insert(tokens, pages, added), pages);
  EXPECT_EQ(added, (std::vector<bool>{true, true}));
  EXPECT_EQ(cache.cached_pages(), 2);

  EXPECT_EQ(cache.match(tokens, 10), pages);
  EXPECT_EQ(cache.match(tokens, 1), std::vector<int32_t>{7});
  auto diverging = tokens;
  diverging[5] = 99;  // second page differs
  EXPECT_EQ(cache.match(diverging, 10), std::vector<int32_t>{7});
  EXPECT_TRUE(cache.match(range(1, 9), 10).empty());
  EXPECT_TRUE(cache.match(range(0, 3), 10).empty());  // shorter than a page
}

TEST(RadixCache, InsertKeepsThePageAlreadyIndexedForAPrefix) {
  RadixCache cache(2);
  std::vector<bool> added;
  cache.insert(range(0, 4), std::vector<int32_t>{1, 2}, added);
  const auto canonical = cache.insert(range(0, 6), std::vector<int32_t>{5, 6, 7}, added);
  EXPECT_EQ(canonical, (std::vector<int32_t>{1, 2, 7}));
  EXPECT_EQ(added, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(cache.cached_pages(), 3);
}

TEST(RadixCache, EvictsLeastRecentlyUsedLeavesFirstAndOnlyLeaves) {
  RadixCache cache(1);
  std::vector<bool> added;
  cache.insert(std::vector<int32_t>{1, 2}, std::vector<int32_t>{10, 11}, added);  // path 10 -> 11
  cache.insert(std::vector<int32_t>{5}, std::vector<int32_t>{20}, added);
  cache.match(std::vector<int32_t>{1, 2}, 2);  // 10 and 11 now newer than 20
  auto any = [](int32_t) { return true; };
  EXPECT_EQ(cache.evict_one(any), 20);
  EXPECT_EQ(cache.evict_one(any), 11);  // the parent goes only after its child
  EXPECT_EQ(cache.evict_one(any), 10);
  EXPECT_EQ(cache.evict_one(any), std::nullopt);
  EXPECT_EQ(cache.cached_pages(), 0);
}

TEST(RadixCache, EvictionSkipsPagesTheCallerRefuses) {
  RadixCache cache(1);
  std::vector<bool> added;
  cache.insert(std::vector<int32_t>{1}, std::vector<int32_t>{10}, added);
  cache.insert(std::vector<int32_t>{2}, std::vector<int32_t>{20}, added);
  EXPECT_EQ(cache.evict_one([](int32_t page) { return page != 10; }), 20);
  EXPECT_EQ(cache.evict_one([](int32_t page) { return page != 10; }), std::nullopt);
  EXPECT_EQ(cache.all_pages(), std::vector<int32_t>{10});
}

}  // namespace
}  // namespace moeserve::kv
