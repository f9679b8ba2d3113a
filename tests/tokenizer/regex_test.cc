#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace moeserve::tokenizer {
namespace {

std::vector<std::string> matches(const Regex& regex, std::string_view text) {
  std::vector<std::string> out;
  regex.for_each_match(text, [&](size_t b, size_t e) { out.emplace_back(text.substr(b, e - b)); });
  return out;
}

TEST(RegexTranslation, ClassIntersectionBecomesLookahead) {
  EXPECT_EQ(translate_regex_for_pcre2(R"([\p{L}&&[^\p{Han}]]+)", "t"), R"((?:(?=[^\p{Han}])[\p{L}])+)");
  EXPECT_EQ(translate_regex_for_pcre2(R"([^a-z&&[^x]])", "t"), R"((?:(?!(?=[^x])[a-z])(?s:.)))");
}

TEST(RegexTranslation, OnigurumaUnicodeEscapes) {
  EXPECT_EQ(translate_regex_for_pcre2(R"(\u3040[\u30A0-\u30FF])", "t"), R"(\x{3040}[\x{30A0}-\x{30FF}])");
  EXPECT_EQ(translate_regex_for_pcre2(R"(\\u0041)", "t"), R"(\\u0041)");  // an escaped backslash
}

TEST(RegexTranslation, ErrorsNameTheSource) {
  try {
    translate_regex_for_pcre2("[abc", "tok.json: pre_tokenizer");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tok.json: pre_tokenizer: unterminated character class at offset 0 in regex");
  }
  EXPECT_THROW(Regex("(", "where"), Error);
}

TEST(Regex, KimiStyleIntersectionSplitsHanFromOtherLetters) {
  const Regex regex(R"([\p{Han}]+|[\p{L}&&[^\p{Han}]]+|\s+|\p{N}{1,3})", "test");
  EXPECT_EQ(matches(regex, "Hello世界 ab12345"), (std::vector<std::string>{"Hello", "世界", " ", "ab", "123", "45"}));
}

TEST(Regex, LookaheadAndUnicodeWhitespace) {
  const Regex regex(R"(\s+(?!\S)|\s+|\S+)", "test");
  // "\s+(?!\S)" stops one space short of a word; U+0085 (NEL) is whitespace, as in Rust's regex.
  EXPECT_EQ(matches(regex, "a   b\xC2\x85"), (std::vector<std::string>{"a", "  ", " ", "b", "\xC2\x85"}));
}

}  // namespace
}  // namespace moeserve::tokenizer
