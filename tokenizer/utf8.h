// UTF-8 helpers shared by the tokenizer, the detokenizer and the chat templates.
// Ill-formed input is replaced the way Python's errors="replace" and Rust's
// String::from_utf8_lossy do it: one U+FFFD per maximal ill-formed subpart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

// What one step of UTF-8 decoding at a position found.
struct Utf8Step {
  enum class Kind { kValid, kInvalid, kTruncated };
  Kind kind;
  size_t length;       // bytes consumed: the sequence, the ill-formed subpart, or the partial tail
  uint32_t codepoint;  // valid only for kValid
};

// Decodes the sequence that starts at bytes[pos]. kTruncated: a valid prefix that the end of
// `bytes` cut short (more bytes could complete it).
Utf8Step utf8_step(std::string_view bytes, size_t pos);

// Byte offset of the first ill-formed or truncated sequence, or npos if `bytes` is valid UTF-8.
size_t first_invalid_utf8(std::string_view bytes);

// Appends `bytes` to `out`, each ill-formed or truncated subpart replaced by U+FFFD.
void append_utf8_lossy(std::string_view bytes, std::string& out);

// Length of the trailing bytes of `bytes` that form a truncated but still completable sequence
// (0 to 3); the streaming detokenizer holds these back.
size_t completable_utf8_tail(std::string_view bytes);

void append_codepoint(uint32_t codepoint, std::string& out);

}  // namespace moeserve::tokenizer
