// Chat templates: a conversation (OpenAI-style messages JSON) to the prompt text a model was
// trained on, byte-identical to what transformers' apply_chat_template renders. Any Jinja
// template is rendered by the interpreter in tokenizer/jinja/ (parsed once, rendered per
// request); moeserve also ships some templates by name (chat_template_names()).
//
// Built-in templates (tokenizer/chat_templates/NAME.jinja):
//   kimi-k2           Kimi-K2-Instruct
//   kimi-k2-thinking  Kimi-K2-Thinking (tool calls, reasoning_content)
//   deepseek-v3       DeepSeek-V3
//
// The template sees what transformers passes it: messages (reasoning aliased under
// reasoning_content and thinking, as transformers does), tools (or none), documents (none),
// add_generation_prompt, bos_token, eos_token, and the request's chat_template_kwargs.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

namespace jinja {
class Template;
}

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // OpenAI tool list, or null
  bool add_generation_prompt = true;
  // vLLM's (transformers') continue_final_message: the prompt ends inside the last message.
  bool continue_final_message = false;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

// Texts of special tokens that templates print ({{ bos_token }}).
struct ChatSpecialTokens {
  std::string bos_token;
  std::string eos_token;
};

// A rendered prompt: its text, and which bytes of it the request wrote (message contents,
// names, reasoning, tool calls, the tools' JSON, strings derived from them) rather than the
// template, so that special tokens there can be encoded as plain text.
struct RenderedChat {
  std::string text;
  std::vector<TextRange> request_text;  // sorted, disjoint
};

class ChatTemplate {
 public:
  // Parses `text`; a malformed template is an error naming `origin` and the line.
  ChatTemplate(std::string_view text, std::string origin);
  ~ChatTemplate();

  RenderedChat render(const ChatRequest& request, const ChatSpecialTokens& special_tokens = {}) const;
  const std::string& origin() const;

 private:
  std::unique_ptr<jinja::Template> template_;
};

// The names of the built-in templates.
const std::vector<std::string>& chat_template_names();

// A built-in template by name, or a template file (a path to a .jinja file); an error names
// the known templates otherwise.
std::shared_ptr<const ChatTemplate> load_chat_template(std::string_view name_or_file);

// The template for a tokenizer: `override_name_or_file` if not empty, else the one the
// tokenizer's files carry; an error if there is none.
std::shared_ptr<const ChatTemplate> chat_template_for(const Tokenizer& tokenizer,
                                                      std::string_view override_name_or_file = "");

// Renders with a named template (built-in name or file).
std::string render_chat(std::string_view template_name, const ChatRequest& request,
                        const ChatSpecialTokens& special_tokens = {});
RenderedChat render_chat_parts(std::string_view template_name, const ChatRequest& request,
                               const ChatSpecialTokens& special_tokens = {});

// Renders with the tokenizer's template (or `override_name`) and its bos/eos texts.
std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request, std::string_view override_name = "");

}  // namespace moeserve::tokenizer
