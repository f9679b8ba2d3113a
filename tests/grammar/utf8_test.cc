// Structured output is valid UTF-8 whatever the grammar's engine lets through (grammar/utf8_masks.h):
// the decoder's states against the definition of UTF-8 by code point (RFC 3629: the shortest
// form, at most U+10FFFF, no surrogates) over every sequence of up to three bytes and sampled
// four-byte ones; masks and accept() refuse the sequences xgrammar 0.1.27 took (overlong forms,
// surrogates, past U+10FFFF); and random walks over the masks (a random model) under the GPU
// check's schema (a string of at most 8 characters, the case that failed) always end in
// text that parses and validates.
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/utf8_masks.h"
#include "tests/grammar/grammar_fixture.h"

namespace moeserve::grammar {
namespace {

// The oracle: decode by bit patterns, then check the code point (not the byte ranges).
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return (lead >> 3) == 0x1E ? 4 : 0;
}

// The code point of the n-byte sequence at s[i] (-1: a byte is not a continuation).
int64_t decode(const std::string& s, size_t i, int n) {
  const auto lead = static_cast<uint8_t>(s[i]);
  int64_t cp = n == 1 ? lead : lead & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
    if ((c & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (c & 0x3F);
  }
  return cp;
}

bool valid_utf8(const std::string& s) {
  constexpr int64_t kShortest[5] = {0, 0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < s.size();) {
    const int n = sequence_length(static_cast<uint8_t>(s[i]));
    if (n == 0 || i + static_cast<size_t>(n) > s.size()) return false;
    const int64_t cp = decode(s, i, n);
    if (cp < kShortest[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

bool complete_and_valid(const std::string& s) { return utf8_after(Utf8State::kBoundary, s) == Utf8State::kBoundary; }
// A valid prefix: something completes it.
bool prefix_ok(const std::string& s) { return utf8_after(Utf8State::kBoundary, s) != Utf8State::kInvalid; }

TEST(Utf8Masks, TheDecoderAgreesWithTheDefinitionOnEveryShortSequence) {
  int64_t checked = 0;
  for (int a = 0; a < 256; ++a) {
    const std::string one(1, static_cast<char>(a));
    ASSERT_EQ(complete_and_valid(one), valid_utf8(one)) << a;
    for (int b = 0; b < 256; ++b) {
      const std::string two = one + static_cast<char>(b);
      ASSERT_EQ(complete_and_valid(two), valid_utf8(two)) << a << " " << b;
      if (!prefix_ok(two)) continue;  // every extension is invalid too (checked by the sampled ones)
      for (int c = 0; c < 256; ++c, ++checked) {
        const std::string three = two + static_cast<char>(c);
        ASSERT_EQ(complete_and_valid(three), valid_utf8(three)) << a << " " << b << " " << c;
      }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i, ++checked) {
    std::string four(4, '\0');
    four[0] = static_cast<char>(0xE0 + rng() % 32);  // the 3- and 4-byte leads and F5..FF
    for (int k = 1; k < 4; ++k) four[k] = static_cast<char>(rng() % 2 ? 0x80 + rng() % 64 : rng() % 256);
    ASSERT_EQ(complete_and_valid(four), valid_utf8(four)) << i;
  }
  EXPECT_GT(checked, 1000000);
}

const std::string kStringSchema = R"({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})";

TEST(Utf8Masks, MasksAndAcceptRefuseWhatIsNotUtf8InsideJsonStrings) {
  // Each: a prefix inside a string, then a byte that would make it invalid and one that is fine.
  struct Case {
    std::string prefix;
    int bad, good;
  };
  const std::vector<Case> cases = {{"", 0xC0, 0xC2},     {"", 0xC1, 0xDF},     {"", 0xF5, 0xF4},
                                   {"", 0x80, 'a'},      {"\xE0", 0x9F, 0xA0}, {"\xED", 0xA0, 0x9F},
                                   {"\xF0", 0x8F, 0x90}, {"\xF4", 0x90, 0x8F}, {"\xC3", '"', 0xA9}};
  for (const Case& c : cases) {
    auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kStringSchema});
    const std::string prefix = "{\"s\": \"" + c.prefix;
    ASSERT_EQ(feed(*m, prefix), prefix.size());
    const std::vector<int32_t> mask = next_mask(*m);
    EXPECT_FALSE(allows(mask, c.bad)) << c.prefix.size() << " then " << c.bad;
    EXPECT_TRUE(allows(mask, c.good)) << c.prefix.size() << " then " << c.good;
    EXPECT_FALSE(m->accept(c.bad));
    EXPECT_TRUE(m->accept(c.good));
  }
}

TEST(Utf8Masks, RollbackRestoresTheDecoderState) {
  auto m = byte_engine().matcher({GrammarKind::kJsonSchema, kStringSchema});
  ASSERT_EQ(feed(*m, "{\"s\": \"\xE2\x82"), 9u);
  const std::vector<int32_t> inside = next_mask(*m);
  EXPECT_FALSE(allows(inside, '"'));  // not in the middle of a character
  ASSERT_TRUE(m->accept(0xAC));       // the euro sign is complete
  EXPECT_TRUE(allows(next_mask(*m), '"'));
  m->rollback(1);
  EXPECT_EQ(next_mask(*m), inside);
}

// Code points of a UTF-8 string (valid by then).
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

TEST(Utf8Masks, RandomWalksOverTheMasksAlwaysParseAndValidate) {
  // scripts/gpu/structured_output_check.py's schema: 8 of 32 random-model outputs broke it.
  const std::string schema = R"({"type": "object", "additionalProperties": false,
      "required": ["name", "count", "ok", "tags"],
      "properties": {"name": {"type": "string", "maxLength": 8},
                     "count": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"},
                     "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}}})";
  std::mt19937 rng(2024);
  int non_ascii = 0;
  for (int walk = 0; walk < 200; ++walk) {
    auto m = byte_engine().matcher({GrammarKind::kJsonSchema, schema});
    std::string text;
    for (int step = 0; step < 2000 && !m->terminated(); ++step) {
      const std::vector<int32_t> mask = next_mask(*m);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < kModelVocab; ++id)
        if (allows(mask, id)) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty()) << "walk " << walk << " dead end after " << text;
      // Half the draws from the bytes >= 0x80 when allowed, so multi-byte characters are common.
      std::vector<int32_t> high;
      for (int32_t id : allowed)
        if (id >= 0x80 && id < 256) high.push_back(id);
      const std::vector<int32_t>& pool = !high.empty() && rng() % 2 ? high : allowed;
      const int32_t id = pool[rng() % pool.size()];
      ASSERT_TRUE(m->accept(id)) << "walk " << walk << ": the mask allowed " << id << " after " << text;
      if (id != kEos) text += static_cast<char>(id);
    }
    ASSERT_TRUE(m->terminated()) << "walk " << walk << " did not end: " << text;
    ASSERT_TRUE(valid_utf8(text)) << "walk " << walk << ": " << text;
    const nlohmann::json v = nlohmann::json::parse(text);  // throws on invalid UTF-8 too
    const std::string name = v.at("name").get<std::string>();
    EXPECT_LE(code_points(name), 8u) << text;
    EXPECT_TRUE(v.at("count").is_number_integer() && v["count"].get<int>() >= 0 && v["count"].get<int>() <= 999);
    EXPECT_TRUE(v.at("ok").is_boolean());
    EXPECT_LE(v.at("tags").size(), 3u);
    non_ascii += code_points(name) != name.size();
  }
  EXPECT_GT(non_ascii, 50);  // the walks did write multi-byte characters
}

}  // namespace
}  // namespace moeserve::grammar
