// The prefix index of one replica's KV cache: a radix tree over token ids at page granularity.
// Each node stands for one whole page of tokens that follows its parent's prefix, and names
// the page whose latents hold them. Only whole pages are indexed (a partly written page is
// still private to its sequence). Pure bookkeeping: the tree holds no references itself; the
// owner (kv/kv_cache.h) counts the tree as one holder of every page it indexes.
//
// Eviction is least-recently-used over leaves: a page is dropped only after every page that
// extends its prefix, so a cached prefix never has a hole.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

namespace moeserve::kv {

class RadixCache {
 public:
  explicit RadixCache(int64_t page_size);
  ~RadixCache();

  int64_t page_size() const { return page_size_; }
  int64_t cached_pages() const { return nodes_; }

  // The pages of the longest indexed prefix of `tokens`, whole pages only, at most
  // max_pages. Marks them used now.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int64_t max_pages);

  // Indexes the first pages.size() whole pages of `tokens` (pages[i] holds tokens
  // [i * page_size, (i + 1) * page_size)). Returns, for each page, the page the tree names
  // for that prefix: the one it already had, or the given one when it is new. `added[i]`
  // tells which of the given pages the tree now indexes.
  std::vector<int32_t> insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                              std::vector<bool>& added);

  // Removes the least recently used leaf whose page `can_evict` accepts; returns its page.
  std::optional<int32_t> evict_one(const std::function<bool(int32_t)>& can_evict);

  // Pages of every indexed node (for consistency checks).
  std::vector<int32_t> all_pages() const;

 private:
  struct Node;
  using Key = std::vector<int32_t>;  // [page_size] tokens

  void touch(Node* node);
  void set_leaf_entry(Node* node);
  void erase_leaf_entry(Node* node);

  int64_t page_size_;
  std::unique_ptr<Node> root_;
  int64_t nodes_ = 0;
  uint64_t clock_ = 0;
  std::set<std::pair<uint64_t, Node*>> leaves_;  // (last use, leaf) in LRU order
};

}  // namespace moeserve::kv
