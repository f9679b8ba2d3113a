#include "serve/tool_request.h"

#include <fmt/format.h>

#include "core/error.h"
#include "grammar/tool_call_grammar.h"
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

// "default" (absent), "auto", "none", "required" or "named".
std::string tool_choice(const Json& body) {
  const Json* choice = field(body, "tool_choice");
  if (!choice) return "default";
  if (choice->is_string() && (*choice == "none" || *choice == "auto" || *choice == "required"))
    return choice->get<std::string>();
  if (choice->is_object()) return "named";
  throw ApiError(400, "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}",
                 "tool_choice");
}

// tool_choice "required" / named: the output constrained to one call of an allowed tool in
// the parser's format (grammar/tool_call_grammar.h).
grammar::GrammarSpec constrained_call(const Json& body, const ServedModel& model, const std::string& choice,
                                      bool response_format) {
  const Json* tools = field(body, "tools");
  if (!tools || !tools->is_array() || tools->empty())
    throw ApiError(400, fmt::format("tool_choice: \"{}\" needs a non-empty \"tools\" array", choice), "tool_choice");
  if (model.tool_call_parser.empty())
    throw ApiError(
        400,
        fmt::format("tool_choice: \"{}\" needs a tool-call parser: start the server with --tool-call-parser", choice),
        "tool_choice");
  if (model.grammar == nullptr)
    throw ApiError(
        400, fmt::format("tool_choice: \"{}\" needs structured output: this server has no grammar engine", choice),
        "tool_choice");
  if (response_format)
    throw ApiError(400,
                   "tool_choice: a required or named tool choice constrains the output; it cannot be combined "
                   "with response_format",
                   "tool_choice");
  try {
    // tool_call_grammar reads plain nlohmann::json (the grammar module's type).
    const nlohmann::json plain_tools = nlohmann::json::parse(tools->dump());
    const nlohmann::json plain_choice = nlohmann::json::parse(field(body, "tool_choice")->dump());
    grammar::GrammarSpec spec = grammar::tool_call_grammar({model.tool_call_parser, plain_tools, plain_choice});
    model.grammar->compile(spec);  // a parameters schema xgrammar cannot take: a 400 now
    return spec;
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "tool_choice");
  }
}

}  // namespace

void parse_output_parsing(const Json& body, const ServedModel& model, OutputParsing& parsing,
                          std::optional<grammar::GrammarSpec>& grammar) {
  const Json* tools = field(body, "tools");
  const std::string choice = tool_choice(body);
  if (const Json* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean())
      throw ApiError(400, fmt::format("parallel_tool_calls: expected a boolean, got {}", parallel->type_name()),
                     "parallel_tool_calls");
    parsing.parallel_tool_calls = parallel->get<bool>();
  }
  if (choice == "required" || choice == "named")
    grammar = constrained_call(body, model, choice, /*response_format=*/grammar.has_value());
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
