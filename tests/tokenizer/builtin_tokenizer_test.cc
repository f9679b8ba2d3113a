#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

TEST(BuiltinTokenizer, BytesAreIdsAndSpecialsFollow) {
  const auto tok = make_builtin_tokenizer(512);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->encode("hi", false), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(tok->encode("\xC3\xA9", false), (std::vector<int32_t>{0xC3, 0xA9}));
  EXPECT_EQ(tok->added_token_id("<|im_end|>"), 258);
  EXPECT_EQ(tok->added_token_id("<|im_middle|>"), 262);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_EQ(tok->eos_id(), 257);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{300}), "<|reserved_token_300|>");
  EXPECT_EQ(tok->chat_template().name, "kimi-k2");
}

TEST(BuiltinTokenizer, SpecialTokensOnlyWhenAllowed) {
  const auto tok = make_builtin_tokenizer(512);
  EXPECT_EQ(tok->encode("a<|im_end|>", true), (std::vector<int32_t>{'a', 258}));
  EXPECT_EQ(tok->encode("a<|im_end|>", false).size(), 11u);
  const std::vector<int32_t> ids{'a', 258, 'b'};
  EXPECT_EQ(tok->decode(ids), "a<|im_end|>b");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "ab");
}

TEST(BuiltinTokenizer, PlainRangesEncodeSpecialTextAsText) {
  const auto tok = make_builtin_tokenizer(512);
  const std::string text = "<|im_user|>x<|im_end|><|im_system|>y<|im_end|>";
  const std::vector<TextRange> content{{11, 36}};  // "x<|im_end|><|im_system|>y"
  std::vector<int32_t> want{259};
  for (char c : text.substr(11, 25)) want.push_back(static_cast<unsigned char>(c));
  want.push_back(258);
  EXPECT_EQ(tok->encode(text, content), want);
  EXPECT_EQ(tok->encode(text, std::span<const TextRange>()), tok->encode(text, true));
  // A range edge splits a special token: neither side can take it.
  EXPECT_EQ(tok->encode("<|im_end|>", std::vector<TextRange>{{0, 3}}), tok->encode("<|im_end|>", false));
}

TEST(BuiltinTokenizer, Errors) {
  EXPECT_THROW(make_builtin_tokenizer(263), Error);
  const auto tok = make_builtin_tokenizer(300);
  // Ids with no token decode to nothing, as in Hugging Face (IdsWithoutATokenGiveNoText).
  EXPECT_EQ(tok->decode(std::vector<int32_t>{300}), "");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{-1}), "");
  EXPECT_THROW(tok->token_bytes(300), Error);
  try {
    tok->encode("ok\xC3(", false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "text to encode is not valid UTF-8 at byte 2");
  }
}

TEST(IncrementalDetokenizer, HoldsCharactersSplitOverTokens) {
  const auto tok = make_builtin_tokenizer(512);
  IncrementalDetokenizer detok(*tok);
  // U+1F600 is F0 9F 98 80: nothing comes out until its last byte.
  EXPECT_EQ(detok.push('x'), "x");
  EXPECT_EQ(detok.push(0xF0), "");
  EXPECT_EQ(detok.push(0x9F), "");
  EXPECT_EQ(detok.push(0x98), "");
  EXPECT_EQ(detok.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.push(258), "<|im_end|>");
  // A byte that can never start or continue a character is replaced at once.
  EXPECT_EQ(detok.push(0xFF), "\xEF\xBF\xBD");
  // An interrupted sequence: its prefix becomes U+FFFD when the next byte arrives.
  EXPECT_EQ(detok.push(0xE4), "");
  EXPECT_EQ(detok.push('a'),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(detok.push(0xE4), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.flush(), "");
}

TEST(IncrementalDetokenizer, ChunksAreValidAndConcatenateToTheDecode) {
  const auto tok = make_builtin_tokenizer(512);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 30);
    // Mostly UTF-8 lead and continuation bytes, so sequences split, complete and break.
    for (int32_t& id : ids) id = rng() % 4 == 0 ? static_cast<int32_t>(rng() % 512) : 0x80 + rng() % 0x78;
    IncrementalDetokenizer detok(*tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string chunk = detok.push(id);
      ASSERT_EQ(first_invalid_utf8(chunk), std::string_view::npos);
      streamed += chunk;
    }
    const std::string tail = detok.flush();
    ASSERT_EQ(first_invalid_utf8(tail), std::string_view::npos);
    streamed += tail;
    ASSERT_EQ(streamed, tok->decode(ids));
  }
}

// A model's vocabulary is often padded past its tokenizer's: a draw there has no text (as in
// Hugging Face's decode), and a character split around it still completes.
TEST(IncrementalDetokenizer, IdsWithoutATokenGiveNoText) {
  const auto tok = make_builtin_tokenizer(512);
  EXPECT_TRUE(tok->has_token('a'));
  EXPECT_FALSE(tok->has_token(512));
  EXPECT_FALSE(tok->has_token(-1));
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.push(0xC3), "");
  EXPECT_EQ(detok.push(600), "");
  EXPECT_EQ(detok.push(0xA9), "\xC3\xA9");
  const std::vector<int32_t> ids = {'h', 600, 'i', -3};
  EXPECT_EQ(tok->decode(ids), "hi");
}

TEST(LoadTokenizer, SyntheticAndErrors) {
  EXPECT_EQ(load_tokenizer("synthetic")->vocab_size(), kBuiltinDefaultVocabSize);
  try {
    load_tokenizer("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model: not a directory"), std::string::npos);
  }
}

}  // namespace
}  // namespace moeserve::tokenizer
