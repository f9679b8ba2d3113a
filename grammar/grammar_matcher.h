// A request's matcher state over a compiled grammar (xgrammar::GrammarMatcher), as a
// TokenConstraint. Private to grammar/: GrammarEngine::matcher makes them.
#pragma once

#include <xgrammar/xgrammar.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/utf8_masks.h"
#include "step/token_constraint.h"

namespace moeserve::grammar {

// What every matcher of an engine reads: built once per vocabulary.
struct VocabTables {
  VocabTables(std::vector<std::string> token_bytes, const std::vector<int32_t>& stop_ids, int64_t vocab_size);

  std::vector<std::string> token_bytes;  // [tokenizer ids], as GrammarVocabulary
  int64_t vocab_size;                    // the mask's width in ids (the model's, padded)
  int64_t tokenizer_words;               // ceil(tokenizer ids / 32): the part xgrammar fills
  // [vocab_size] 1: an id xgrammar can match (text or a stop id). The others are rejected here:
  // xgrammar logs each special id it rejects.
  std::vector<uint8_t> matchable;
  Utf8Masks utf8;  // over the tokenizer's ids
};

struct MatcherParams {
  const xgrammar::CompiledGrammar& compiled;  // over the tokenizer's ids (no padding)
  std::vector<int32_t> stop_ids;              // empty: terminate as soon as the grammar completes
  std::shared_ptr<const VocabTables> tables;
};

std::unique_ptr<TokenConstraint> make_matcher(const MatcherParams& params);

}  // namespace moeserve::grammar
