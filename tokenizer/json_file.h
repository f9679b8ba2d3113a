// Reading tokenizer files with one-line errors that name the file.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace moeserve::tokenizer {

// The whole file; an error names the path if it cannot be read.
std::string read_text_file(const std::string& path);

// The file parsed as JSON (key order kept); an error names the path, line and column.
nlohmann::ordered_json read_json_file(const std::string& path);

// `object[key]` as a string; an error names `where` and the key. nullopt if absent or null.
std::optional<std::string> optional_string(const nlohmann::ordered_json& object, const char* key,
                                           const std::string& where);

}  // namespace moeserve::tokenizer
