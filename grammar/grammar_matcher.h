// A request's matcher state over a compiled grammar (xgrammar::GrammarMatcher), as a
// TokenConstraint. Private to grammar/: GrammarEngine::matcher makes them.
#pragma once

#include <xgrammar/xgrammar.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "step/token_constraint.h"

namespace moeserve::grammar {

struct MatcherParams {
  const xgrammar::CompiledGrammar& compiled;
  std::vector<int32_t> stop_ids;  // empty: terminate as soon as the grammar completes
  int64_t vocab_size;             // the mask's width in ids
  // [vocab_size] 1: an id xgrammar can match (text or a stop id). The others are rejected here:
  // xgrammar logs each special id it rejects, and reads past its vocabulary for padded ids.
  std::shared_ptr<const std::vector<uint8_t>> matchable;
};

std::unique_ptr<TokenConstraint> make_matcher(const MatcherParams& params);

}  // namespace moeserve::grammar
