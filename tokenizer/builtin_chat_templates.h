// The chat templates moeserve ships (tokenizer/chat_templates/NAME.jinja), compiled in by
// CMake (builtin_chat_templates.cc is generated from those files).
#pragma once

#include <vector>

namespace moeserve::tokenizer {

struct BuiltinChatTemplate {
  const char* name;
  const char* text;
};

const std::vector<BuiltinChatTemplate>& builtin_chat_templates();

}  // namespace moeserve::tokenizer
