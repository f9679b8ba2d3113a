// Fuzz target: encode/decode of any text with fixed tokenizers: the built-in byte tokenizer and
// the byte-level BPE (tokenizer.json) and tiktoken tokenizers under fuzz/data/ (made by
// fuzz/make_corpus.py with tests/python/tokenizer_oracle.py). None of them normalizes, adds a
// prefix space or drops text, so for every UTF-8 text (anything else is an Error naming the byte):
//   decode(encode(s, allow_special)) == s for both allow_special values,
//   encode(s) with all of s as a plain range == encode(s, false),
//   encode(s, false) holds no special token (chat content cannot forge one).
#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using moeserve::tokenizer::Tokenizer;
using moeserve::tokenizer::TokenKind;

const std::vector<std::unique_ptr<Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<Tokenizer>> t;
    t.push_back(moeserve::tokenizer::make_builtin_tokenizer(512));
    t.push_back(moeserve::tokenizer::load_tokenizer(MOESERVE_FUZZ_DATA_DIR "/deepseek-like"));
    t.push_back(moeserve::tokenizer::load_tokenizer(MOESERVE_FUZZ_DATA_DIR "/kimi-like"));
    return t;
  }();
  return all;
}

void check_round_trip(const Tokenizer& tokenizer, std::string_view text) {
  const std::string& origin = tokenizer.origin();
  const std::vector<int32_t> plain = tokenizer.encode(text, false);
  for (const int32_t id : plain) {
    MS_FUZZ_ASSERT(id >= 0 && id < tokenizer.vocab_size(), origin + ": id outside the vocabulary");
    MS_FUZZ_ASSERT(tokenizer.token_kind(id) != TokenKind::kSpecial, origin + ": special token from plain text");
  }
  MS_FUZZ_ASSERT(tokenizer.decode(plain) == text, origin + ": decode(encode(s, false)) != s");
  const std::vector<int32_t> special = tokenizer.encode(text, true);
  MS_FUZZ_ASSERT(tokenizer.decode(special) == text, origin + ": decode(encode(s, true)) != s");
  const moeserve::tokenizer::TextRange whole{0, text.size()};
  MS_FUZZ_ASSERT(tokenizer.encode(text, std::span(&whole, 1)) == plain, origin + ": a plain range differs from plain");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = moeserve::fuzz::as_text(data, size);
  const bool utf8 = moeserve::tokenizer::first_invalid_utf8(text) == std::string_view::npos;
  for (const auto& tokenizer : tokenizers()) {
    try {
      check_round_trip(*tokenizer, text);
      MS_FUZZ_ASSERT(utf8, tokenizer->origin() + ": text that is not UTF-8 encoded without an error");
    } catch (const moeserve::Error&) {
      MS_FUZZ_ASSERT(!utf8, tokenizer->origin() + ": UTF-8 text refused");
    }
  }
  return 0;
}
