// A grammar engine over the built-in byte tokenizer (ids 0..255 are the bytes, 256.. its
// special tokens, [EOS] = 257), with the model's vocabulary padded past the tokenizer's ids.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar_engine.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::grammar {

inline constexpr int32_t kEos = 257;
inline constexpr int64_t kModelVocab = 520;  // the tokenizer has 512 ids

inline GrammarEngine& byte_engine() {
  static const auto tok = tokenizer::make_builtin_tokenizer(512);
  static GrammarEngine engine(make_vocabulary(*tok, {.model_vocab_size = kModelVocab, .stop_ids = {kEos}}));
  return engine;
}

inline bool allows(const std::vector<int32_t>& mask, int32_t id) {
  return (static_cast<uint32_t>(mask[static_cast<size_t>(id / 32)]) >> (id % 32)) & 1u;
}

inline std::vector<int32_t> next_mask(TokenConstraint& m) {
  std::vector<int32_t> mask(static_cast<size_t>(byte_engine().mask_words()), 0);
  m.fill_next_mask(mask);
  return mask;
}

// Feeds `text` byte by byte; returns how many bytes were accepted before the first rejection.
inline size_t feed(TokenConstraint& m, const std::string& text) {
  size_t n = 0;
  while (n < text.size() && m.accept(static_cast<unsigned char>(text[n]))) ++n;
  return n;
}

}  // namespace moeserve::grammar
