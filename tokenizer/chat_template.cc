#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "tokenizer/builtin_chat_templates.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/json_file.h"

namespace moeserve::tokenizer {
namespace {

using Json = nlohmann::ordered_json;
using jinja::Value;

// transformers appends this to the final message for continue_final_message, then cuts the
// prompt where it appears (render_jinja_template).
constexpr const char* kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

std::string known_names() { return fmt::format("{}", fmt::join(chat_template_names(), ", ")); }

// transformers' _alias_reasoning_fields: the first non-null of reasoning_content, thinking
// and reasoning is passed as {"thinking": r, **message, "reasoning_content": r}.
Json alias_reasoning(const Json& message) {
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const auto it = message.find(key);
    if (it == message.end() || it->is_null()) continue;
    const Json reasoning = *it;
    Json out = Json::object();
    out["thinking"] = reasoning;
    for (const auto& [k, v] : message.items()) out[k] = v;
    out["reasoning_content"] = reasoning;
    return out;
  }
  return message;
}

void check_messages(const ChatRequest& request) {
  MS_CHECK(request.messages.is_array(), "chat messages must be a JSON list, not {}", request.messages.type_name());
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const auto& m = request.messages[i];
    MS_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
             "messages[{}] must be an object with a string \"role\"", i);
  }
  MS_CHECK(request.tools.is_null() || request.tools.is_array(), "chat tools must be a JSON list or null");
  MS_CHECK(request.template_kwargs.is_object(), "chat_template_kwargs must be an object");
}

// Appends the continue tag to the final message's content (its last text part for a list);
// returns the text to continue.
std::string tag_final_message(Json& messages) {
  MS_CHECK(!messages.empty(), "continue_final_message is set but the conversation is empty");
  Json& last = messages.back();
  const auto it = last.find("content");
  MS_CHECK(it != last.end() && !it->is_null(),
           "continue_final_message is set but the final message has no \"content\" to continue");
  if (it->is_string()) {
    const std::string text = it->get<std::string>();
    *it = text + kContinueTag;
    return text;
  }
  MS_CHECK(it->is_array(), "messages[{}].content must be a string or a list of parts", messages.size() - 1);
  for (auto part = it->rbegin(); part != it->rend(); ++part) {
    if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) {
      const std::string text = (*part)["text"].get<std::string>();
      (*part)["text"] = text + kContinueTag;
      return text;
    }
  }
  fail("continue_final_message is set but the final message has no text to continue");
}

std::string_view strip(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Cuts the rendering at the tag, as transformers does.
jinja::Str cut_at_tag(const jinja::Str& rendered, const std::string& final_text) {
  const std::string_view tag = strip(kContinueTag);
  MS_CHECK(rendered.text.find(strip(final_text)) != std::string::npos && rendered.text.find(tag) != std::string::npos,
           "continue_final_message is set but the final message does not appear in the chat after applying the chat "
           "template");
  const size_t at = rendered.text.rfind(tag);
  if (rendered.text.compare(at, std::strlen(kContinueTag), kContinueTag) == 0) return rendered.substr(0, at);
  size_t end = at;
  while (end > 0 && std::strchr(" \t\n\r\f\v", rendered.text[end - 1])) --end;
  return rendered.substr(0, end);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view text, std::string origin)
    : template_(std::make_unique<jinja::Template>(text, std::move(origin))) {}

ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::origin() const { return template_->origin(); }

RenderedChat ChatTemplate::render(const ChatRequest& request, const ChatSpecialTokens& special_tokens) const {
  check_messages(request);
  Json messages = Json::array();
  for (const Json& m : request.messages) messages.push_back(alias_reasoning(m));
  std::string final_text;
  if (request.continue_final_message) final_text = tag_final_message(messages);
  std::vector<std::pair<std::string, Value>> context = {
      {"messages", jinja::from_json(messages, true)},
      {"tools", request.tools.is_null() ? Value::none() : jinja::from_json(request.tools, true)},
      {"documents", Value::none()},
      {"add_generation_prompt", Value::from(request.add_generation_prompt)},
      {"bos_token", Value::string(special_tokens.bos_token)},
      {"eos_token", Value::string(special_tokens.eos_token)},
  };
  for (const auto& [key, value] : request.template_kwargs.items()) {
    MS_CHECK(key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt",
             "chat_template_kwargs.{}: set by the request itself, not a template argument", key);
    context.emplace_back(key, jinja::from_json(value, true));
  }
  jinja::Str out = template_->render(context);
  if (request.continue_final_message) out = cut_at_tag(out, final_text);
  return RenderedChat{std::move(out.text), std::move(out.request)};
}

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const BuiltinChatTemplate& t : builtin_chat_templates()) v.emplace_back(t.name);
    return v;
  }();
  return names;
}

std::shared_ptr<const ChatTemplate> load_chat_template(std::string_view name_or_file) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const ChatTemplate>, std::less<>> builtins;
  for (const BuiltinChatTemplate& t : builtin_chat_templates()) {
    if (name_or_file != t.name) continue;
    std::lock_guard lock(mutex);
    auto& cached = builtins[t.name];
    if (!cached) cached = std::make_shared<const ChatTemplate>(t.text, fmt::format("chat template {}", t.name));
    return cached;
  }
  const std::string path(name_or_file);
  MS_CHECK(std::filesystem::is_regular_file(path), "unknown chat template \"{}\" (known: {}; or a .jinja file)",
           name_or_file, known_names());
  return std::make_shared<const ChatTemplate>(read_text_file(path), path);
}

std::shared_ptr<const ChatTemplate> chat_template_for(const Tokenizer& tokenizer, std::string_view override_name) {
  if (!override_name.empty()) return load_chat_template(override_name);
  const ChatTemplateSource& source = tokenizer.chat_template();
  if (!source.name.empty()) return load_chat_template(source.name);
  MS_CHECK(!source.text.empty(), "{}: the model has no chat template; pass --chat-template NAME|FILE (known: {})",
           tokenizer.origin(), known_names());
  return std::make_shared<const ChatTemplate>(source.text, source.origin);
}

std::string render_chat(std::string_view template_name, const ChatRequest& request,
                        const ChatSpecialTokens& special_tokens) {
  return render_chat_parts(template_name, request, special_tokens).text;
}

RenderedChat render_chat_parts(std::string_view template_name, const ChatRequest& request,
                               const ChatSpecialTokens& special_tokens) {
  return load_chat_template(template_name)->render(request, special_tokens);
}

std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request, std::string_view override_name) {
  return chat_template_for(tokenizer, override_name)
      ->render(request, ChatSpecialTokens{tokenizer.bos_token(), tokenizer.eos_token()})
      .text;
}

}  // namespace moeserve::tokenizer
