// The KV cache bookkeeping of one attention-DP replica: a refcounted page pool
// (kv/block_pool.h) and, unless disabled, a radix prefix index over it (kv/radix_cache.h)
// shared by every request on the replica. Pure bookkeeping, no tensors.
//
// Holders: each sequence holds one reference to every page in its block table; the prefix
// index holds one to every page it names. A page only the index holds is "cached": it keeps
// its latents for a later request with the same prefix and is evicted (least recently used
// first) when a fresh page is needed and none is free.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "kv/radix_cache.h"

namespace moeserve::kv {

struct KvCacheOptions {
  int64_t num_pages = 0;
  int64_t page_size = 16;
  bool prefix_cache = true;  // --disable-radix-cache turns it off
};

struct KvCacheStats {
  int64_t query_tokens = 0;  // prompt tokens looked up in the prefix index
  int64_t hit_tokens = 0;    // of which found cached
  int64_t evicted_pages = 0;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheOptions& options);

  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return pool_.num_pages(); }
  bool prefix_cache_enabled() const { return radix_ != nullptr; }

  int64_t free_pages() const { return pool_.free_pages(); }
  // Held only by the prefix index: evictable.
  int64_t cached_pages() const { return evictable_; }
  // Held by at least one sequence.
  int64_t used_pages() const { return num_pages() - free_pages() - cached_pages(); }
  // What allocate() can hand out: free plus evictable pages.
  int64_t available_pages() const { return free_pages() + cached_pages(); }
  const KvCacheStats& stats() const { return stats_; }

  // The pages holding the longest cached prefix of `tokens`, in whole pages and at most
  // `max_tokens` tokens; the caller now holds a reference to each.
  std::vector<int32_t> acquire_prefix(std::span<const int32_t> tokens, int64_t max_tokens);

  // Counts a prompt lookup in stats() (the caller decides which lookups count: a request's
  // first admission, not its re-admission after preemption).
  void count_lookup(int64_t query_tokens, int64_t hit_tokens);

  // Longest cached prefix of `tokens` in tokens (no reference taken, not counted).
  int64_t cached_prefix_tokens(std::span<const int32_t> tokens, int64_t max_tokens);

  // `count` fresh pages held by the caller, evicting cached pages as needed; nullopt (and
  // nothing taken) when fewer than `count` can be had.
  std::optional<std::vector<int32_t>> allocate(int64_t count);

  // Indexes the whole pages among the first `computed_tokens` of a sequence whose block
  // table is `pages`. A page whose prefix the index already names by another page is swapped
  // in `pages` for that one (the same latents: the caller's reference moves over).
  void cache_prefix(std::span<const int32_t> tokens, std::vector<int32_t>& pages, int64_t computed_tokens);

  // Drops the caller's reference to each page.
  void release(std::span<const int32_t> pages);

  // Evicts every cached page; returns how many.
  int64_t flush();

  // Throws if the counts disagree with the pool and the index (tests, /health in debug).
  void check_consistency() const;

 private:
  void retain(int32_t page);
  void release_one(int32_t page);
  bool evict_one();

  int64_t page_size_;
  BlockPool pool_;
  std::unique_ptr<RadixCache> radix_;
  std::vector<bool> indexed_;  // [num_pages] named by the prefix index
  int64_t evictable_ = 0;      // indexed pages with refcount 1
  KvCacheStats stats_;
};

}  // namespace moeserve::kv
