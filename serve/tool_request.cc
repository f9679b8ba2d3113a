#include "serve/tool_request.h"

#include <fmt/format.h>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/openai_request.h"

namespace moeserve::serve {

namespace {

using Json = nlohmann::ordered_json;

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::vector<std::string> tool_names(const Json& tools) {
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    auto function = tool.find("function");
    if (function == tool.end() || !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string())
      throw ApiError(400, fmt::format("tools[{}].function.name: required string", i), "tools");
    names.push_back((*function)["name"].get<std::string>());
  }
  return names;
}

// "auto", "none", or refused; absent is "auto" with tools.
std::string tool_choice(const Json& body) {
  const Json* choice = field(body, "tool_choice");
  if (!choice) return "default";
  if (choice->is_string() && (*choice == "none" || *choice == "auto")) return choice->get<std::string>();
  if ((choice->is_string() && *choice == "required") || choice->is_object())
    throw ApiError(400,
                   "tool_choice: \"required\" and a named function need constrained decoding, which this server "
                   "does not have yet; use \"auto\" or \"none\"",
                   "tool_choice");
  throw ApiError(400, "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}",
                 "tool_choice");
}

}  // namespace

void parse_output_parsing(const Json& body, const ServedModel& model, OutputParsing& parsing) {
  const Json* tools = field(body, "tools");
  const std::string choice = tool_choice(body);
  if (const Json* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean())
      throw ApiError(400, fmt::format("parallel_tool_calls: expected a boolean, got {}", parallel->type_name()),
                     "parallel_tool_calls");
    parsing.parallel_tool_calls = parallel->get<bool>();
  }
  const bool offered = tools && tools->is_array() && !tools->empty();
  if (choice == "auto" && offered && model.tool_call_parser.empty())
    throw ApiError(400, "tool_choice: \"auto\" needs a tool-call parser: start the server with --tool-call-parser",
                   "tool_choice");
  if (offered && choice != "none" && !model.tool_call_parser.empty()) {
    parsing.options.tool_parser = model.tool_call_parser;
    parsing.options.tools.tool_names = tool_names(*tools);
  }
  parsing.options.reasoning_parser = model.reasoning_parser;
  parsing.enabled = !parsing.options.tool_parser.empty() || !parsing.options.reasoning_parser.empty();
}

std::vector<int32_t> parse_scripted_output(const Json& body, const ServedModel& model) {
  const Json* script = field(body, "moeserve_test_script");
  if (!script) return {};
  if (!model.scripted_output)
    throw ApiError(400,
                   "moeserve_test_script: a test-only field; the server was not started with --test-scripted-output",
                   "moeserve_test_script");
  if (!script->is_string() || script->get_ref<const std::string&>().empty())
    throw ApiError(400, "moeserve_test_script: expected a non-empty string", "moeserve_test_script");
  try {
    return model.tokenizer->encode(script->get<std::string>(), /*allow_special=*/true);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("moeserve_test_script: {}", e.what()), "moeserve_test_script");
  }
}

}  // namespace moeserve::serve
