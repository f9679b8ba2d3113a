// The tree-walking interpreter of chat templates: statements write into a Str (keeping the
// request's bytes marked), expressions evaluate to Values with Python's semantics.
#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/template.h"

namespace moeserve::tokenizer::jinja {
namespace {

// An error that already names its template line (not wrapped again by outer statements).
class LocatedError : public Error {
 public:
  using Error::Error;
};

template <typename F>
auto located(const std::string& origin, int line, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    throw LocatedError(fmt::format("{}:{}: {}", origin, line, e.what()));
  }
}

Value number_result(double v, bool real, int64_t i) { return real ? Value::real_number(v) : Value::from(i); }

int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? v.boolean : v.integer; }

void check_operand(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
}

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const bool real = a.kind == Kind::Float || b.kind == Kind::Float;
    return number_result(a.as_double() + b.as_double(), real, as_int(a) + as_int(b));
  }
  if (a.is_string() && b.is_string()) {
    Str s = *a.str;
    s.append(*b.str);
    return Value::string(std::move(s));
  }
  if (a.kind == b.kind && a.is_sequence()) {
    List items = *a.list;
    items.insert(items.end(), b.list->begin(), b.list->end());
    return Value::from(std::move(items), a.kind);
  }
  check_operand(a);
  check_operand(b);
  fail("unsupported operand type(s) for +: '{}' and '{}'", type_name(a), type_name(b));
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    Str s;
    for (int64_t i = 0; i < n; ++i) s.append(*seq.str);
    return Value::string(std::move(s));
  }
  List items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.list->begin(), seq.list->end());
  return Value::from(std::move(items), seq.kind);
}

double floor_mod(double a, double b) {
  const double m = std::fmod(a, b);
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "*" && (a.is_string() || a.is_sequence()) && b.kind == Kind::Int) return repeat(a, b.integer);
  if (op == "*" && (b.is_string() || b.is_sequence()) && a.kind == Kind::Int) return repeat(b, a.integer);
  check_operand(a);
  check_operand(b);
  if (!a.is_number() || !b.is_number())
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
  const bool real = a.kind == Kind::Float || b.kind == Kind::Float;
  const double x = a.as_double(), y = b.as_double();
  const int64_t i = as_int(a), j = as_int(b);
  if (op == "-") return number_result(x - y, real, i - j);
  if (op == "*") return number_result(x * y, real, i * j);
  if ((op == "/" || op == "//" || op == "%") && y == 0) fail("{} by zero", op == "%" ? "integer modulo" : "division");
  if (op == "/") return Value::real_number(x / y);
  if (op == "//")
    return number_result(std::floor(x / y), real, static_cast<int64_t>(std::floor(double(i) / double(j))));
  if (op == "%") return number_result(floor_mod(x, y), real, static_cast<int64_t>(floor_mod(double(i), double(j))));
  // **
  if (!real && j >= 0) {
    int64_t r = 1;
    for (int64_t k = 0; k < j; ++k) r *= i;
    return Value::from(r);
  }
  return Value::real_number(std::pow(x, y));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", type_name(item));
      return container.text().find(item.text()) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (const Value& v : *container.list)
        if (equal(v, item)) return true;
      return false;
    case Kind::Dict:
    case Kind::Namespace:
      return container.dict->find(item) != nullptr;
    case Kind::Undefined:
      return false;
    default:
      fail("argument of type '{}' is not iterable", type_name(container));
  }
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  if (a.is_undefined() || b.is_undefined()) undefined_error(a.is_undefined() ? a : b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  return !less(a, b);  // >=
}

}  // namespace

const Value* Frame::find(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

void Interpreter::exec(const Body& body, const std::shared_ptr<Frame>& frame, Str& out) { exec_body(body, frame, out); }

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Frame>& frame, Str& out) {
  for (const auto& s : body) {
    const Flow flow = exec_stmt(*s, frame, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out) {
  return located(origin_, s.line, [&] {
    switch (s.kind) {
      case StmtKind::Text:
        out.append(s.text);
        return Flow::Normal;
      case StmtKind::Print:
        out.append(to_str(eval(*s.exprs[0], frame)));
        return Flow::Normal;
      case StmtKind::If:
        return exec_if(s, frame, out);
      case StmtKind::For:
        return exec_for(s, frame, out);
      case StmtKind::Set:
      case StmtKind::SetBlock:
      case StmtKind::FilterBlock:
        exec_set(s, frame, out);
        return Flow::Normal;
      case StmtKind::Macro:
        define_macro(s, frame);
        return Flow::Normal;
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      case StmtKind::Body:
        return exec_body(s.bodies[0], frame, out);
    }
    return Flow::Normal;
  });
}

Interpreter::Flow Interpreter::exec_if(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out) {
  for (size_t i = 0; i < s.exprs.size(); ++i) {
    if (truthy(eval(*s.exprs[i], frame))) return exec_body(s.bodies[i], frame, out);
  }
  if (s.bodies.size() > s.exprs.size()) return exec_body(s.bodies.back(), frame, out);
  return Flow::Normal;
}

namespace {

void bind_targets(const std::vector<std::string>& names, const Value& value, Frame& frame) {
  if (names.size() == 1) {
    frame.vars[names[0]] = value;
    return;
  }
  const List items = iterate(value);
  MS_CHECK(items.size() == names.size(), "{} values to unpack (expected {}, got {})",
           items.size() > names.size() ? "too many" : "not enough", names.size(), items.size());
  for (size_t i = 0; i < names.size(); ++i) frame.vars[names[i]] = items[i];
}

Value loop_object(const List& items, size_t i) {
  const auto n = static_cast<int64_t>(items.size());
  const auto k = static_cast<int64_t>(i);
  Dict loop;
  loop.set(Value::string("index"), Value::from(k + 1));
  loop.set(Value::string("index0"), Value::from(k));
  loop.set(Value::string("revindex"), Value::from(n - k));
  loop.set(Value::string("revindex0"), Value::from(n - k - 1));
  loop.set(Value::string("first"), Value::from(k == 0));
  loop.set(Value::string("last"), Value::from(k == n - 1));
  loop.set(Value::string("length"), Value::from(n));
  loop.set(Value::string("depth"), Value::from(int64_t{1}));
  loop.set(Value::string("depth0"), Value::from(int64_t{0}));
  loop.set(Value::string("previtem"), i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  loop.set(Value::string("nextitem"), k + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  loop.set(Value::string("cycle"), Value::function("loop.cycle", [k](CallArgs& args, Interpreter&) {
             MS_CHECK(!args.positional.empty(), "no items for cycling given");
             return args.positional[static_cast<size_t>(k) % args.positional.size()];
           }));
  return Value::from(std::move(loop));
}

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out) {
  List items = iterate(eval(*s.exprs[0], frame));
  if (s.exprs[1]) {
    List kept;
    for (const Value& item : items) {
      auto scope = std::make_shared<Frame>();
      scope->parent = frame;
      bind_targets(s.names, item, *scope);
      if (truthy(eval(*s.exprs[1], scope))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    auto scope = std::make_shared<Frame>();
    scope->parent = frame;
    scope->vars["loop"] = loop_object(items, i);
    bind_targets(s.names, items[i], *scope);
    if (exec_body(s.bodies[0], scope, out) == Flow::Break) break;
  }
  if (items.empty() && s.bodies.size() > 1) return exec_body(s.bodies[1], frame, out);
  return Flow::Normal;
}

namespace {

// The filters of `{% set x | f %}` / `{% filter f %}`: a chain ending in a placeholder.
Value apply_chain(const Expr& chain, const Value& input, Interpreter& in, const std::shared_ptr<Frame>& frame);

}  // namespace

void Interpreter::exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame, Str& out) {
  if (s.kind == StmtKind::Set) {
    Value v = eval(*s.exprs[0], frame);
    if (s.attribute.empty()) return bind_targets(s.names, v, *frame);
    const Value* ns = frame->find(s.names[0]);
    MS_CHECK(ns && ns->kind == Kind::Namespace, "cannot assign attribute on non-namespace object");
    ns->dict->set(Value::string(s.attribute), std::move(v));
    return;
  }
  Str body;
  exec_body(s.bodies[0], frame, body);
  Value v = Value::string(std::move(body));
  if (!s.exprs.empty()) v = apply_chain(*s.exprs[0], v, *this, frame);
  if (s.kind == StmtKind::SetBlock) {
    frame->vars[s.names[0]] = std::move(v);
  } else {
    out.append(to_str(v));
  }
}

void Interpreter::define_macro(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  const Stmt* macro = &s;
  std::weak_ptr<Frame> closure = frame;
  frame->vars[s.names[0]] = Value::function(s.names[0], [macro, closure](CallArgs& args, Interpreter& in) {
    auto scope = std::make_shared<Frame>();
    scope->parent = closure.lock();
    const size_t params = macro->names.size() - 1;
    MS_CHECK(args.positional.size() <= params, "macro '{}' takes not more than {} argument(s)", macro->names[0],
             params);
    for (size_t i = 0; i < params; ++i) {
      const std::string& name = macro->names[i + 1];
      Value v = args.take(i, name, Value::undefined(fmt::format("parameter '{}' was not provided", name)));
      if (v.is_undefined() && macro->exprs[i]) v = in.eval(*macro->exprs[i], scope);
      scope->vars[name] = std::move(v);
    }
    MS_CHECK(args.keyword.empty(), "macro '{}' takes no keyword argument '{}'", macro->names[0],
             args.keyword.front().first);
    MS_CHECK(in.call_depth < Interpreter::kMaxCallDepth, "maximum recursion depth exceeded in macro '{}'",
             macro->names[0]);
    ++in.call_depth;
    Str out;
    try {
      in.exec(macro->bodies[0], scope, out);
    } catch (...) {
      --in.call_depth;
      throw;
    }
    --in.call_depth;
    return Value::string(std::move(out));
  });
}

Value Interpreter::call(const Value& callable, CallArgs& args) {
  if (callable.is_undefined()) undefined_error(callable);
  MS_CHECK(callable.kind == Kind::Callable, "'{}' object is not callable", type_name(callable));
  return callable.callable->call(args, *this);
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame, std::string what) {
  CallArgs args;
  args.what = std::move(what);
  const size_t keyword_begin = e.items.size() - e.keywords.size();
  for (size_t i = first; i < keyword_begin; ++i) args.positional.push_back(eval(*e.items[i], frame));
  for (size_t i = keyword_begin; i < e.items.size(); ++i)
    args.keyword.emplace_back(e.keywords[i - keyword_begin], eval(*e.items[i], frame));
  return args;
}

Value Interpreter::eval_call(const Expr& e, const std::shared_ptr<Frame>& frame) {
  return located(origin_, e.line, [&] {
    if (e.kind == ExprKind::Call) {
      const Value callee = eval(*e.items[0], frame);
      CallArgs args = eval_args(e, 1, frame, "function");
      return call(callee, args);
    }
    const Value input = eval(*e.items[0], frame);
    CallArgs args =
        eval_args(e, 1, frame, fmt::format("{} '{}'", e.kind == ExprKind::Filter ? "filter" : "test", e.name));
    if (e.kind == ExprKind::Filter) return apply_filter(e.name, input, args, *this);
    return Value::from(apply_test(e.name, input, args, *this) != e.negated);
  });
}

namespace {

Value apply_chain(const Expr& chain, const Value& input, Interpreter& in, const std::shared_ptr<Frame>& frame) {
  if (chain.kind != ExprKind::Filter) return input;
  const Value inner = apply_chain(*chain.items[0], input, in, frame);
  CallArgs args;
  args.what = fmt::format("filter '{}'", chain.name);
  const size_t keyword_begin = chain.items.size() - chain.keywords.size();
  for (size_t i = 1; i < keyword_begin; ++i) args.positional.push_back(in.eval(*chain.items[i], frame));
  for (size_t i = keyword_begin; i < chain.items.size(); ++i)
    args.keyword.emplace_back(chain.keywords[i - keyword_begin], in.eval(*chain.items[i], frame));
  return apply_filter(chain.name, inner, args, in);
}

}  // namespace

Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame) {
  const std::string& op = e.name;
  Value a = eval(*e.items[0], frame);
  if (op == "and") return truthy(a) ? eval(*e.items[1], frame) : a;
  if (op == "or") return truthy(a) ? a : eval(*e.items[1], frame);
  const Value b = eval(*e.items[1], frame);
  if (op == "~") {
    Str s = to_str(a);
    s.append(to_str(b));
    return Value::string(std::move(s));
  }
  if (op == "+") return add(a, b);
  return arithmetic(op, a, b);
}

Value Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value left = eval(*e.items[0], frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i + 1], frame);
    if (!compare_op(e.ops[i], left, right)) return Value::from(false);
    left = std::move(right);
  }
  return Value::from(true);
}

Value Interpreter::eval_literal(const Expr& e, const std::shared_ptr<Frame>& frame) {
  if (e.kind == ExprKind::Literal) return e.value;
  if (e.kind == ExprKind::DictLit) {
    Dict d;
    for (size_t i = 0; i + 1 < e.items.size(); i += 2) d.set(eval(*e.items[i], frame), eval(*e.items[i + 1], frame));
    return Value::from(std::move(d));
  }
  List items;
  for (const auto& item : e.items) items.push_back(eval(*item, frame));
  return Value::from(std::move(items), e.kind == ExprKind::List ? Kind::List : Kind::Tuple);
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case ExprKind::Literal:
    case ExprKind::List:
    case ExprKind::Tuple:
    case ExprKind::DictLit:
      return eval_literal(e, frame);
    case ExprKind::Name: {
      if (const Value* v = frame->find(e.name)) return *v;
      if (const Value* g = global_functions().find(e.name)) return *g;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::Attr: {
      const Value object = eval(*e.items[0], frame);
      if (object.is_undefined()) undefined_error(object);
      return get_attribute(object, e.name);
    }
    case ExprKind::Item: {
      const Value object = eval(*e.items[0], frame);
      if (object.is_undefined()) undefined_error(object);
      return get_item(object, eval(*e.items[1], frame));
    }
    case ExprKind::Slice: {
      const Value object = eval(*e.items[0], frame);
      if (object.is_undefined()) undefined_error(object);
      auto part = [&](size_t i) { return e.items[i] ? eval(*e.items[i], frame) : Value::none(); };
      return slice(object, part(1), part(2), part(3));
    }
    case ExprKind::Call:
    case ExprKind::Filter:
    case ExprKind::Test:
      return eval_call(e, frame);
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*e.items[0], frame);
      if (e.kind == ExprKind::Pos) return v;
      return arithmetic("-", Value::from(int64_t{0}), v);
    }
    case ExprKind::Not:
      return Value::from(!truthy(eval(*e.items[0], frame)));
    case ExprKind::Binary:
      return eval_binary(e, frame);
    case ExprKind::Compare:
      return eval_compare(e, frame);
    case ExprKind::Condition:
      if (truthy(eval(*e.items[1], frame))) return eval(*e.items[0], frame);
      if (e.items[2]) return eval(*e.items[2], frame);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
  }
  return Value();
}

Template::Template(std::string_view source, std::string origin)
    : origin_(std::move(origin)), body_(parse_template(source, origin_)) {}

Str Template::render(const std::vector<std::pair<std::string, Value>>& context) const {
  auto root = std::make_shared<Frame>();
  for (const auto& [name, value] : context) root->vars[name] = value;
  Interpreter interpreter(origin_);
  Str out;
  interpreter.exec(body_, root, out);
  return out;
}

}  // namespace moeserve::tokenizer::jinja
