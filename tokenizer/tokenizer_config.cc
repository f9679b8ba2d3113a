#include "tokenizer/tokenizer_config.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "core/error.h"
#include "tokenizer/json_file.h"

namespace moeserve::tokenizer {
namespace {

// A special-token field is either "text" or an AddedToken object {"content": "text", ...}.
std::optional<std::string> special_token_text(const nlohmann::ordered_json& config, const char* key,
                                              const std::string& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  MS_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(),
           "{}: \"{}\" must be a string or an object with a string \"content\"", path, key);
  return (*it)["content"].get<std::string>();
}

int32_t parse_token_id(const std::string& key, const std::string& where) {
  size_t used = 0;
  long long id = -1;
  try {
    id = std::stoll(key, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MS_CHECK(used == key.size() && id >= 0, "{}: \"{}\" is not a token id", where, key);
  MS_CHECK(id < kMaxTokenIds, "{}: token id {} is not below {} (2^24)", where, id, kMaxTokenIds);
  return static_cast<int32_t>(id);
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& model_dir, bool required) {
  namespace fs = std::filesystem;
  TokenizerConfig config;
  const std::string path = (fs::path(model_dir) / "tokenizer_config.json").string();
  if (fs::exists(path)) {
    config.path = path;
    const nlohmann::ordered_json json = read_json_file(path);
    MS_CHECK(json.is_object(), "{}: the top level must be a JSON object", path);
    config.bos_token = special_token_text(json, "bos_token", path);
    config.eos_token = special_token_text(json, "eos_token", path);
    config.tokenizer_class = optional_string(json, "tokenizer_class", path).value_or("");
    if (const auto it = json.find("added_tokens_decoder"); it != json.end() && !it->is_null()) {
      MS_CHECK(it->is_object(), "{}: \"added_tokens_decoder\" must be an object", path);
      for (const auto& [key, entry] : it->items()) {
        const std::string where = path + ": added_tokens_decoder[\"" + key + "\"]";
        const int32_t id = parse_token_id(key, where);
        MS_CHECK(entry.is_object(), "{}: must be an object", where);
        const auto content = optional_string(entry, "content", where);
        MS_CHECK(content.has_value() && !content->empty(), "{}: needs a non-empty \"content\"", where);
        const auto special = entry.find("special");
        MS_CHECK(special == entry.end() || special->is_boolean(), "{}: \"special\" must be a boolean", where);
        config.added_tokens_decoder.push_back({id, *content, special == entry.end() ? false : special->get<bool>()});
      }
      std::sort(config.added_tokens_decoder.begin(), config.added_tokens_decoder.end(),
                [](const auto& a, const auto& b) { return a.id < b.id; });
    }
    if (const auto it = json.find("chat_template"); it != json.end() && !it->is_null()) {
      if (it->is_string()) {
        config.chat_template = {it->get<std::string>(), path + ": chat_template", ""};
      } else {
        MS_CHECK(it->is_array(), "{}: \"chat_template\" must be a string or a list", path);
        for (const auto& entry : *it) {
          if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
              entry["template"].is_string()) {
            config.chat_template = {entry["template"].get<std::string>(), path + ": chat_template[name=default]", ""};
          }
        }
        MS_CHECK(!config.chat_template.text.empty(), "{}: \"chat_template\" is a list without a \"default\" template",
                 path);
      }
    }
  } else {
    MS_CHECK(!required, "{}: file not found (the tiktoken format needs it)", path);
  }
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path)) config.chat_template = {read_text_file(jinja_path), jinja_path, ""};
  return config;
}

}  // namespace moeserve::tokenizer
