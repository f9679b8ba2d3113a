#include "kv/block_pool.h"

#include "core/error.h"

namespace moeserve::kv {

BlockPool::BlockPool(int64_t num_pages) {
  MS_CHECK(num_pages > 0 && num_pages <= INT32_MAX, "KV cache: page count {} must be in [1, 2^31)", num_pages);
  refcount_.assign(static_cast<size_t>(num_pages), 0);
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

void BlockPool::check_page(int32_t page) const {
  MS_CHECK(page >= 0 && page < num_pages(), "KV cache: page {} outside [0, {})", page, num_pages());
}

std::optional<int32_t> BlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t page = free_.back();
  free_.pop_back();
  refcount_[page] = 1;
  return page;
}

void BlockPool::retain(int32_t page) {
  check_page(page);
  MS_CHECK(refcount_[page] > 0, "KV cache: retain of free page {}", page);
  ++refcount_[page];
}

bool BlockPool::release(int32_t page) {
  check_page(page);
  MS_CHECK(refcount_[page] > 0, "KV cache: release of free page {}", page);
  if (--refcount_[page] > 0) return false;
  free_.push_back(page);
  return true;
}

int32_t BlockPool::refcount(int32_t page) const {
  check_page(page);
  return refcount_[page];
}

}  // namespace moeserve::kv
