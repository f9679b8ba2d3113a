// Refcounted KV cache pages of one attention-DP replica: pure bookkeeping, no tensors. A page
// is free (refcount 0) or held by one or more owners: running sequences that read it, and the
// prefix cache (kv/radix_cache.h) while it indexes it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace moeserve::kv {

class BlockPool {
 public:
  explicit BlockPool(int64_t num_pages);

  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }

  // A free page with refcount 1, or nullopt when none is free.
  std::optional<int32_t> allocate();
  // One more owner of a page in use.
  void retain(int32_t page);
  // One owner fewer; returns true when the page became free.
  bool release(int32_t page);
  int32_t refcount(int32_t page) const;

 private:
  void check_page(int32_t page) const;

  std::vector<int32_t> refcount_;  // [num_pages]
  std::vector<int32_t> free_;      // a stack: the lowest page numbers are handed out first
};

}  // namespace moeserve::kv
