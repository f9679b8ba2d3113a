// Pre-tokenizer regexes through PCRE2 (UTF + UCP, JIT-compiled). Patterns are written for the
// Rust `regex`/`fancy-regex` crates (tiktoken) or Oniguruma (Hugging Face tokenizers); the few
// constructs PCRE2 spells differently are translated first (see translate_regex_for_pcre2).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

// Rewrites the constructs PCRE2 lacks into equivalents it has:
//  - class intersection `[A&&B]` (Rust regex, Kimi's pattern) -> `(?:(?=[B])[A])`,
//    and its negation `[^A&&B]` -> `(?:(?!(?=[B])[A])(?s:.))`;
//  - `\uHHHH` (Oniguruma) -> `\x{HHHH}`.
// Throws moeserve::Error naming `where` on an unterminated class.
std::string translate_regex_for_pcre2(std::string_view pattern, std::string_view where);

class Regex {
 public:
  // `where` names the file and entry the pattern came from, for error messages.
  Regex(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Calls on_match(begin, end) (byte offsets into `subject`) for every non-empty,
  // non-overlapping match from left to right. `subject` must be valid UTF-8.
  void for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace moeserve::tokenizer
