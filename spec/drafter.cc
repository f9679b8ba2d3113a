#include "spec/drafter.h"

#include "spec/ngram_drafter.h"

namespace moeserve::spec {

std::unique_ptr<Drafter> make_drafter(const SpeculativeOptions& options) {
  if (options.algorithm == Algorithm::kNgram)
    return std::make_unique<NgramDrafter>(
        NgramOptions{.min_window = options.ngram_min_match_window, .max_window = options.ngram_max_match_window});
  return nullptr;
}

}  // namespace moeserve::spec
