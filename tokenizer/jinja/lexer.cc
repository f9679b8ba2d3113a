#include "tokenizer/jinja/lexer.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"

namespace moeserve::tokenizer::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// jinja2 reads "\r\n", "\r" and "\n" as "\n" and drops one trailing newline.
std::string normalise(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& origin) : src_(normalise(source)), origin_(origin) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = next_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_data(std::move(text));
        advance_to(tag);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      strip_before_tag(text, kind, sign, line_starting);
      emit_data(std::move(text));
      advance_to(tag);
      line_starting = kind == '#' ? comment() : tag_body(kind, sign);
    }
    tokens_.push_back({TokenKind::End, "", line_, column_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& message) const { fail("{}:{}:{}: {}", origin_, line_, column_, message); }

  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        column_ = 1;
      } else if ((static_cast<unsigned char>(src_[pos_]) & 0xc0) != 0x80) {
        ++column_;
      }
    }
  }

  // `-` strips all whitespace before the tag; lstrip_blocks strips spaces from the start of
  // the line up to a block or comment tag (not `{{`, not `{%+`).
  static void strip_before_tag(std::string& text, char kind, char sign, bool line_starting) {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      text.resize(end);
      return;
    }
    if (sign == '+' || kind == '{') return;
    const size_t newline = text.rfind('\n');
    const size_t line_begin = newline == std::string::npos ? 0 : newline + 1;
    if (newline == std::string::npos && !line_starting) return;
    if (line_begin == text.size()) return;
    for (size_t i = line_begin; i < text.size(); ++i)
      if (!is_space(text[i])) return;
    text.resize(line_begin);
  }

  void emit_data(std::string text) {
    if (text.empty()) return;
    tokens_.push_back({TokenKind::Data, std::move(text), line_, column_});
  }

  // After a tag's end: `-` strips the whitespace that follows; trim_blocks drops one newline
  // after a block or comment tag. Returns whether what was consumed ended a line.
  bool after_tag_end(bool minus, bool trim_newline) {
    size_t p = pos_;
    if (minus) {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (trim_newline && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    const bool ends_line = p > 0 && src_[p - 1] == '\n';
    advance_to(p);
    return ends_line;
  }

  bool comment() {
    const size_t end = src_.find("#}", pos_ + 2);
    if (end == std::string::npos) error("Missing end of comment tag");
    const bool minus = end > pos_ + 2 && src_[end - 1] == '-';
    advance_to(end + 2);
    return after_tag_end(minus, true);
  }

  bool tag_body(char kind, char sign) {
    const int line = line_, column = column_;
    const bool block = kind == '%';
    advance_to(pos_ + 2 + (sign == '-' || sign == '+'));
    if (block && raw_begins()) return raw();
    tokens_.push_back({block ? TokenKind::BlockBegin : TokenKind::VarBegin, "", line, column});
    std::string depth;  // the closing brackets expected, innermost last
    while (true) {
      skip_spaces();
      if (pos_ >= src_.size())
        error(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (depth.empty()) {
        if (const int end = tag_end(block)) {
          const bool minus = src_[pos_] == '-', plus = src_[pos_] == '+';
          tokens_.push_back({block ? TokenKind::BlockEnd : TokenKind::VarEnd, "", line_, column_});
          advance_to(pos_ + end);
          return after_tag_end(minus, block && !plus);
        }
      }
      expression_token(depth);
    }
  }

  // The length of the tag's end at pos_ (`%}`, `-%}`, `+%}`; `}}`, `-}}`), 0 if none.
  int tag_end(bool block) const {
    const char* end = block ? "%}" : "}}";
    if (src_.compare(pos_, 2, end) == 0) return 2;
    if ((src_[pos_] == '-' || (block && src_[pos_] == '+')) && src_.compare(pos_ + 1, 2, end) == 0) return 3;
    return 0;
  }

  void skip_spaces() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    advance_to(p);
  }

  void expression_token(std::string& depth) {
    const char c = src_[pos_];
    if (is_name_start(c)) {
      size_t p = pos_;
      while (p < src_.size() && is_name_char(src_[p])) ++p;
      push(TokenKind::Name, src_.substr(pos_, p - pos_), p);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      number();
    } else if (c == '\'' || c == '"') {
      string_literal(c);
    } else {
      operator_token(depth);
    }
  }

  void push(TokenKind kind, std::string text, size_t end) {
    tokens_.push_back({kind, std::move(text), line_, column_});
    advance_to(end);
  }

  void number() {
    size_t p = pos_;
    auto digits = [&] {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
    };
    digits();
    bool real = false;
    if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      real = true;
      ++p;
      digits();
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        real = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < p; ++i)
      if (src_[i] != '_') text += src_[i];
    push(real ? TokenKind::Float : TokenKind::Int, text, p);
  }

  // Python's string escapes (jinja2 decodes literals with "unicode-escape").
  size_t escape(size_t p, std::string& out) const {
    const char e = src_[p];
    static const char* simple = "nrtabfv0\\'\"\n";
    static const char* values = "\n\r\t\a\b\f\v\0\\'\"";
    if (const char* hit = std::strchr(simple, e); hit && e) {
      if (e != '\n') out += values[hit - simple];
      return p + 1;
    }
    const int width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (width == 0 || p + width >= src_.size()) {
      out += '\\';
      out += e;
      return p + 1;
    }
    const uint32_t cp = static_cast<uint32_t>(std::stoul(src_.substr(p + 1, width), nullptr, 16));
    append_utf8(cp, out);
    return p + 1 + width;
  }

  void string_literal(char quote) {
    std::string value;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] == '\\' && p + 1 < src_.size()) {
        p = escape(p + 1, value);
      } else {
        value += src_[p++];
      }
    }
    if (p >= src_.size()) error("unexpected end of string literal");
    push(TokenKind::String, std::move(value), p + 1);
  }

  void operator_token(std::string& depth) {
    static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) return push(TokenKind::Op, op, pos_ + 2);
    }
    const char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}<>=.:|,;!", c)) error(fmt::format("unexpected char '{}'", c));
    if (c == '(' || c == '[' || c == '{') depth += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (depth.empty()) error(fmt::format("unexpected '{}'", c));
      if (depth.back() != c) error(fmt::format("unexpected '{}', expected '{}'", c, depth.back()));
      depth.pop_back();
    }
    push(TokenKind::Op, std::string(1, c), pos_ + 1);
  }

  // `{% raw %}` (pos_ just past "{%" and its sign): true if this tag is one.
  bool raw_begins() const {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    return true;
  }

  // The raw body up to `{% endraw %}`, as data. No trim_blocks after `{% raw %}` (jinja2's
  // raw_begin rule has none); the end tag behaves as any block end.
  bool raw() {
    size_t p = src_.find("raw", pos_) + 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    const bool minus = src_.compare(p, 3, "-%}") == 0;
    if (!minus && src_.compare(p, 2, "%}") != 0) error("expected '%}' after 'raw'");
    advance_to(p + (minus ? 3 : 2));
    if (minus) after_tag_end(true, false);
    for (size_t search = pos_;;) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) error("Unexpected end of template. Jinja was looking for 'endraw'");
      size_t q = tag + 2;
      const char sign = q < src_.size() ? src_[q] : '\0';
      if (sign == '-' || sign == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      std::string text = src_.substr(pos_, tag - pos_);
      strip_before_tag(text, '%', sign, false);
      emit_data(std::move(text));
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      advance_to(q);
      const int end = tag_end(true);
      if (end == 0) error("expected '%}' after 'endraw'");
      const bool end_minus = src_[pos_] == '-', end_plus = src_[pos_] == '+';
      advance_to(pos_ + end);
      return after_tag_end(end_minus, !end_plus);
    }
  }

  std::string src_;
  const std::string& origin_;
  size_t pos_ = 0;
  int line_ = 1, column_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& origin) { return Lexer(source, origin).run(); }

}  // namespace moeserve::tokenizer::jinja
