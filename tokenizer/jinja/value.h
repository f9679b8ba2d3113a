// Values of the chat-template interpreter: Python's view of what a Jinja template handles
// (None, bool, int, float, str, list, tuple, dict, namespace, callables) plus jinja2's
// default Undefined. Strings remember which of their bytes the request wrote (provenance),
// so that the rendered prompt can mark exactly those bytes as plain text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer::jinja {

// A string and the byte ranges of it the request wrote (sorted, disjoint, merged).
struct Str {
  std::string text;
  std::vector<TextRange> request;

  void append(std::string_view piece, bool from_request = false);
  void append(const Str& other);
  // Bytes [begin, end) with their provenance.
  Str substr(size_t begin, size_t end) const;
  static Str from_request(std::string text);
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Callable };

struct Value;
struct CallArgs;
class Interpreter;
using List = std::vector<Value>;

// A Python dict: insertion-ordered, keys compared by value (small: a linear search).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&, Interpreter&)> call;
};

struct Value {
  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::shared_ptr<const Str> str;
  std::shared_ptr<List> list;  // List and Tuple
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<const Callable> callable;
  // Undefined: why (jinja2's hint, "'x' is undefined"), raised when it is used.
  std::string hint;

  static Value undefined(std::string hint) {
    Value v;
    v.hint = std::move(hint);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value from(bool b) {
    Value v = make(Kind::Bool);
    v.boolean = b;
    return v;
  }
  static Value from(int64_t i) {
    Value v = make(Kind::Int);
    v.integer = i;
    return v;
  }
  static Value real_number(double d) {
    Value v = make(Kind::Float);
    v.real = d;
    return v;
  }
  static Value string(Str s) {
    Value v = make(Kind::String);
    v.str = std::make_shared<const Str>(std::move(s));
    return v;
  }
  static Value string(std::string_view s) { return string(Str{std::string(s), {}}); }
  static Value from(List items, Kind kind = Kind::List) {
    Value v = make(kind);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value from(Dict d, Kind kind = Kind::Dict) {
    Value v = make(kind);
    v.dict = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value function(std::string name, std::function<Value(CallArgs&, Interpreter&)> call) {
    Value v = make(Kind::Callable);
    v.callable = std::make_shared<const Callable>(Callable{std::move(name), std::move(call)});
    return v;
  }
  static Value make(Kind kind) {
    Value v;
    v.kind = kind;
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Dict; }
  const std::string& text() const { return str->text; }
  double as_double() const { return kind == Kind::Float ? real : kind == Kind::Bool ? boolean : double(integer); }
};

// Arguments of a call: positional, then keyword, in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string what;  // "filter 'join'", for errors

  // The argument at `index` or named `name`; `fallback` if absent. Consumed arguments are
  // removed so that check_consumed can refuse unknown ones.
  Value take(size_t index, std::string_view name, Value fallback = Value::undefined(""));
  void check_consumed() const;
  size_t consumed = 0;
};

// Python's type name: "str", "dict", "NoneType", "Undefined"...
const char* type_name(const Value& v);
// Python truthiness (Undefined is false).
bool truthy(const Value& v);
// str(v) as Jinja prints it (Undefined prints as nothing); keeps string provenance.
Str to_str(const Value& v);
// repr(v), as str() of a list or dict prints its items.
std::string repr(const Value& v);
// Python ==.
bool equal(const Value& a, const Value& b);
// Python <, for numbers, strings and sequences; an error otherwise.
bool less(const Value& a, const Value& b);
// Whether any string in v (keys included) holds request bytes.
bool holds_request_text(const Value& v);
// The items a for loop visits (a dict's keys, a string's characters); Undefined gives none.
List iterate(const Value& v);
// Python len().
int64_t length(const Value& v);

// JSON (from the request: every string is request text, or from the template's context).
Value from_json(const nlohmann::ordered_json& json, bool from_request);

struct JsonOptions {
  int indent = -1;  // -1: none
  std::string indent_text;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps(v, ...).
std::string json_dumps(const Value& v, const JsonOptions& options);

}  // namespace moeserve::tokenizer::jinja
