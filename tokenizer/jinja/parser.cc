#include "tokenizer/jinja/parser.h"

#include <charconv>
#include <cstdlib>

#include "tokenizer/jinja/parser_impl.h"

namespace moeserve::tokenizer::jinja::parsing {

ExprPtr Parser::primary() {
  const Token& t = cur();
  auto literal = [&](Value v) {
    auto e = node(ExprKind::Literal, t.line);
    e->value = std::move(v);
    next();
    return e;
  };
  switch (t.kind) {
    case TokenKind::Name:
      if (t.text == "true" || t.text == "True") return literal(Value::from(true));
      if (t.text == "false" || t.text == "False") return literal(Value::from(false));
      if (t.text == "none" || t.text == "None") return literal(Value::none());
      {
        auto e = node(ExprKind::Name, t.line);
        e->name = next().text;
        return e;
      }
    case TokenKind::String: {
      std::string s;
      while (cur().kind == TokenKind::String) s += next().text;
      auto e = node(ExprKind::Literal, t.line);
      e->value = Value::string(s);
      return e;
    }
    case TokenKind::Int: {
      // Python's ints have no bound; ours are 64 bits, so a longer literal is refused, not wrapped.
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (ec != std::errc()) error(fmt::format("integer literal {} does not fit in 64 bits", t.text), &t);
      return literal(Value::from(v));
    }
    case TokenKind::Float:  // strtod, not stod: an overflowing literal is inf, as in Python
      return literal(Value::real_number(std::strtod(t.text.c_str(), nullptr)));
    default:
      break;
  }
  if (is_op("(")) {
    next();
    ExprPtr e = tuple(true, true);
    expect_op(")");
    return e;
  }
  if (is_op("[") || is_op("{")) {
    const bool list = is_op("[");
    auto e = node(list ? ExprKind::List : ExprKind::DictLit, next().line);
    const char* close = list ? "]" : "}";
    while (!is_op(close)) {
      if (!e->items.empty()) expect_op(",");
      if (is_op(close)) break;
      e->items.push_back(expression(true));
      if (!list) {
        expect_op(":");
        e->items.push_back(expression(true));
      }
    }
    next();
    return e;
  }
  error(fmt::format("unexpected {}", describe(t)));
}

ExprPtr Parser::postfix(ExprPtr e) {
  while (true) {
    if (is_op(".")) {
      const int line = next().line;
      auto a = node(ExprKind::Attr, line);
      if (cur().kind == TokenKind::Int) {
        a->kind = ExprKind::Item;
        auto index = node(ExprKind::Literal, line);
        index->value = Value::from(static_cast<int64_t>(std::stoll(next().text)));
        a->items.push_back(std::move(e));
        a->items.push_back(std::move(index));
      } else {
        a->name = expect_name();
        a->items.push_back(std::move(e));
      }
      e = std::move(a);
    } else if (is_op("[")) {
      e = subscript(std::move(e));
    } else if (is_op("(")) {
      auto c = node(ExprKind::Call, cur().line);
      c->items.push_back(std::move(e));
      call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::subscript(ExprPtr e) {
  const int line = next().line;
  std::vector<ExprPtr> parts(1);
  bool slice = false;
  while (!is_op("]")) {
    if (is_op(":")) {
      next();
      slice = true;
      parts.emplace_back();
      continue;
    }
    if (parts.back()) error(fmt::format("expected ']', got {}", describe(cur())));
    parts.back() = expression(true);
  }
  next();
  if (!slice && !parts[0]) error("expected a subscript", &tokens_[pos_ - 1]);
  if (parts.size() > 3) error("a slice takes at most three parts");
  auto s = node(slice ? ExprKind::Slice : ExprKind::Item, line);
  s->items.push_back(std::move(e));
  for (auto& p : parts) s->items.push_back(std::move(p));
  while (slice && s->items.size() < 4) s->items.emplace_back();
  return s;
}

// (a, b, key=c): positional arguments first, then keyword ones.
void Parser::call_args(Expr& e) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) expect_op(",");
    first = false;
    if (is_op(")")) break;
    if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "=") {
      e.keywords.push_back(next().text);
      next();
      e.items.push_back(expression(true));
    } else {
      if (!e.keywords.empty()) error("positional argument follows keyword argument");
      e.items.push_back(expression(true));
    }
  }
  next();
}

ExprPtr Parser::filters(ExprPtr e, bool with_tests) {
  while (true) {
    if (is_op("|")) {
      next();
      e = filter_call(std::move(e));
    } else if (with_tests && is_name("is")) {
      e = test(std::move(e));
    } else if (is_op("(")) {
      auto c = node(ExprKind::Call, cur().line);
      c->items.push_back(std::move(e));
      call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

// A filter's name and arguments, applied to `e` (after the `|`).
ExprPtr Parser::filter_call(ExprPtr e) {
  const Token& name_token = cur();
  std::string name = expect_name();
  while (is_op(".")) {
    next();
    name += '.';
    name += expect_name();
  }
  if (!known_filter(name)) error(fmt::format("No filter named '{}'.", name), &name_token);
  auto f = node(ExprKind::Filter, name_token.line);
  f->name = name;
  f->items.push_back(std::move(e));
  if (is_op("(")) call_args(*f);
  return f;
}

ExprPtr Parser::test(ExprPtr e) {
  next();  // is
  auto t = node(ExprKind::Test, cur().line);
  if (is_name("not")) {
    next();
    t->negated = true;
  }
  const Token& name_token = cur();
  t->name = expect_name();
  if (!known_test(t->name)) error(fmt::format("No test named '{}'.", t->name), &name_token);
  t->items.push_back(std::move(e));
  const TokenKind k = cur().kind;
  if (is_op("(")) {
    call_args(*t);
  } else if ((k == TokenKind::Name || k == TokenKind::String || k == TokenKind::Int || k == TokenKind::Float ||
              is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) error("You cannot chain multiple tests with is");
    t->items.push_back(postfix(primary()));
  }
  return t;
}

}  // namespace moeserve::tokenizer::jinja::parsing

namespace moeserve::tokenizer::jinja {

Body parse_template(std::string_view source, const std::string& origin) {
  return parsing::Parser(lex(source, origin), origin).run();
}

}  // namespace moeserve::tokenizer::jinja
