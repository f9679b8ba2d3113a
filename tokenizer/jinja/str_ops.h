// Python's str methods on provenance-keeping strings (indices count code points, as Python's
// do). Case mappings cover ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace moeserve::tokenizer::jinja {

// chars: nullopt strips Python's ASCII whitespace (space, \t\n\v\f\r, \x1c-\x1f).
Str str_strip(const Str& s, const std::optional<std::string>& chars, bool left, bool right);
// sep: nullopt splits on whitespace runs; maxsplit < 0: no limit; from_right: rsplit.
std::vector<Str> str_split(const Str& s, const std::optional<std::string>& sep, int64_t maxsplit, bool from_right);
Str str_replace(const Str& s, const std::string& old, const Str& replacement, int64_t count);
Str str_upper(const Str& s);
Str str_lower(const Str& s);
Str str_capitalize(const Str& s);
// Python's str.title (a cased letter after an uncased character starts a word).
Str str_title(const Str& s);
// jinja2's title filter: words start after "-", whitespace or an opening bracket.
Str str_word_title(const Str& s);
// Python's str.islower / str.isupper (lower = false).
bool str_is_lower(const std::string& s, bool lower);
// Python's str.splitlines() (no line ends kept; no empty last line for a final newline).
std::vector<Str> str_splitlines(const Str& s);
// Byte offsets of each code point, plus the end: offsets[i] starts code point i.
std::vector<size_t> code_point_offsets(const std::string& s);
// The code point index of byte offset `byte` (npos stays -1).
int64_t code_point_index(const std::string& s, size_t byte);

}  // namespace moeserve::tokenizer::jinja
