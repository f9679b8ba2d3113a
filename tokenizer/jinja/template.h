// A parsed chat template (parsed once, rendered per request without re-parsing) and the
// tree-walking interpreter that renders it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace moeserve::tokenizer::jinja {

// A scope: a for-loop iteration, a macro call, the template's top level.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* find(const std::string& name) const;
};

class Interpreter {
 public:
  explicit Interpreter(const std::string& origin) : origin_(origin) {}

  void exec(const Body& body, const std::shared_ptr<Frame>& frame, Str& out);
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  // Calls a macro, a method or a global function.
  Value call(const Value& callable, CallArgs& args);
  const std::string& origin() const { return origin_; }

  // Macro calls nest at most this deep (Python's recursion limit, in spirit): a template that
  // recurses on request data cannot exhaust the stack.
  static constexpr int kMaxCallDepth = 256;
  int call_depth = 0;

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec_body(const Body& body, const std::shared_ptr<Frame>& frame, Str& out);
  Flow exec_stmt(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out);
  Flow exec_if(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out);
  void exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out);
  void define_macro(const Stmt& s, const std::shared_ptr<Frame>& frame);
  Value eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_call(const Expr& e, const std::shared_ptr<Frame>& frame);
  CallArgs eval_args(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame, std::string what);
  Value eval_literal(const Expr& e, const std::shared_ptr<Frame>& frame);

  const std::string& origin_;
};

class Template {
 public:
  // Parses `source`; errors are "origin:line:column: message".
  Template(std::string_view source, std::string origin);

  // Renders with `context` (name, value) as the template's variables; runtime errors are
  // "origin:line: message".
  Str render(const std::vector<std::pair<std::string, Value>>& context) const;
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  Body body_;
};

}  // namespace moeserve::tokenizer::jinja
