#include "tokenizer/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace moeserve::tokenizer {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MS_CHECK(in.good(), "{}: cannot open file", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  MS_CHECK(!in.bad(), "{}: read error", path);
  return buffer.str();
}

nlohmann::ordered_json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range: a number beyond double
    // what() is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string reason = e.what();
    const size_t tag_end = reason.find("] ");
    if (tag_end != std::string::npos) reason.erase(0, tag_end + 2);
    for (char& c : reason) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    fail("{}: invalid JSON: {}", path, reason);
  }
}

std::optional<std::string> optional_string(const nlohmann::ordered_json& object, const char* key,
                                           const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  MS_CHECK(it->is_string(), "{}: \"{}\" must be a string, not {}", where, key, it->type_name());
  return it->get<std::string>();
}

}  // namespace moeserve::tokenizer
