#include "grammar/vocabulary.h"

#include "core/error.h"

namespace moeserve::grammar {

std::set<std::string> VocabularyParams::default_text_specials() {
  // The markers of the tool-call formats in tool_call_grammar.h.
  return {"<|tool_calls_section_begin|>",
          "<|tool_calls_section_end|>",
          "<|tool_call_begin|>",
          "<|tool_call_argument_begin|>",
          "<|tool_call_end|>",
          "<｜tool▁calls▁begin｜>",
          "<｜tool▁calls▁end｜>",
          "<｜tool▁call▁begin｜>",
          "<｜tool▁call▁end｜>",
          "<｜tool▁sep｜>",
          "<tool_call>",
          "</tool_call>"};
}

GrammarVocabulary make_vocabulary(const tokenizer::Tokenizer& tok, const VocabularyParams& params) {
  const int64_t n = tok.vocab_size();
  MS_CHECK(params.model_vocab_size >= n,
           "grammar vocabulary: the model's vocab_size {} is below the tokenizer's {} ids", params.model_vocab_size, n);
  GrammarVocabulary out;
  out.vocab_size = params.model_vocab_size;
  out.stop_ids = params.stop_ids;
  out.token_bytes.resize(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    const auto i = static_cast<int32_t>(id);
    const tokenizer::TokenKind kind = tok.token_kind(i);
    const std::string& bytes = tok.token_bytes(i);
    const bool text = kind == tokenizer::TokenKind::kNormal ||
                      ((kind == tokenizer::TokenKind::kAdded || kind == tokenizer::TokenKind::kSpecial) &&
                       params.text_specials.count(bytes) > 0);
    if (text) out.token_bytes[static_cast<size_t>(id)] = bytes;
  }
  return out;
}

}  // namespace moeserve::grammar
