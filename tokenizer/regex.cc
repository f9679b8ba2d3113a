#include "tokenizer/regex.h"

#include <pcre2.h>

#include <vector>

#include "core/error.h"

namespace moeserve::tokenizer {
namespace {

// Finds the ']' closing the class that opens at pattern[open] ('['), honouring escapes,
// nested classes and a leading ']' literal. Returns npos if unterminated.
size_t find_class_end(std::string_view p, size_t open) {
  size_t i = open + 1;
  if (i < p.size() && p[i] == '^') ++i;
  if (i < p.size() && p[i] == ']') ++i;  // a leading ']' is a literal
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      i += 2;
      continue;
    }
    if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
        const size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) return close;
        i = close + 2;
        continue;
      }
      const size_t nested_end = find_class_end(p, i);
      if (nested_end == std::string_view::npos) return nested_end;
      i = nested_end + 1;
      continue;
    }
    if (c == ']') return i;
    ++i;
  }
  return std::string_view::npos;
}

// Splits a class body at its top-level "&&" operators.
std::vector<std::string_view> split_intersection(std::string_view body) {
  std::vector<std::string_view> operands;
  size_t start = 0, i = 0;
  while (i < body.size()) {
    const char c = body[i];
    if (c == '\\') {
      i += 2;
      continue;
    }
    if (c == '[') {
      const size_t end = find_class_end(body, i);
      i = end == std::string_view::npos ? body.size() : end + 1;
      continue;
    }
    if (c == '&' && i + 1 < body.size() && body[i + 1] == '&') {
      operands.push_back(body.substr(start, i - start));
      i += 2;
      start = i;
      continue;
    }
    ++i;
  }
  operands.push_back(body.substr(start));
  return operands;
}

// One intersection operand as a stand-alone class: a nested class stays as it is, a run of
// class items gets brackets.
std::string operand_as_class(std::string_view operand, std::string_view where) {
  if (!operand.empty() && operand.front() == '[' && find_class_end(operand, 0) == operand.size() - 1) {
    return translate_regex_for_pcre2(operand, where);
  }
  std::string out = "[";
  out += translate_regex_for_pcre2(operand, where);
  out += ']';
  return out;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// True if s[j] starts an Oniguruma `\uHHHH` escape.
bool is_u_escape(std::string_view s, size_t j) {
  return j + 6 <= s.size() && s[j] == '\\' && s[j + 1] == 'u' && is_hex(s[j + 2]) && is_hex(s[j + 3]) &&
         is_hex(s[j + 4]) && is_hex(s[j + 5]);
}

// Appends `\x{HHHH}` for the `\uHHHH` escape at s[j].
void append_x_escape(std::string_view s, size_t j, std::string& out) {
  out += "\\x{";
  out.append(s.substr(j + 2, 4));
  out += '}';
}

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string translate_regex_for_pcre2(std::string_view p, std::string_view where) {
  std::string out;
  out.reserve(p.size() + 16);
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      if (is_u_escape(p, i)) {
        append_x_escape(p, i, out);
        i += 6;
        continue;
      }
      out.append(p.substr(i, 2));
      i += 2;
      continue;
    }
    if (c == '[') {
      const size_t end = find_class_end(p, i);
      MS_CHECK(end != std::string_view::npos, "{}: unterminated character class at offset {} in regex", where, i);
      const bool negated = i + 1 < p.size() && p[i + 1] == '^';
      const std::string_view body = p.substr(i + 1 + (negated ? 1 : 0), end - i - 1 - (negated ? 1 : 0));
      const std::vector<std::string_view> operands = split_intersection(body);
      if (operands.size() == 1) {
        // No intersection: copy the items, rewriting \uHHHH. PCRE2 reads '[' inside a class as
        // a literal, so a nested class (a Rust-regex union) cannot be carried over.
        out += negated ? "[^" : "[";
        size_t j = 0;
        while (j < body.size()) {
          if (is_u_escape(body, j)) {
            append_x_escape(body, j, out);
            j += 6;
            continue;
          }
          if (body[j] == '\\') {
            const size_t n = std::min<size_t>(2, body.size() - j);
            out.append(body.substr(j, n));
            j += n;
            continue;
          }
          MS_CHECK(body[j] != '[' || (j + 1 < body.size() && body[j + 1] == ':'),
                   "{}: nested character class at offset {} in regex is not supported", where, i + 1 + j);
          out += body[j];
          ++j;
        }
        out += ']';
      } else {
        std::string lookaheads;
        for (size_t k = 1; k < operands.size(); ++k) {
          lookaheads += "(?=" + operand_as_class(operands[k], where) + ")";
        }
        const std::string first = operand_as_class(operands[0], where);
        out += negated ? "(?:(?!" + lookaheads + first + ")(?s:.))" : "(?:" + lookaheads + first + ")";
      }
      i = end + 1;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, std::string_view where)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  const std::string translated = translate_regex_for_pcre2(pattern, where);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  MS_CHECK(compiled_->code != nullptr, "{}: regex does not compile at offset {}: {}", where, error_offset,
           pcre2_error_text(error_code));
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

namespace {

// One match-data block and JIT stack per thread: matching is reentrant across threads and
// allocates nothing per call. One ovector pair is enough, we only read the whole match.
struct ThreadMatchState {
  pcre2_match_data* match_data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = [this] {
    pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, jit_stack);
    return ctx;
  }();
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
};

}  // namespace

void Regex::for_each_match(std::string_view subject, const std::function<void(size_t, size_t)>& on_match) const {
  thread_local ThreadMatchState state;
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t offset = 0;
  while (offset < subject.size()) {
    const int rc = compiled_->jit ? pcre2_jit_match(compiled_->code, data, subject.size(), offset, 0, state.match_data,
                                                    state.context)
                                  : pcre2_match(compiled_->code, data, subject.size(), offset, PCRE2_NO_UTF_CHECK,
                                                state.match_data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    MS_CHECK(rc >= 0, "regex /{}/ failed while matching: {}", pattern_, pcre2_error_text(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      on_match(begin, end);
      offset = end;
    } else {
      // Empty match: step over one character so the scan always advances.
      offset = begin + 1;
      while (offset < subject.size() && (static_cast<unsigned char>(subject[offset]) & 0xC0) == 0x80) {
        ++offset;
      }
    }
  }
}

}  // namespace moeserve::tokenizer
