// Renderers of the Kimi K2 family templates (tests/tokenizer/data/chat_templates/kimi-k2*.jinja).
#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/chat_renderers.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer {
namespace {

using jinja::Json;

constexpr const char* kMediaPlaceholder = "<|media_start|>image<|media_content|><|media_pad|><|media_end|>";

// {% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}
bool is_image_part(const Json& part) {
  const Json& type = jinja::get(part, "type");
  return (type.is_string() && type.get_ref<const std::string&>() == "image") || part.contains("image") ||
         part.contains("image_url");
}

// The parts of a list content: images become the media placeholder (followed by
// `image_suffix`, a newline the thinking template leaves in), other parts print their "text".
void append_content_parts(const Json& parts, const std::string& where, const char* image_suffix, RenderedChat& out) {
  MS_CHECK(parts.is_array(), "{} must be a string, a list of parts or null, not {}", where, parts.type_name());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Json& part = parts[i];
    const std::string part_where = fmt::format("{}[{}]", where, i);
    MS_CHECK(part.is_object(), "{} must be an object, not {}", part_where, part.type_name());
    if (is_image_part(part)) {
      out += kMediaPlaceholder;
      out += image_suffix;
    } else if (part.contains("text")) {
      out.add_request_text(python_str(part["text"], part_where + ".text"));
    }
  }
}

void append_tools_declaration(const Json& tools, RenderedChat& out) {
  // {% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
  if (!jinja::truthy(tools)) return;
  out += "<|im_system|>tool_declare<|im_middle|>";
  out.add_request_text(python_json_dumps(tools));
  out += "<|im_end|>";
}

}  // namespace

RenderedChat render_kimi_k2(const ChatRequest& request) {
  const Json& messages = request.messages;
  RenderedChat out;
  append_tools_declaration(request.tools, out);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& message = messages[i];
    const std::string where = jinja::message_name(i);
    const std::string& role = message["role"].get_ref<const std::string&>();
    // {% if loop.first and messages[0]['role'] != 'system' %}
    if (i == 0 && role != "system") {
      out += "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>";
    }
    if (role == "system") {
      out += "<|im_system|>system<|im_middle|>";
    } else if (role == "user") {
      out += "<|im_user|>user<|im_middle|>";
    } else if (role == "assistant") {
      out += "<|im_assistant|>assistant<|im_middle|>";
    } else if (role == "tool") {
      out += "<|im_system|>tool<|im_middle|>";
    }
    // {% if message['content'] is string %}...{% else %}{% for content in message['content'] %}
    // (an absent content iterates as empty; a null one cannot be iterated)
    if (message.contains("content")) {
      const Json& content = message["content"];
      if (content.is_string()) {
        out.add_request_text(content.get_ref<const std::string&>());
      } else {
        append_content_parts(content, where + ".content", "", out);
      }
    }
    out += "<|im_end|>";
  }
  if (request.add_generation_prompt) out += "<|im_assistant|>assistant<|im_middle|>";
  return out;
}

namespace {

// {% macro render_content(msg) %}: content = msg.get('content'); a string as it is, none as
// nothing, a list part by part.
void append_thinking_content(const Json& message, const std::string& where, RenderedChat& out) {
  const Json& content = jinja::get(message, "content");
  if (content.is_string()) {
    out.add_request_text(content.get_ref<const std::string&>());
  } else if (!content.is_null()) {
    append_content_parts(content, where + ".content", "\n", out);
  }
}

// {% macro set_roles(message) %}: role_name = message.get('name') or message['role'].
void append_role_header(const Json& message, const std::string& where, RenderedChat& out) {
  const std::string& role = message["role"].get_ref<const std::string&>();
  const Json& name = jinja::get(message, "name");
  const char* marker = role == "user" ? "<|im_user|>" : role == "assistant" ? "<|im_assistant|>" : "<|im_system|>";
  out += marker;
  if (jinja::truthy(name))
    out.add_request_text(python_str(name, where + ".name"));
  else
    out += role;
  out += "<|im_middle|>";
}

// {% macro render_toolcalls(message) %}
void append_tool_calls(const Json& tool_calls, const std::string& where, RenderedChat& out) {
  MS_CHECK(tool_calls.is_array(), "{} must be a list, not {}", where, tool_calls.type_name());
  out += "<|tool_calls_section_begin|>";
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const Json& call = tool_calls[i];
    const std::string call_where = fmt::format("{}[{}]", where, i);
    MS_CHECK(call.is_object(), "{} must be an object", call_where);
    const Json& function = jinja::get(call, "function");
    MS_CHECK(function.is_object() && function.contains("arguments"), "{}.function must be an object with \"arguments\"",
             call_where);
    const Json& arguments = function["arguments"];
    out += "<|tool_call_begin|>";
    if (call.contains("id")) out.add_request_text(python_str(call["id"], call_where + ".id"));
    out += "<|tool_call_argument_begin|>";
    out.add_request_text(arguments.is_string() ? arguments.get<std::string>() : python_json_dumps(arguments));
    out += "<|tool_call_end|>";
  }
  out += "<|tool_calls_section_end|>";
}

}  // namespace

RenderedChat render_kimi_k2_thinking(const ChatRequest& request) {
  const Json& messages = request.messages;
  const size_t n = messages.size();
  // The messages after the last assistant message without tool calls keep their reasoning.
  size_t suffix_begin = 0;
  for (size_t idx = n; idx-- > 0;) {
    if (messages[idx]["role"] == "assistant" && !jinja::truthy(jinja::get(messages[idx], "tool_calls"))) {
      suffix_begin = idx + 1;
      break;
    }
  }
  RenderedChat out;
  append_tools_declaration(request.tools, out);
  if (n == 0 || messages[0]["role"] != "system") {
    out += "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>";
  }
  for (size_t i = 0; i < n; ++i) {
    const Json& message = messages[i];
    const std::string where = jinja::message_name(i);
    const std::string& role = message["role"].get_ref<const std::string&>();
    append_role_header(message, where, out);
    if (role == "assistant") {
      out += "<think>";
      // In the suffix: {{ message.get('reasoning_content', '') }}.
      if (i >= suffix_begin && message.contains("reasoning_content")) {
        out.add_request_text(python_str(message["reasoning_content"], where + ".reasoning_content"));
      }
      out += "</think>";
      append_thinking_content(message, where, out);
      const Json& tool_calls = jinja::get(message, "tool_calls");
      if (jinja::truthy(tool_calls)) append_tool_calls(tool_calls, where + ".tool_calls", out);
    } else if (role == "tool") {
      // ## Return of {{ message.tool_call_id }}\n{{ render_content(message) }}
      out += "## Return of ";
      if (message.contains("tool_call_id"))
        out.add_request_text(python_str(message["tool_call_id"], where + ".tool_call_id"));
      out += "\n";
      append_thinking_content(message, where, out);
    } else if (!message.contains("content") || !message["content"].is_null()) {
      append_thinking_content(message, where, out);
    }
    out += "<|im_end|>";
  }
  if (request.add_generation_prompt) out += "<|im_assistant|>assistant<|im_middle|>";
  return out;
}

}  // namespace moeserve::tokenizer
