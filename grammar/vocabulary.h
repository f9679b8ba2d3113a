// The tokenizer's vocabulary as xgrammar matches it: every id's decoded bytes, the model's
// padded vocabulary size (ids past the tokenizer's are never allowed), stop tokens marked.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::grammar {

struct GrammarVocabulary {
  std::vector<std::string> token_bytes;  // [tokenizer vocab]: "" for special tokens (never matched)
  std::vector<int32_t> stop_ids;         // allowed once a grammar is complete
  int64_t vocab_size = 0;                // the model's logits, >= token_bytes.size()
};

struct VocabularyParams {
  int64_t model_vocab_size;       // the logits' width (padded past the tokenizer's ids)
  std::vector<int32_t> stop_ids;  // the model's end-of-turn / end-of-sequence ids
  // Special tokens that keep their text, so grammars can ask for them (tool-call markers such
  // as "<|tool_call_begin|>"); every other special token is never matched.
  std::set<std::string> text_specials = default_text_specials();
  static std::set<std::string> default_text_specials();
};

GrammarVocabulary make_vocabulary(const tokenizer::Tokenizer& tok, const VocabularyParams& params);

}  // namespace moeserve::grammar
