#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/chat_renderers.h"

namespace moeserve::tokenizer {
namespace {

struct KnownTemplate {
  const char* name;
  // FNV-1a 64 of the template text with CRLF read as LF (Jinja reads newlines that way too).
  // The texts are in tests/tokenizer/data/chat_templates/NAME.jinja; a test checks these.
  uint64_t fingerprint;
};

constexpr KnownTemplate kKnownTemplates[] = {
    {"kimi-k2", 0x99d1f704677a2270ull},
    {"kimi-k2-thinking", 0xc08d7bfff1b6eb0cull},
    {"deepseek-v3", 0xebe3604156dc466aull},
};

uint64_t template_fingerprint(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    hash = (hash ^ static_cast<uint8_t>(text[i])) * 0x100000001b3ull;
  }
  return hash;
}

std::string known_names() { return fmt::format("{}", fmt::join(chat_template_names(), ", ")); }

void check_known(std::string_view name) {
  for (const KnownTemplate& t : kKnownTemplates) {
    if (name == t.name) return;
  }
  fail("unknown chat template \"{}\" (known: {})", name, known_names());
}

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const KnownTemplate& t : kKnownTemplates) v.emplace_back(t.name);
    return v;
  }();
  return names;
}

std::string identify_chat_template(std::string_view text, std::string_view origin) {
  const uint64_t fingerprint = template_fingerprint(text);
  for (const KnownTemplate& t : kKnownTemplates) {
    if (t.fingerprint == fingerprint) return t.name;
  }
  fail(
      "{}: the chat template is not one moeserve knows (fingerprint {:016x}, known: {}); pass "
      "--chat-template NAME to choose one",
      origin, fingerprint, known_names());
}

std::string render_chat(std::string_view template_name, const ChatRequest& request,
                        const ChatSpecialTokens& special_tokens) {
  return render_chat_parts(template_name, request, special_tokens).text;
}

RenderedChat render_chat_parts(std::string_view template_name, const ChatRequest& request,
                               const ChatSpecialTokens& special_tokens) {
  check_known(template_name);
  MS_CHECK(request.messages.is_array(), "chat messages must be a JSON list, not {}", request.messages.type_name());
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const auto& m = request.messages[i];
    MS_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
             "{} must be an object with a string \"role\"", jinja::message_name(i));
  }
  MS_CHECK(request.tools.is_null() || request.tools.is_array(), "chat tools must be a JSON list or null");
  if (template_name == "kimi-k2") return render_kimi_k2(request);
  if (template_name == "kimi-k2-thinking") return render_kimi_k2_thinking(request);
  return render_deepseek_v3(request, special_tokens);
}

std::string chat_template_name_for(const Tokenizer& tokenizer, std::string_view override_name) {
  if (!override_name.empty()) {
    check_known(override_name);
    return std::string(override_name);
  }
  const ChatTemplateSource& source = tokenizer.chat_template();
  if (!source.name.empty()) return source.name;
  MS_CHECK(!source.text.empty(), "{}: the model has no chat template; pass --chat-template NAME (known: {})",
           tokenizer.origin(), known_names());
  return identify_chat_template(source.text, source.origin);
}

std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request, std::string_view override_name) {
  return render_chat(chat_template_name_for(tokenizer, override_name), request,
                     ChatSpecialTokens{tokenizer.bos_token(), tokenizer.eos_token()});
}

namespace jinja {

const Json& get(const Json& object, const char* key) {
  static const Json null_value = nullptr;
  const auto it = object.find(key);
  return it == object.end() ? null_value : *it;
}

bool truthy(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return value.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return value.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return value.get<double>() != 0.0;
    case Json::value_t::string:
      return !value.get_ref<const std::string&>().empty();
    default:
      return !value.empty();
  }
}

const std::string& string_operand(const Json& object, const char* key, const std::string& where) {
  MS_CHECK(object.is_object(), "{} must be an object, not {}", where, object.type_name());
  const auto it = object.find(key);
  MS_CHECK(it != object.end(), "{}.{} is missing (the template needs a string)", where, key);
  MS_CHECK(it->is_string(), "{}.{} must be a string, not {}", where, key, it->type_name());
  return it->get_ref<const std::string&>();
}

std::string message_name(size_t index) { return fmt::format("messages[{}]", index); }

}  // namespace jinja
}  // namespace moeserve::tokenizer
