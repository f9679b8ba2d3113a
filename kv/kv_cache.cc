#include "kv/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::kv {

KvCache::KvCache(const KvCacheOptions& options) : page_size_(options.page_size), pool_(options.num_pages) {
  MS_CHECK(options.page_size > 0, "KV cache: page size {} must be positive", options.page_size);
  if (options.prefix_cache) radix_ = std::make_unique<RadixCache>(options.page_size);
  indexed_.assign(static_cast<size_t>(options.num_pages), false);
}

void KvCache::retain(int32_t page) {
  if (indexed_[page] && pool_.refcount(page) == 1) --evictable_;
  pool_.retain(page);
}

void KvCache::release_one(int32_t page) {
  pool_.release(page);
  if (indexed_[page] && pool_.refcount(page) == 1) ++evictable_;
}

std::vector<int32_t> KvCache::acquire_prefix(std::span<const int32_t> tokens, int64_t max_tokens) {
  if (!radix_) return {};
  max_tokens = std::clamp<int64_t>(max_tokens, 0, static_cast<int64_t>(tokens.size()));
  std::vector<int32_t> pages = radix_->match(tokens, max_tokens / page_size_);
  for (int32_t page : pages) retain(page);
  return pages;
}

void KvCache::count_lookup(int64_t query_tokens, int64_t hit_tokens) {
  stats_.query_tokens += query_tokens;
  stats_.hit_tokens += hit_tokens;
}

int64_t KvCache::cached_prefix_tokens(std::span<const int32_t> tokens, int64_t max_tokens) {
  if (!radix_) return 0;
  max_tokens = std::clamp<int64_t>(max_tokens, 0, static_cast<int64_t>(tokens.size()));
  return static_cast<int64_t>(radix_->match(tokens, max_tokens / page_size_).size()) * page_size_;
}

bool KvCache::evict_one() {
  if (!radix_) return false;
  const auto page = radix_->evict_one([&](int32_t p) { return pool_.refcount(p) == 1; });
  if (!page) return false;
  indexed_[*page] = false;
  --evictable_;
  pool_.release(*page);
  ++stats_.evicted_pages;
  return true;
}

std::optional<std::vector<int32_t>> KvCache::allocate(int64_t count) {
  if (count > available_pages()) return std::nullopt;
  while (free_pages() < count) MS_CHECK(evict_one(), "KV cache: {} pages counted evictable, none found", evictable_);
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) pages.push_back(*pool_.allocate());
  return pages;
}

void KvCache::cache_prefix(std::span<const int32_t> tokens, std::vector<int32_t>& pages, int64_t computed_tokens) {
  if (!radix_) return;
  computed_tokens = std::min<int64_t>(computed_tokens, static_cast<int64_t>(tokens.size()));
  const int64_t whole = std::min<int64_t>(computed_tokens / page_size_, static_cast<int64_t>(pages.size()));
  if (whole == 0) return;
  std::vector<bool> added;
  const std::vector<int32_t> canonical =
      radix_->insert(tokens, std::span<const int32_t>(pages.data(), static_cast<size_t>(whole)), added);
  for (int64_t i = 0; i < whole; ++i) {
    if (added[i]) {  // the index becomes a holder of the caller's page
      indexed_[pages[i]] = true;
      pool_.retain(pages[i]);
    } else if (canonical[i] != pages[i]) {  // the same prefix is cached in another page: use that one
      retain(canonical[i]);
      release_one(pages[i]);
      pages[i] = canonical[i];
    }
  }
}

void KvCache::release(std::span<const int32_t> pages) {
  for (int32_t page : pages) release_one(page);
}

int64_t KvCache::flush() {
  int64_t evicted = 0;
  while (evict_one()) ++evicted;
  return evicted;
}

void KvCache::check_consistency() const {
  int64_t indexed = 0, evictable = 0, free = 0;
  for (int64_t p = 0; p < num_pages(); ++p) {
    const int32_t refs = pool_.refcount(static_cast<int32_t>(p));
    if (refs == 0) ++free;
    if (indexed_[p]) {
      ++indexed;
      MS_CHECK(refs >= 1, "KV cache: indexed page {} is free", p);
      if (refs == 1) ++evictable;
    }
  }
  MS_CHECK(free == free_pages(), "KV cache: {} pages have refcount 0, the free list has {}", free, free_pages());
  MS_CHECK(evictable == evictable_, "KV cache: {} cached pages counted, {} found", evictable_, evictable);
  const int64_t in_tree = radix_ ? radix_->cached_pages() : 0;
  MS_CHECK(indexed == in_tree, "KV cache: {} pages marked indexed, the index has {}", indexed, in_tree);
  if (radix_)
    for (int32_t page : radix_->all_pages())
      MS_CHECK(indexed_[page], "KV cache: the index names page {} which is not marked indexed", page);
}

}  // namespace moeserve::kv
