#include "grammar/tool_call_grammar.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve::grammar {
namespace {

using Json = nlohmann::json;

Json const_string(const std::string& value) { return {{"type", "const_string"}, {"value", value}}; }

Json sequence(Json elements) { return {{"type", "sequence"}, {"elements", std::move(elements)}}; }

// A format's call of NAME: before + arguments + after, inside section_begin ... section_end
// (empty: no section). The chatout/ parser of the same name reads it back.
struct CallFormat {
  std::string section_begin, section_end;
  std::string (*before)(const std::string& name);
  std::string after;
};

const CallFormat* call_format(const std::string& format) {
  static const CallFormat kimi_k2{
      "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
      [](const std::string& name) { return "<|tool_call_begin|>functions." + name + ":0<|tool_call_argument_begin|>"; },
      "<|tool_call_end|>"};
  static const CallFormat deepseek_v3{
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
      [](const std::string& name) { return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"; },
      "\n```<｜tool▁call▁end｜>"};
  static const CallFormat deepseek_v31{
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
      [](const std::string& name) { return "<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>"; }, "<｜tool▁call▁end｜>"};
  static const CallFormat qwen3{
      // Hermes style, no section
      "", "",
      [](const std::string& name) { return "<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": "; },
      "}\n</tool_call>"};
  if (format == "kimi_k2") return &kimi_k2;
  if (format == "deepseek_v3") return &deepseek_v3;
  if (format == "deepseek_v31") return &deepseek_v31;
  if (format == "qwen3") return &qwen3;
  return nullptr;
}

// One call of `name` with `parameters` arguments, in `format`.
Json one_call(const CallFormat& format, const std::string& name, const Json& parameters) {
  const Json arguments = {{"type", "json_schema"}, {"json_schema", parameters}};
  return sequence(Json::array({const_string(format.before(name)), arguments, const_string(format.after)}));
}

// The "function" object of a tool or a named choice, and its name (Error naming `what`).
const Json& function_of(const Json& holder, const char* what) {
  const Json* function = holder.is_object() && holder.contains("function") ? &holder["function"] : nullptr;
  MS_CHECK(function && function->is_object() && function->contains("name") && (*function)["name"].is_string(),
           "{}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", what);
  return *function;
}

// The tools a choice allows: every tool for "required", the named one otherwise.
std::vector<const Json*> allowed_tools(const Json& tools, const Json& choice) {
  MS_CHECK(tools.is_array() && !tools.empty(), "tool_choice: a constraining choice needs a non-empty \"tools\" array");
  std::string named;
  if (choice.is_object()) {
    named = function_of(choice, "tool_choice")["name"].get<std::string>();
  } else {
    MS_CHECK(choice.is_string() && choice.get<std::string>() == "required",
             "tool_choice: only \"required\" or a named function constrain the output, got {}", choice.dump());
  }
  std::vector<const Json*> out;
  for (const Json& tool : tools) {
    const Json& function = function_of(tool, "tools");
    if (named.empty() || function["name"].get<std::string>() == named) out.push_back(&function);
  }
  MS_CHECK(!out.empty(), "tool_choice: function \"{}\" is not among the request's tools", named);
  return out;
}

}  // namespace

GrammarSpec tool_call_grammar(const ToolCallGrammarParams& p) {
  const CallFormat* format = call_format(p.format);
  MS_CHECK(format != nullptr,
           "tool_choice: constrained tool calls need the kimi_k2, deepseek_v3, deepseek_v31 or qwen3 tool-call "
           "format, not \"{}\"",
           p.format);
  Json calls = Json::array();
  for (const Json* function : allowed_tools(p.tools, p.choice)) {
    const Json parameters = function->contains("parameters") ? (*function)["parameters"] : Json{{"type", "object"}};
    calls.push_back(one_call(*format, (*function)["name"].get<std::string>(), parameters));
  }
  Json call = calls.size() == 1 ? calls[0] : Json{{"type", "or"}, {"elements", calls}};
  Json root =
      format->section_begin.empty()
          ? call
          : sequence(Json::array({const_string(format->section_begin), call, const_string(format->section_end)}));
  return {GrammarKind::kToolCall, Json{{"type", "structural_tag"}, {"format", root}}.dump(), true};
}

}  // namespace moeserve::grammar
