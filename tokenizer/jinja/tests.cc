// jinja2's tests (`x is defined`, `x is divisibleby 3`...).
#include <map>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/str_ops.h"

namespace moeserve::tokenizer::jinja {
namespace {

using Test = bool (*)(const Value& in, CallArgs& a);

Value operand(CallArgs& a) {
  MS_CHECK(!a.positional.empty(), "{} needs an argument", a.what);
  return a.take(0, "other");
}

bool is_int(const Value& v) { return v.kind == Kind::Int; }

const std::map<std::string, Test, std::less<>>& tests() {
  static const std::map<std::string, Test, std::less<>> table = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.kind == Kind::None; }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.kind == Kind::Dict; }},
      {"iterable", [](const Value& v,
                      CallArgs&) { return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping(); }},
      {"sequence", [](const Value& v,
                      CallArgs&) { return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_mapping(); }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"integer", [](const Value& v, CallArgs&) { return is_int(v); }},
      {"float", [](const Value& v, CallArgs&) { return v.kind == Kind::Float; }},
      {"boolean", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool; }},
      {"true", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool && v.boolean; }},
      {"false", [](const Value& v, CallArgs&) { return v.kind == Kind::Bool && !v.boolean; }},
      {"callable", [](const Value& v, CallArgs&) { return v.kind == Kind::Callable; }},
      {"odd", [](const Value& v, CallArgs&) { return is_int(v) && v.integer % 2 != 0; }},
      {"even", [](const Value& v, CallArgs&) { return is_int(v) && v.integer % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, CallArgs& a) {
         const Value n = operand(a);
         MS_CHECK(is_int(v) && is_int(n) && n.integer != 0, "divisibleby needs non-zero integers");
         return v.integer % n.integer == 0;
       }},
      {"lower", [](const Value& v, CallArgs&) { return v.is_string() && str_is_lower(v.text(), true); }},
      {"upper", [](const Value& v, CallArgs&) { return v.is_string() && str_is_lower(v.text(), false); }},
      {"equalto", [](const Value& v, CallArgs& a) { return equal(v, operand(a)); }},
      {"eq", [](const Value& v, CallArgs& a) { return equal(v, operand(a)); }},
      {"==", [](const Value& v, CallArgs& a) { return equal(v, operand(a)); }},
      {"ne", [](const Value& v, CallArgs& a) { return !equal(v, operand(a)); }},
      {"!=", [](const Value& v, CallArgs& a) { return !equal(v, operand(a)); }},
      {"lt", [](const Value& v, CallArgs& a) { return less(v, operand(a)); }},
      {"<", [](const Value& v, CallArgs& a) { return less(v, operand(a)); }},
      {"gt", [](const Value& v, CallArgs& a) { return less(operand(a), v); }},
      {">", [](const Value& v, CallArgs& a) { return less(operand(a), v); }},
      {"le", [](const Value& v, CallArgs& a) { return !less(operand(a), v); }},
      {"<=", [](const Value& v, CallArgs& a) { return !less(operand(a), v); }},
      {"ge", [](const Value& v, CallArgs& a) { return !less(v, operand(a)); }},
      {">=", [](const Value& v, CallArgs& a) { return !less(v, operand(a)); }},
      {"in",
       [](const Value& v, CallArgs& a) {
         const Value seq = operand(a);
         if (seq.is_string()) return v.is_string() && seq.text().find(v.text()) != std::string::npos;
         if (seq.kind == Kind::Dict) return seq.dict->find(v) != nullptr;
         for (const Value& item : iterate(seq))
           if (equal(item, v)) return true;
         return false;
       }},
      {"sameas",
       [](const Value& v, CallArgs& a) {
         const Value o = operand(a);
         if (v.kind != o.kind) return false;
         if (v.kind == Kind::None || v.kind == Kind::Undefined) return true;
         if (v.kind == Kind::Bool) return v.boolean == o.boolean;
         return v.list == o.list && v.dict == o.dict && v.str == o.str && v.callable == o.callable &&
                v.integer == o.integer && v.real == o.real;
       }},
  };
  return table;
}

}  // namespace

bool known_test(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& input, CallArgs& args, Interpreter&) {
  const auto it = tests().find(name);
  MS_CHECK(it != tests().end(), "No test named '{}'.", name);
  const bool result = it->second(input, args);
  args.check_consumed();
  return result;
}

}  // namespace moeserve::tokenizer::jinja
