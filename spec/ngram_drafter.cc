#include "spec/ngram_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::spec {

NgramDrafter::NgramDrafter(const NgramOptions& options) : options_(options) {
  MS_CHECK(options.min_window >= 1 && options.min_window <= options.max_window,
           "NGRAM drafter: match window [{}, {}] must satisfy 1 <= min <= max", options.min_window, options.max_window);
}

int64_t NgramDrafter::latest_match(std::span<const int32_t> tokens, int64_t window) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const auto suffix = tokens.subspan(static_cast<size_t>(n - window));
  for (int64_t start = n - window - 1; start >= 0; --start)
    if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) return start;
  return -1;
}

std::vector<int32_t> NgramDrafter::propose(std::span<const int32_t> tokens, int64_t max_drafts) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> drafts;
  if (max_drafts <= 0) return drafts;
  for (int64_t window = std::min(options_.max_window, n - 1); window >= options_.min_window; --window) {
    const int64_t start = latest_match(tokens, window);
    if (start < 0) continue;
    // Token i of the continuation is the sequence's (or an earlier draft's) at start + window + i:
    // start + window + i < n + i, so it is always known.
    for (int64_t i = 0; i < max_drafts; ++i) {
      const int64_t from = start + window + i;
      drafts.push_back(from < n ? tokens[from] : drafts[from - n]);
    }
    return drafts;
  }
  return drafts;
}

}  // namespace moeserve::spec
