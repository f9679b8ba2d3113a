// Renderer of the DeepSeek-V3 template (tests/tokenizer/data/chat_templates/deepseek-v3.jinja).
// It keeps the template's quirks: ns.is_first is never reset, so only the first tool call of
// the conversation opens a <｜tool▁calls▁begin｜> section, and every later call closes one.
#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/chat_renderers.h"

namespace moeserve::tokenizer {
namespace {

using jinja::Json;

// '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n'
//   + tool['function']['arguments'] + '\n```<｜tool▁call▁end｜>'
void append_tool_call(const Json& tool, const std::string& where, RenderedChat& out) {
  const std::string& type = jinja::string_operand(tool, "type", where);
  const Json& function = jinja::get(tool, "function");
  const std::string function_where = where + ".function";
  const std::string& name = jinja::string_operand(function, "name", function_where);
  const std::string& arguments = jinja::string_operand(function, "arguments", function_where);
  out += "<｜tool▁call▁begin｜>";
  out.add_request_text(type);
  out += "<｜tool▁sep｜>";
  out.add_request_text(name);
  out += "\n```json\n";
  out.add_request_text(arguments);
  out += "\n```<｜tool▁call▁end｜>";
}

}  // namespace

RenderedChat render_deepseek_v3(const ChatRequest& request, const ChatSpecialTokens& special_tokens) {
  const Json& messages = request.messages;
  // System messages, wherever they are, joined by blank lines after the BOS token.
  RenderedChat out;
  out += special_tokens.bos_token;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "system") continue;
    if (!first_system) out += "\n\n";
    out.add_request_text(jinja::string_operand(messages[i], "content", jinja::message_name(i)));
    first_system = false;
  }
  bool is_first = false, is_tool = false, is_output_first = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& message = messages[i];
    const std::string where = jinja::message_name(i);
    const std::string& role = message["role"].get_ref<const std::string&>();
    auto content = [&]() -> const std::string& { return jinja::string_operand(message, "content", where); };
    if (role == "user") {
      is_tool = false;
      out += "<｜User｜>";
      out.add_request_text(content());
    } else if (role == "assistant") {
      MS_CHECK(message.contains("content"), "{}.content is missing (the template needs it, null or text)", where);
      if (message["content"].is_null()) {
        is_tool = false;
        // {% for tool in message['tool_calls'] %}: absent iterates as empty.
        if (message.contains("tool_calls")) {
          const Json& tool_calls = message["tool_calls"];
          MS_CHECK(tool_calls.is_array(), "{}.tool_calls must be a list", where);
          for (size_t k = 0; k < tool_calls.size(); ++k) {
            const std::string call_where = fmt::format("{}.tool_calls[{}]", where, k);
            if (!is_first) {
              out += "<｜Assistant｜><｜tool▁calls▁begin｜>";
              append_tool_call(tool_calls[k], call_where, out);
              is_first = true;
            } else {
              out += "\n";
              append_tool_call(tool_calls[k], call_where, out);
              out += "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
            }
          }
        }
      } else if (is_tool) {
        out += "<｜tool▁outputs▁end｜>";
        out.add_request_text(content());
        out += "<｜end▁of▁sentence｜>";
        is_tool = false;
      } else {
        out += "<｜Assistant｜>";
        out.add_request_text(content());
        out += "<｜end▁of▁sentence｜>";
      }
    } else if (role == "tool") {
      is_tool = true;
      if (is_output_first) {
        out += "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>";
        out.add_request_text(content());
        out += "<｜tool▁output▁end｜>";
        is_output_first = false;
      } else {
        out += "\n<｜tool▁output▁begin｜>";
        out.add_request_text(content());
        out += "<｜tool▁output▁end｜>";
      }
    }
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (request.add_generation_prompt && !is_tool) out += "<｜Assistant｜>";
  return out;
}

}  // namespace moeserve::tokenizer
