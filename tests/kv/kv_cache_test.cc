#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <random>

namespace moeserve::kv {
namespace {

KvCache make(int64_t pages, int64_t page_size, bool prefix = true) {
  return KvCache(KvCacheOptions{pages, page_size, prefix});
}

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> v;
  for (int32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

TEST(KvCache, FinishedSequenceLeavesItsWholePagesCachedForTheNextRequest) {
  KvCache cache = make(8, 4);
  const auto prompt = range(0, 11);
  auto pages = *cache.allocate(3);  // 11 tokens -> 3 pages
  cache.cache_prefix(prompt, pages, 11);
  cache.release(pages);
  EXPECT_EQ(cache.used_pages(), 0);
  EXPECT_EQ(cache.cached_pages(), 2);  // the partial third page is not indexed
  EXPECT_EQ(cache.free_pages(), 6);

  auto longer = prompt;
  longer.push_back(50);
  const auto hit = cache.acquire_prefix(longer, static_cast<int64_t>(longer.size()) - 1);
  EXPECT_EQ(hit, (std::vector<int32_t>{pages[0], pages[1]}));
  EXPECT_EQ(cache.used_pages(), 2);
  EXPECT_EQ(cache.cached_pages(), 0);
  cache.count_lookup(11, 8);
  EXPECT_EQ(cache.stats().query_tokens, 11);
  EXPECT_EQ(cache.stats().hit_tokens, 8);
  cache.release(hit);
  cache.check_consistency();
}

TEST(KvCache, LeavesOneTokenUncachedWhenAskedTo) {
  KvCache cache = make(8, 4);
  const auto prompt = range(0, 8);
  auto pages = *cache.allocate(2);
  cache.cache_prefix(prompt, pages, 8);
  cache.release(pages);
  // A request with exactly this prompt must still compute its last token for logits.
  EXPECT_EQ(cache.acquire_prefix(prompt, 7).size(), 1u);
}

TEST(KvCache, AllocationEvictsCachedPagesButNeverHeldOnes) {
  KvCache cache = make(4, 2);
  auto a = *cache.allocate(2);
  cache.cache_prefix(range(0, 4), a, 4);
  cache.release(a);  // 2 cached
  auto held = *cache.allocate(2);
  EXPECT_EQ(cache.free_pages(), 0);
  EXPECT_EQ(cache.available_pages(), 2);
  auto more = cache.allocate(2);
  ASSERT_TRUE(more.has_value());
  EXPECT_EQ(cache.stats().evicted_pages, 2);
  EXPECT_EQ(cache.allocate(1), std::nullopt);  // nothing free, nothing cached
  cache.release(held);
  cache.release(*more);
  EXPECT_EQ(cache.free_pages(), 4);
  cache.check_consistency();
}

TEST(KvCache, DuplicatePrefixIsSwappedForTheCachedPage) {
  KvCache cache = make(8, 2);
  const auto tokens = range(0, 4);
  auto first = *cache.allocate(2);
  auto second = *cache.allocate(2);  // computed the same prefix concurrently
  cache.cache_prefix(tokens, first, 4);
  cache.cache_prefix(tokens, second, 4);
  EXPECT_EQ(second, first);
  EXPECT_EQ(cache.free_pages(), 6);  // the duplicates went back
  cache.release(first);
  cache.release(second);
  EXPECT_EQ(cache.cached_pages(), 2);
  EXPECT_EQ(cache.flush(), 2);
  EXPECT_EQ(cache.free_pages(), 8);
  cache.check_consistency();
}

TEST(KvCache, DisabledPrefixCacheNeverHitsAndFreesEverything) {
  KvCache cache = make(4, 2, /*prefix=*/false);
  auto pages = *cache.allocate(2);
  cache.cache_prefix(range(0, 4), pages, 4);
  cache.release(pages);
  EXPECT_EQ(cache.free_pages(), 4);
  EXPECT_TRUE(cache.acquire_prefix(range(0, 5), 4).empty());
  EXPECT_EQ(cache.cached_prefix_tokens(range(0, 5), 4), 0);
}

// Random sequences share prefixes, grow, finish and get cached; the counts always agree with
// the pool and the index, and everything is free once the sequences end and the cache is flushed.
TEST(KvCache, RandomWorkloadKeepsCountsConsistent) {
  std::mt19937 rng(7);
  KvCache cache = make(64, 4);
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pages;
  };
  std::vector<Seq> live;
  for (int iter = 0; iter < 3000; ++iter) {
    const int action = static_cast<int>(rng() % 4);
    if (action == 0 && live.size() < 12) {
      Seq s;
      const int prefix = static_cast<int>(rng() % 3);
      for (int i = 0; i < 4 * prefix; ++i) s.tokens.push_back(i % 5);
      const int extra = 1 + static_cast<int>(rng() % 9);
      for (int i = 0; i < extra; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 3));
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      s.pages = cache.acquire_prefix(s.tokens, len - 1);
      const int64_t need = (len + 3) / 4 - static_cast<int64_t>(s.pages.size());
      auto fresh = cache.allocate(need);
      if (!fresh) {
        cache.release(s.pages);
        continue;
      }
      s.pages.insert(s.pages.end(), fresh->begin(), fresh->end());
      cache.cache_prefix(s.tokens, s.pages, len);
      live.push_back(std::move(s));
    } else if (action == 1 && !live.empty()) {  // grow by a token
      Seq& s = live[rng() % live.size()];
      s.tokens.push_back(static_cast<int32_t>(rng() % 3));
      if (static_cast<int64_t>(s.pages.size()) * 4 < static_cast<int64_t>(s.tokens.size())) {
        auto page = cache.allocate(1);
        if (!page) continue;
        s.pages.push_back(page->front());
      }
      cache.cache_prefix(s.tokens, s.pages, static_cast<int64_t>(s.tokens.size()));
    } else if (action == 2 && !live.empty()) {  // finish
      const size_t i = rng() % live.size();
      cache.release(live[i].pages);
      live.erase(live.begin() + static_cast<int64_t>(i));
    } else if (action == 3 && rng() % 50 == 0) {
      cache.flush();
    }
    cache.check_consistency();
    int64_t held = 0;
    for (const auto& s : live) held += static_cast<int64_t>(s.pages.size());
    EXPECT_LE(cache.used_pages(), held);
  }
  for (auto& s : live) cache.release(s.pages);
  EXPECT_EQ(cache.used_pages(), 0);
  cache.flush();
  EXPECT_EQ(cache.free_pages(), 64);
  cache.check_consistency();
}

}  // namespace
}  // namespace moeserve::kv
