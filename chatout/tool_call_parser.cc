#include "chatout/tool_call_parser.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace moeserve::chatout {

ToolCallParser::ToolCallParser(ToolParserOptions options)
    : options_(std::move(options)),
      rng_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {}

bool ToolCallParser::tool_known(std::string_view name) const {
  if (name.empty()) return false;
  return options_.tool_names.empty() ||
         std::find(options_.tool_names.begin(), options_.tool_names.end(), name) != options_.tool_names.end();
}

std::string ToolCallParser::new_call_id() {
  // OpenAI's shape: "call_" and 24 letters or digits.
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng_() % (sizeof(kAlphabet) - 1)];
  return id;
}

int ToolCallParser::begin_call(const std::string& name, const std::string& id, OutputDelta& out) {
  const int index = next_index_++;
  out.tool_calls.push_back({index, id.empty() ? new_call_id() : id, name, ""});
  return index;
}

const std::vector<std::string>& tool_parser_names() {
  static const std::vector<std::string> names = {"kimi_k2", "deepseek_v3", "deepseek_v31", "qwen3"};
  return names;
}

std::unique_ptr<ToolCallParser> make_tool_parser(std::string_view name, ToolParserOptions options) {
  if (name == "kimi_k2") return make_kimi_k2_parser(std::move(options));
  if (name == "deepseek_v3") return make_deepseek_v3_parser(std::move(options));
  if (name == "deepseek_v31") return make_deepseek_v31_parser(std::move(options));
  if (name == "qwen3") return make_qwen3_parser(std::move(options));
  throw Error(
      fmt::format("--tool-call-parser: unknown parser '{}' (known: {})", name, fmt::join(tool_parser_names(), ", ")));
}

}  // namespace moeserve::chatout
