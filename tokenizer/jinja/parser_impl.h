// The chat-template parser's internals (tokenizer/jinja/parser.cc): a recursive-descent parser
// over the lexer's tokens, statements here, expressions below primary() in parser.cc.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"

namespace moeserve::tokenizer::jinja::parsing {

inline ExprPtr node(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

inline std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::End:
      return "end of template";
    case TokenKind::BlockEnd:
      return "end of statement block";
    case TokenKind::VarEnd:
      return "end of print statement";
    case TokenKind::Data:
      return "template data";
    default:
      return "'" + t.text + "'";
  }
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin) : tokens_(std::move(tokens)), origin_(origin) {}

  Body run() {
    Body body = subparse({});
    if (cur().kind != TokenKind::End) {
      error(fmt::format("Encountered unknown tag '{}'.", cur().text));
    }
    return body;
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == TokenKind::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == TokenKind::Name && cur().text == name; }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }

  [[noreturn]] void error(const std::string& message, const Token* at = nullptr) const {
    const Token& t = at ? *at : cur();
    fail("{}:{}:{}: {}", origin_, t.line, t.column, message);
  }

  void expect_op(const char* op) {
    if (!is_op(op)) error(fmt::format("expected '{}', got {}", op, describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::Name) error(fmt::format("expected a name, got {}", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd)
      error(fmt::format("expected the end of the statement block, got {}", describe(cur())));
    next();
  }

  // Statements until a `{% name %}` with name in `ends` (left current, at the name).
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::End) {
        if (ends.empty()) return body;
        error(fmt::format("Unexpected end of template. Jinja was looking for the following tags: '{}'.",
                          fmt::join(ends, "' or '")));
      }
      if (t.kind == TokenKind::Data) {
        body.push_back(text_stmt(next()));
      } else if (t.kind == TokenKind::VarBegin) {
        body.push_back(print_stmt());
      } else {
        next();  // BlockBegin
        if (cur().kind == TokenKind::Name && std::find(ends.begin(), ends.end(), cur().text) != ends.end()) return body;
        body.push_back(statement(ends));
      }
    }
  }

  std::unique_ptr<Stmt> stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  std::unique_ptr<Stmt> text_stmt(const Token& t) {
    auto s = stmt(StmtKind::Text, t.line);
    s->text = t.text;
    return s;
  }

  std::unique_ptr<Stmt> print_stmt() {
    const int line = next().line;
    auto s = stmt(StmtKind::Print, line);
    s->exprs.push_back(tuple(true));
    if (cur().kind != TokenKind::VarEnd)
      error(fmt::format("expected the end of the print statement, got {}", describe(cur())));
    next();
    return s;
  }

  std::unique_ptr<Stmt> statement(const std::vector<std::string>& ends) {
    const Token& t = cur();
    if (t.kind != TokenKind::Name) error("tag name expected");
    const std::string& name = t.text;
    if (name == "if") return if_stmt();
    if (name == "for") return for_stmt();
    if (name == "set") return set_stmt();
    if (name == "macro") return macro_stmt();
    if (name == "filter") return filter_stmt();
    if (name == "generation") return body_stmt("endgeneration");
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error(fmt::format("'{}' outside of a loop", name));
      auto s = stmt(name == "break" ? StmtKind::Break : StmtKind::Continue, t.line);
      next();
      expect_block_end();
      return s;
    }
    if (ends.empty()) error(fmt::format("Encountered unknown tag '{}'.", name));
    error(fmt::format("Encountered unknown tag '{}'. Jinja was looking for the following tags: '{}'.", name,
                      fmt::join(ends, "' or '")));
  }

  std::unique_ptr<Stmt> if_stmt() {
    auto s = stmt(StmtKind::If, next().line);
    while (true) {
      s->exprs.push_back(tuple(false));
      expect_block_end();
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      const std::string tag = next().text;
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        s->bodies.push_back(subparse({"endif"}));
        next();
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> assign_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name());
    while (is_op(",")) {
      next();
      if (cur().kind != TokenKind::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Stmt> for_stmt() {
    auto s = stmt(StmtKind::For, next().line);
    s->names = assign_targets();
    if (!is_name("in")) error(fmt::format("expected 'in', got {}", describe(cur())));
    next();
    s->exprs.push_back(tuple(false));
    s->exprs.emplace_back();
    if (is_name("if")) {
      next();
      s->exprs.back() = expression(true);
    }
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->bodies.push_back(subparse({"endfor", "else"}));
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      s->bodies.push_back(subparse({"endfor"}));
      next();
    }
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> set_stmt() {
    const int line = next().line;
    std::vector<std::string> names = assign_targets();
    std::string attribute;
    if (names.size() == 1 && is_op(".")) {
      next();
      attribute = expect_name();
    }
    if (is_op("=")) {
      next();
      auto s = stmt(StmtKind::Set, line);
      s->names = std::move(names);
      s->attribute = std::move(attribute);
      s->exprs.push_back(tuple(true));
      expect_block_end();
      return s;
    }
    if (names.size() != 1 || !attribute.empty()) error(fmt::format("expected '=', got {}", describe(cur())));
    auto s = stmt(StmtKind::SetBlock, line);
    s->names = std::move(names);
    if (is_op("|")) s->exprs.push_back(filters(node(ExprKind::Literal, line)));
    expect_block_end();
    s->bodies.push_back(subparse({"endset"}));
    next();
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> macro_stmt() {
    auto s = stmt(StmtKind::Macro, next().line);
    s->names.push_back(expect_name());
    expect_op("(");
    while (!is_op(")")) {
      if (s->names.size() > 1) expect_op(",");
      if (is_op(")")) break;
      s->names.push_back(expect_name());
      s->exprs.emplace_back();
      if (is_op("=")) {
        next();
        s->exprs.back() = expression(true);
      }
    }
    next();
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(subparse({"endmacro"}));
    loop_depth_ = saved;
    next();
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> filter_stmt() {
    auto s = stmt(StmtKind::FilterBlock, next().line);
    s->exprs.push_back(filters(filter_call(node(ExprKind::Literal, s->line)), false));
    expect_block_end();
    s->bodies.push_back(subparse({"endfilter"}));
    next();
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> body_stmt(const char* end) {
    auto s = stmt(StmtKind::Body, next().line);
    expect_block_end();
    s->bodies.push_back(subparse({end}));
    next();
    expect_block_end();
    return s;
  }

  // Expressions, lowest precedence first (jinja2's parse_tuple ... parse_primary).
  // with_condition: `a if b else c` allowed (not in an if's test or a for's iterable);
  // explicit_parens: inside "(...)", where "()" is the empty tuple.
  ExprPtr tuple(bool with_condition, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        next();
        comma = true;
      }
      if (ends_tuple(explicit_parens)) break;
      items.push_back(expression(with_condition));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) error(fmt::format("Expected an expression, got {}", describe(cur())));
    auto e = node(ExprKind::Tuple, line);
    e->items = std::move(items);
    return e;
  }

  bool ends_tuple(bool explicit_parens) const {
    const TokenKind k = cur().kind;
    if (k == TokenKind::VarEnd || k == TokenKind::BlockEnd || k == TokenKind::End) return true;
    if (explicit_parens && is_op(")")) return true;
    return false;
  }

  ExprPtr expression(bool with_condition) { return with_condition ? condition() : or_expr(); }

  ExprPtr condition() {
    ExprPtr e = or_expr();
    while (is_name("if")) {
      auto c = node(ExprKind::Condition, next().line);
      ExprPtr test = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = condition();
      }
      c->items.push_back(std::move(e));
      c->items.push_back(std::move(test));
      c->items.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(ExprPtr left, const std::string& op, ExprPtr right, int line) {
    auto e = node(ExprKind::Binary, line);
    e->name = op;
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const int line = next().line;
      e = binary(std::move(e), "or", and_expr(), line);
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const int line = next().line;
      e = binary(std::move(e), "and", not_expr(), line);
    }
    return e;
  }

  ExprPtr not_expr() {
    if (!is_name("not")) return compare();
    auto e = node(ExprKind::Not, next().line);
    e->items.push_back(not_expr());
    return e;
  }

  ExprPtr compare() {
    const int line = cur().line;
    ExprPtr first = math1();
    auto e = node(ExprKind::Compare, line);
    e->items.push_back(std::move(first));
    while (true) {
      static const char* ops[] = {"==", "!=", "<", "<=", ">", ">="};
      if (cur().kind == TokenKind::Op && std::find(std::begin(ops), std::end(ops), cur().text) != std::end(ops)) {
        e->ops.push_back(next().text);
      } else if (is_name("in")) {
        next();
        e->ops.push_back("in");
      } else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        pos_ += 2;
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->items.push_back(math1());
    }
    if (e->ops.empty()) return std::move(e->items[0]);
    return e;
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(std::move(e), t.text, concat(), t.line);
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary(std::move(e), "~", math2(), line);
    }
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(std::move(e), t.text, pow(), t.line);
    }
    return e;
  }

  ExprPtr pow() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary(std::move(e), "**", unary(true), line);
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = node(t.text == "-" ? ExprKind::Neg : ExprKind::Pos, t.line);
      e->items.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary();
  ExprPtr postfix(ExprPtr e);
  ExprPtr subscript(ExprPtr e);
  void call_args(Expr& e);
  ExprPtr filters(ExprPtr e, bool with_tests = true);
  ExprPtr filter_call(ExprPtr e);
  ExprPtr test(ExprPtr e);

  std::vector<Token> tokens_;
  const std::string& origin_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace moeserve::tokenizer::jinja::parsing
