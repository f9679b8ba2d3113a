// A request's logit adjustments over its life (step/logit_adjust.h): its options, the distinct
// tokens of its prompt (for the repetition penalty), how often each token has been generated
// (updated as each step's token is committed), and from those the sparse entries of its next
// draw. Only the tokens the options touch are listed, never the vocabulary.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "step/logit_adjust.h"

namespace moeserve::runtime {

class LogitAdjustState {
 public:
  LogitAdjustState(ops::LogitAdjustOptions options, std::span<const int32_t> prompt);

  // A generated token was committed.
  void add_output(int32_t token);
  // Appends the entries of the draw on logit row `row` (one per token it changes).
  void append_entries(int32_t row, std::vector<ops::LogitAdjustEntry>& out) const;

 private:
  ops::LogitAdjustOptions options_;
  std::unordered_set<int32_t> prompt_;              // with a repetition penalty only
  std::unordered_map<int32_t, int32_t> generated_;  // token -> times generated
  int64_t generated_count_ = 0;
};

}  // namespace moeserve::runtime
