// The hand-written renderers behind render_chat, one per known template (internal).
// Each mirrors its Jinja text statement by statement; the comments quote the Jinja.
#pragma once

#include <string>

#include "tokenizer/chat_template.h"

namespace moeserve::tokenizer {

RenderedChat render_kimi_k2(const ChatRequest& request);
RenderedChat render_kimi_k2_thinking(const ChatRequest& request);
RenderedChat render_deepseek_v3(const ChatRequest& request, const ChatSpecialTokens& special_tokens);

// Helpers shared by the renderers: Jinja's view of JSON values.
namespace jinja {

using Json = nlohmann::ordered_json;

// `message[key]` or null when absent (Jinja's .get(key)).
const Json& get(const Json& object, const char* key);

// Python truthiness: null, false, 0, "" and empty lists/objects are false.
bool truthy(const Json& value);

// The string `object[key]`, for `'...' + object[key]` where Jinja fails on anything else;
// `where` names the object in the error ("messages[2]").
const std::string& string_operand(const Json& object, const char* key, const std::string& where);

// "messages[3]" for error messages.
std::string message_name(size_t index);

}  // namespace jinja
}  // namespace moeserve::tokenizer
