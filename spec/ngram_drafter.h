// NGRAM (prompt lookup): the sequence's last w tokens (w from max_window down to min_window)
// are looked up in the sequence itself; at the latest earlier occurrence, the tokens that
// followed it are the drafts. No weights. The continuation may run past the sequence's end
// into the drafts themselves, so a repeating pattern drafts as far as asked.
//
// SGLang's NGRAM keeps a trie over every request's tokens and drafts trees (BFS breadth,
// branch length, capacity); this is its chain form over the request's own prompt and output,
// with its match-window knobs.
#pragma once

#include "spec/drafter.h"

namespace moeserve::spec {

struct NgramOptions {
  int64_t min_window = 1;
  int64_t max_window = 12;
};

class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(const NgramOptions& options);
  std::vector<int32_t> propose(std::span<const int32_t> tokens, int64_t max_drafts) const override;

 private:
  // The start of the latest occurrence of tokens' last `window` tokens that ends before the
  // last token, or -1.
  static int64_t latest_match(std::span<const int32_t> tokens, int64_t window);

  NgramOptions options_;
};

}  // namespace moeserve::spec
