// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (separators
// ", " and ": ", keys in insertion order): the `tojson` filter of transformers' chat templates.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moeserve::tokenizer {

std::string python_json_dumps(const nlohmann::ordered_json& value);

// Python's repr(float) as json.dumps writes it (NaN, Infinity, -Infinity for the non-finite).
std::string python_float(double v);
// A JSON string literal as json.dumps(s, ensure_ascii=False) writes it, appended to `out`.
void append_python_json_string(const std::string& s, std::string& out);

// What Jinja prints for `{{ value }}` (Python's str()): strings as they are, null as "None",
// booleans as "True"/"False", numbers as Python writes them. Throws for arrays and objects.
std::string python_str(const nlohmann::ordered_json& value, std::string_view what);

}  // namespace moeserve::tokenizer
