// The chat-template parser: tokens to an AST, with jinja2's grammar and operator
// precedence. Errors name the origin, line and column ("origin:3:7: unexpected 'x'").
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace moeserve::tokenizer::jinja {

Body parse_template(std::string_view source, const std::string& origin);

}  // namespace moeserve::tokenizer::jinja
