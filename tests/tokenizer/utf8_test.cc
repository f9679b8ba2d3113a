#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace moeserve::tokenizer {
namespace {

std::string lossy(std::string_view bytes) {
  std::string out;
  append_utf8_lossy(bytes, out);
  return out;
}

const std::string kFffd = "\xEF\xBF\xBD";

// Expected values are Python's bytes.decode("utf-8", "replace").
TEST(Utf8, LossyReplacesEachMaximalIllFormedSubpart) {
  EXPECT_EQ(lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(lossy("h\xC3\xA9llo \xF0\x9F\x98\x80"), "h\xC3\xA9llo \xF0\x9F\x98\x80");
  EXPECT_EQ(lossy("\xE4\xBD"
                  "a"),
            kFffd + "a");                                   // truncated 3-byte sequence
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate: 3 subparts
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);              // overlong lead byte
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);                  // truncated at the end
  EXPECT_EQ(lossy("\x80\x80x\xFF"), kFffd + kFffd + "x" + kFffd);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
}

TEST(Utf8, FirstInvalid) {
  EXPECT_EQ(first_invalid_utf8("abc\xC3\xA9"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("ab\xC3"), 2u);
  EXPECT_EQ(first_invalid_utf8("a\x80"), 1u);
}

TEST(Utf8, CompletableTail) {
  EXPECT_EQ(completable_utf8_tail("abc"), 0u);
  EXPECT_EQ(completable_utf8_tail("a\xF0"), 1u);
  EXPECT_EQ(completable_utf8_tail("a\xF0\x9F"), 2u);
  EXPECT_EQ(completable_utf8_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(completable_utf8_tail("a\xF0\x9F\x98\x80"), 0u);  // complete
  EXPECT_EQ(completable_utf8_tail("a\xE0\x80"), 0u);          // can never complete (overlong)
  EXPECT_EQ(completable_utf8_tail("\x80"), 0u);
}

TEST(Utf8, AppendCodepoint) {
  std::string out;
  for (uint32_t cp : {0x41u, 0xE9u, 0x4E2Du, 0x1F600u}) append_codepoint(cp, out);
  EXPECT_EQ(out, "A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace moeserve::tokenizer
