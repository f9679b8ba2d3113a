// Chat templates: a conversation (OpenAI-style messages JSON) to the prompt text a model was
// trained on, byte-identical to what transformers' apply_chat_template renders from the
// model's Jinja template. Each known template has a hand-written renderer; a model's template
// is recognised by its exact text (see identify_chat_template), never guessed.
//
// Known templates:
//   kimi-k2           Kimi-K2-Instruct
//   kimi-k2-thinking  Kimi-K2-Thinking (tool calls, reasoning_content)
//   deepseek-v3       DeepSeek-V3
//
// Messages: [{"role": "system"|"user"|"assistant"|"tool", "content": ..., ...}], with the
// fields each template reads (tool_calls, tool_call_id, name, reasoning_content). A message a
// template cannot render (e.g. a non-string content where the Jinja would fail) is an error
// naming the message.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // OpenAI tool list, or null
  bool add_generation_prompt = true;
};

// Texts of special tokens that templates print ({{ bos_token }}).
struct ChatSpecialTokens {
  std::string bos_token;
  std::string eos_token;
};

// A rendered prompt: its text, and which bytes of it the request wrote (message contents,
// names, reasoning, tool calls, the tools' JSON) rather than the template, so that special
// tokens there can be encoded as plain text (Tokenizer::encode with plain ranges).
struct RenderedChat {
  std::string text;
  std::vector<TextRange> request_text;  // sorted, disjoint

  RenderedChat& operator+=(std::string_view template_text) {
    text += template_text;
    return *this;
  }
  // Text from the request.
  void add_request_text(std::string_view piece) {
    if (piece.empty()) return;
    if (!request_text.empty() && request_text.back().end == text.size())
      request_text.back().end += piece.size();
    else
      request_text.push_back({text.size(), text.size() + piece.size()});
    text += piece;
  }
};

const std::vector<std::string>& chat_template_names();

// The name of the known template whose text is `text` (CRLF read as LF); an error naming
// `origin` otherwise, which lists the known names and suggests --chat-template.
std::string identify_chat_template(std::string_view text, std::string_view origin);

// Renders with the named template; an unknown name is an error listing the known ones.
std::string render_chat(std::string_view template_name, const ChatRequest& request,
                        const ChatSpecialTokens& special_tokens = {});
// The same, with the ranges the request wrote.
RenderedChat render_chat_parts(std::string_view template_name, const ChatRequest& request,
                               const ChatSpecialTokens& special_tokens = {});

// The template name for a tokenizer: `override_name` if not empty (checked), else the one the
// tokenizer's files carry (identified by text); an error if there is none.
std::string chat_template_name_for(const Tokenizer& tokenizer, std::string_view override_name = "");

// Renders with the tokenizer's template (or `override_name`) and its bos/eos texts.
std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request, std::string_view override_name = "");

}  // namespace moeserve::tokenizer
