// Valid UTF-8, as a constraint beside the grammar's. xgrammar 0.1.27 matches the non-ASCII
// part of a negated character class (a JSON string's [^"\\\x00-\x1f]) loosely: any lead byte
// C0..F7, then any continuation bytes 80..BF (earley_parser.cc, AdvanceCharacterClass and
// HandleUTF8FirstByte; the regex FSMs of grammar_functor.cc take the same ranges C080..F7BFBFBF),
// so overlong forms (C0 80, E0 80 80), UTF-16 surrogates (ED A0 80) and code points past
// U+10FFFF (F4 90 80 80, F5..F7) pass. Byte-level tokens spell such sequences one byte at a
// time, and the detokenizer prints each invalid byte as U+FFFD: a maxLength-8 string came out
// with 12 characters. Here every state of a UTF-8 decoder (RFC 3629's table) has the mask of
// the tokens whose bytes continue validly from it; a matcher ANDs its state's mask in.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::grammar {

// Where a UTF-8 decoder stands between bytes: at a character boundary, or inside a character
// with the ranges its next bytes must fall in.
enum class Utf8State : uint8_t {
  kBoundary,  // between characters (the only state text may end in)
  kTail1,     // one more 80..BF
  kTail2,     // two more 80..BF
  kTail3,     // three more 80..BF
  kE0,        // after E0: A0..BF, then one 80..BF (no overlong 3-byte forms)
  kED,        // after ED: 80..9F, then one 80..BF (no surrogates)
  kF0,        // after F0: 90..BF, then two 80..BF (no overlong 4-byte forms)
  kF4,        // after F4: 80..8F, then two 80..BF (nothing past U+10FFFF)
  kInvalid,   // not UTF-8
};
inline constexpr int kUtf8States = 8;  // the valid ones

// The state after `bytes` from `state` (kInvalid stays kInvalid).
Utf8State utf8_after(Utf8State state, std::string_view bytes);

class Utf8Masks {
 public:
  // token_bytes [ids]: "" for the ids with no text (stop and special tokens: allowed at a
  // character boundary only, where the grammar's mask decides). words: the mask's width.
  Utf8Masks(const std::vector<std::string>& token_bytes, int64_t words);

  // [words]: bit id % 32 of word id / 32 set when id's bytes are valid UTF-8 from `state`.
  std::span<const int32_t> allowed(Utf8State state) const;
  int64_t words() const { return words_; }

 private:
  int64_t words_;
  std::vector<int32_t> bits_;  // [kUtf8States, words]
};

}  // namespace moeserve::grammar
