#include "grammar/tool_call_grammar.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moeserve::grammar {
namespace {

using Json = nlohmann::json;

Json const_string(const std::string& value) { return {{"type", "const_string"}, {"value", value}}; }

Json sequence(Json elements) { return {{"type", "sequence"}, {"elements", std::move(elements)}}; }

// One call of `name` with `parameters` arguments, in `format`.
Json one_call(const std::string& format, const std::string& name, const Json& parameters) {
  const Json arguments = {{"type", "json_schema"}, {"json_schema", parameters}};
  if (format == "kimi_k2")
    return sequence(
        Json::array({const_string("<|tool_call_begin|>functions." + name + ":0<|tool_call_argument_begin|>"), arguments,
                     const_string("<|tool_call_end|>")}));
  // qwen3 (Hermes style)
  return sequence(Json::array({const_string("<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": "),
                               arguments, const_string("}\n</tool_call>")}));
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
  MS_CHECK(p.format == "kimi_k2" || p.format == "qwen3",
           "tool_choice: constrained tool calls need the kimi_k2 or qwen3 tool-call format, not \"{}\"", p.format);
  Json calls = Json::array();
  for (const Json* function : allowed_tools(p.tools, p.choice)) {
    const Json parameters = function->contains("parameters") ? (*function)["parameters"] : Json{{"type", "object"}};
    calls.push_back(one_call(p.format, (*function)["name"].get<std::string>(), parameters));
  }
  Json call = calls.size() == 1 ? calls[0] : Json{{"type", "or"}, {"elements", calls}};
  Json format = p.format == "kimi_k2" ? sequence(Json::array({const_string("<|tool_calls_section_begin|>"), call,
                                                              const_string("<|tool_calls_section_end|>")}))
                                      : call;
  return {GrammarKind::kStructuralTag, Json{{"type", "structural_tag"}, {"format", format}}.dump(), true};
}

}  // namespace moeserve::grammar
