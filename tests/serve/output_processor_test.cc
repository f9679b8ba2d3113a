#include "serve/output_processor.h"

#include <gtest/gtest.h>

namespace moeserve::serve {
namespace {

// The built-in tokenizer: id b is byte b for b < 256; 256.. are special tokens.
const tokenizer::Tokenizer& tok() {
  static const auto t = tokenizer::make_builtin_tokenizer(512);
  return *t;
}

std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(OutputProcessor, StopsAtLengthWithAllTextReleased) {
  OutputProcessor out(tok(), {3, {}, {}, true});
  EXPECT_EQ(out.push('a').text, "a");
  EXPECT_EQ(out.push('b').text, "b");
  const auto last = out.push('c');
  EXPECT_EQ(last.text, "c");
  EXPECT_EQ(last.finish_reason, "length");
  EXPECT_TRUE(out.finished());
}

TEST(OutputProcessor, StopStringCutsTheTextAndHoldsBackPossiblePrefixes) {
  OutputProcessor out(tok(), {100, {}, {"END"}, true});
  std::string text;
  std::string reason;
  for (int32_t id : bytes("abEN")) {
    const auto u = out.push(id);
    text += u.text;
  }
  EXPECT_EQ(text, "ab");  // "EN" may start "END": held back
  const auto u = out.push('X');
  EXPECT_EQ(u.text, "ENX");  // it did not
  const auto stop = out.push('E');
  EXPECT_EQ(stop.text, "");
  out.push('N');
  const auto end = out.push('D');
  EXPECT_EQ(end.finish_reason, "stop");
  EXPECT_EQ(end.text, "");
}

TEST(OutputProcessor, StopStringInsideOneTokensText) {
  OutputProcessor out(tok(), {100, {}, {"b"}, true});
  EXPECT_EQ(out.push('a').text, "a");
  const auto u = out.push('b');
  EXPECT_EQ(u.finish_reason, "stop");
  EXPECT_EQ(u.text, "");
}

TEST(OutputProcessor, StopTokenEndsWithoutItsTextAndReleasesHeldText) {
  OutputProcessor out(tok(), {100, {257}, {"xyz"}, true});
  EXPECT_EQ(out.push('x').text, "");
  const auto u = out.push(257);
  EXPECT_EQ(u.finish_reason, "stop");
  EXPECT_EQ(u.text, "x");
  EXPECT_EQ(out.generated(), 2);
}

TEST(OutputProcessor, MultiByteCharactersAreNeverSplit) {
  const std::string euro = "\xE2\x82\xAC";
  OutputProcessor out(tok(), {100, {}, {}, true});
  EXPECT_EQ(out.push(0xE2).text, "");
  EXPECT_EQ(out.push(0x82).text, "");
  EXPECT_EQ(out.push(0xAC).text, euro);
  // An incomplete character at the end becomes U+FFFD.
  OutputProcessor cut(tok(), {2, {}, {}, true});
  cut.push('a');
  EXPECT_EQ(cut.push(0xE2).text, "\xEF\xBF\xBD");
}

TEST(OutputProcessor, SpecialTokensAreSkippedUnlessAskedFor) {
  OutputProcessor skip(tok(), {100, {}, {}, true});
  EXPECT_EQ(skip.push(258).text, "");
  OutputProcessor keep(tok(), {100, {}, {}, false});
  EXPECT_EQ(keep.push(258).text, "<|im_end|>");
}

TEST(OutputProcessor, TextOffsetsFollowTheDecodedText) {
  OutputProcessor out(tok(), {100, {}, {}, true});
  EXPECT_EQ(out.push('a').text_offset, 0);
  EXPECT_EQ(out.push('b').text_offset, 1);
  EXPECT_EQ(out.push('c').text_offset, 2);
}

}  // namespace
}  // namespace moeserve::serve
