#include "tokenizer/jinja/str_ops.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace moeserve::tokenizer::jinja {
namespace {

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

size_t cp_length(unsigned char lead) {
  if (lead >= 0xf0) return 4;
  if (lead >= 0xe0) return 3;
  if (lead >= 0xc0) return 2;
  return 1;
}

// Whether the code point at `i` is one of `chars`' code points; its length in *len.
bool in_chars(const std::string& s, size_t i, const std::vector<std::string>& chars, size_t* len) {
  for (const std::string& c : chars) {
    if (s.compare(i, c.size(), c) == 0) {
      *len = c.size();
      return true;
    }
  }
  return false;
}

std::vector<std::string> split_code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(cp_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Simple case mappings of the scripts chat text mostly has cased letters in: ASCII, Latin-1,
// Latin Extended-A, Greek and Cyrillic (Python's full Unicode tables beyond them are not here).
uint32_t lower_cp(uint32_t c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x391 && c <= 0x3ab && c != 0x3a2) ||
      (c >= 0x410 && c <= 0x42f))
    return c + 0x20;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_upper ? c % 2 == 1 : c % 2 == 0) return c + 1;
  }
  return c;
}

uint32_t upper_cp(uint32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x3b1 && c <= 0x3cb && c != 0x3c2) ||
      (c >= 0x430 && c <= 0x44f))
    return c - 0x20;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x450 && c <= 0x45f) return c - 0x50;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_upper ? c % 2 == 0 : c % 2 == 1) return c - 1;
  }
  return c;
}

bool is_cased(uint32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }

// Rewrites `s` code point by code point with f(code point, index); provenance kept per code point.
template <typename F>
Str map_code_points(const Str& s, F&& f) {
  Str out;
  const std::string& t = s.text;
  size_t index = 0;
  for (size_t i = 0; i < t.size(); ++index) {
    const size_t n = std::min(cp_length(static_cast<unsigned char>(t[i])), t.size() - i);
    uint32_t cp = n == 1 ? static_cast<unsigned char>(t[i]) : static_cast<unsigned char>(t[i]) & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(t[i + k]) & 0x3f);
    const uint32_t mapped = f(cp, index);
    Str piece = s.substr(i, i + n);
    if (mapped != cp) {
      std::string utf8;
      append_code_point(mapped, utf8);
      piece.text = utf8;  // same length: the mapped ranges stay within one UTF-8 length class
    }
    out.append(piece);
    i += n;
  }
  return out;
}

}  // namespace

Str str_strip(const Str& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::string& t = s.text;
  size_t begin = 0, end = t.size();
  if (!chars) {
    while (left && begin < end && py_space(static_cast<unsigned char>(t[begin]))) ++begin;
    while (right && end > begin && py_space(static_cast<unsigned char>(t[end - 1]))) --end;
    return s.substr(begin, end);
  }
  const std::vector<std::string> set = split_code_points(*chars);
  size_t len = 0;
  while (left && begin < end && in_chars(t, begin, set, &len)) begin += len;
  while (right && end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(t[start]) & 0xc0) == 0x80) --start;
    if (!in_chars(t, start, set, &len) || start + len != end) break;
    end = start;
  }
  return s.substr(begin, end);
}

namespace {

std::vector<Str> split_whitespace(const Str& s, int64_t maxsplit, bool from_right) {
  const std::string& t = s.text;
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t i = 0; i < t.size();) {
    while (i < t.size() && py_space(static_cast<unsigned char>(t[i]))) ++i;
    if (i == t.size()) break;
    size_t j = i;
    while (j < t.size() && !py_space(static_cast<unsigned char>(t[j]))) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  std::vector<Str> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
    for (const auto& [b, e] : words) out.push_back(s.substr(b, e));
    return out;
  }
  const size_t keep = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t k = 0; k < keep; ++k) out.push_back(s.substr(words[k].first, words[k].second));
    out.push_back(str_strip(s.substr(words[keep].first, t.size()), std::nullopt, false, true));
  } else {
    const size_t first = words.size() - keep;
    out.push_back(str_strip(s.substr(0, words[first - 1].second), std::nullopt, true, false));
    for (size_t k = first; k < words.size(); ++k) out.push_back(s.substr(words[k].first, words[k].second));
  }
  return out;
}

}  // namespace

std::vector<Str> str_split(const Str& s, const std::optional<std::string>& sep, int64_t maxsplit, bool from_right) {
  if (!sep) return split_whitespace(s, maxsplit, from_right);
  const std::string& t = s.text;
  std::vector<size_t> hits;
  if (!sep->empty()) {
    for (size_t p = t.find(*sep); p != std::string::npos; p = t.find(*sep, p + sep->size())) hits.push_back(p);
  }
  if (maxsplit >= 0 && hits.size() > static_cast<size_t>(maxsplit)) {
    if (from_right)
      hits.erase(hits.begin(), hits.end() - maxsplit);
    else
      hits.resize(static_cast<size_t>(maxsplit));
  }
  std::vector<Str> out;
  size_t begin = 0;
  for (size_t h : hits) {
    out.push_back(s.substr(begin, h));
    begin = h + sep->size();
  }
  out.push_back(s.substr(begin, t.size()));
  return out;
}

Str str_replace(const Str& s, const std::string& old, const Str& replacement, int64_t count) {
  Str out;
  const std::string& t = s.text;
  size_t begin = 0;
  int64_t done = 0;
  if (old.empty()) return s;
  for (size_t p = t.find(old); p != std::string::npos && (count < 0 || done < count); p = t.find(old, begin)) {
    out.append(s.substr(begin, p));
    out.append(replacement);
    begin = p + old.size();
    ++done;
  }
  out.append(s.substr(begin, t.size()));
  return out;
}

Str str_upper(const Str& s) {
  return map_code_points(s, [](uint32_t c, size_t) { return upper_cp(c); });
}
Str str_lower(const Str& s) {
  return map_code_points(s, [](uint32_t c, size_t) { return lower_cp(c); });
}

Str str_capitalize(const Str& s) {
  return map_code_points(s, [](uint32_t c, size_t i) { return i == 0 ? upper_cp(c) : lower_cp(c); });
}

Str str_title(const Str& s) {
  bool previous_cased = false;
  return map_code_points(s, [&](uint32_t c, size_t) {
    const uint32_t mapped = previous_cased ? lower_cp(c) : upper_cp(c);
    previous_cased = is_cased(c);
    return mapped;
  });
}

Str str_word_title(const Str& s) {
  bool word_start = true;
  return map_code_points(s, [&](uint32_t c, size_t) {
    if (c < 0x80 && std::strchr("-({[< \t\n\r\f\v", static_cast<int>(c)) && c) {
      word_start = true;
      return c;
    }
    const uint32_t mapped = word_start ? upper_cp(c) : lower_cp(c);
    word_start = false;
    return mapped;
  });
}

bool str_is_lower(const std::string& s, bool lower) {
  bool any = false;
  const Str str{s, {}};
  bool ok = true;
  map_code_points(str, [&](uint32_t c, size_t) {
    if (is_cased(c)) {
      any = true;
      if ((lower ? upper_cp(c) == c : lower_cp(c) == c) && c != 0xdf) ok = false;
    }
    return c;
  });
  return any && ok;
}

std::vector<Str> str_splitlines(const Str& s) {
  std::vector<Str> out;
  const std::string& t = s.text;
  size_t begin = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c != '\n' && c != '\r' && c != '\v' && c != '\f' && !(c >= 0x1c && c <= 0x1e)) continue;
    out.push_back(s.substr(begin, i));
    if (c == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
    begin = i + 1;
  }
  if (begin < t.size()) out.push_back(s.substr(begin, t.size()));
  return out;
}

std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) offsets.push_back(i);
  offsets.push_back(s.size());
  return offsets;
}

int64_t code_point_index(const std::string& s, size_t byte) {
  if (byte == std::string::npos) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < byte && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xc0) != 0x80;
  return n;
}

}  // namespace moeserve::tokenizer::jinja
