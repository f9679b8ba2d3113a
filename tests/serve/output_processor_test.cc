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

// vLLM's stop fields: the stop_reason (a stop string, or a client's stop token id, not EOS),
// include_stop_str_in_output, min_tokens (no stop before it), offsets in characters.
TEST(OutputProcessor, StopReasonAndIncludeStopString) {
  OutputLimits limits{100, {}, {"cd"}, true};
  limits.include_stop_str_in_output = true;
  OutputProcessor out(tok(), limits);
  std::string text;
  for (int32_t id : bytes("abc")) text += out.push(id).text;
  const auto end = out.push('d');
  EXPECT_EQ(text + end.text, "abcd");
  EXPECT_EQ(end.stop_string, "cd");
  EXPECT_EQ(end.stop_token, -1);
}

TEST(OutputProcessor, StopTokenIsTheStopReasonOnlyWhenTheClientAskedForIt) {
  OutputLimits limits{100, {300, 257}, {}, true};
  limits.client_stop_token_ids = 1;  // 257 is EOS, added by the server
  OutputProcessor by_client(tok(), limits);
  EXPECT_EQ(by_client.push(300).stop_token, 300);
  OutputProcessor by_eos(tok(), limits);
  const auto eos = by_eos.push(257);
  EXPECT_EQ(eos.finish_reason, "stop");
  EXPECT_EQ(eos.stop_token, -1);
}

TEST(OutputProcessor, MinTokensDefersEveryStop) {
  OutputLimits limits{100, {300}, {"b"}, true};
  limits.min_tokens = 3;
  OutputProcessor out(tok(), limits);
  EXPECT_EQ(out.push('b').finish_reason, "");
  EXPECT_EQ(out.push(300).finish_reason, "");
  const auto third = out.push(300);
  EXPECT_EQ(third.finish_reason, "stop");
  EXPECT_EQ(third.stop_token, 300);
}

TEST(OutputProcessor, TextOffsetsCountCharacters) {
  OutputProcessor out(tok(), {100, {}, {}, true});
  std::vector<int64_t> offsets;
  const std::string text = std::string("a") + "\xc3\xa9" + "b" + "\xe2\x82\xac" + "c";  // a, e-acute, b, euro, c
  for (int32_t id : bytes(text)) offsets.push_back(out.push(id).text_offset);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 1, 2, 3, 3, 3, 4}));
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
