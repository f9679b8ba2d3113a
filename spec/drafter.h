// A drafter proposes the tokens that may follow a sequence; the target model verifies them in
// one forward (spec/verify.h). Drafters hold no per-request state beyond what they are given.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "spec/speculative_options.h"

namespace moeserve::spec {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_drafts tokens that may follow `tokens` (a request's prompt, then its output);
  // fewer, or none, when it has no guess.
  virtual std::vector<int32_t> propose(std::span<const int32_t> tokens, int64_t max_drafts) const = 0;
};

// The drafter of options.algorithm (null when speculation is off).
std::unique_ptr<Drafter> make_drafter(const SpeculativeOptions& options);

}  // namespace moeserve::spec
