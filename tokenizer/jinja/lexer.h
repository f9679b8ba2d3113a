// The chat-template lexer: template text to tokens, with jinja2's whitespace rules as
// transformers configures them (trim_blocks, lstrip_blocks, `-` and `+` modifiers, newlines
// normalised to "\n", one trailing newline dropped) and `{% raw %}` read here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tokenizer::jinja {

enum class TokenKind { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  TokenKind kind;
  std::string text;  // Data and String: the text (unescaped); Name, Op, numbers: as written
  int line = 1;
  int column = 1;
};

// Errors are "origin:line:column: message".
std::vector<Token> lex(std::string_view source, const std::string& origin);

}  // namespace moeserve::tokenizer::jinja
