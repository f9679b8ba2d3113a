// Attributes, items, slices and methods of values; the template globals.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/str_ops.h"
#include "tokenizer/jinja/template.h"

namespace moeserve::tokenizer::jinja {

void undefined_error(const Value& undefined) {
  fail("{}", undefined.hint.empty() ? "undefined value" : undefined.hint);
}

namespace {

std::string object_name(const Value& v) {
  if (v.kind == Kind::None) return "None";
  return fmt::format("{} object", type_name(v));
}

Value missing(const Value& object, const std::string& what) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_name(object), what));
}

std::optional<std::string> optional_string(const Value& v, const char* what) {
  if (v.is_undefined() || v.kind == Kind::None) return std::nullopt;
  MS_CHECK(v.is_string(), "{} must be a string or None, not {}", what, type_name(v));
  return v.text();
}

int64_t int_arg(const Value& v, int64_t fallback, const char* what) {
  if (v.is_undefined() || v.kind == Kind::None) return fallback;
  MS_CHECK(v.kind == Kind::Int || v.kind == Kind::Bool, "{} must be an integer, not {}", what, type_name(v));
  return v.kind == Kind::Bool ? v.boolean : v.integer;
}

Value strings(std::vector<Str> parts) {
  List items;
  for (Str& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::from(std::move(items));
}

const std::string& string_arg(const Value& v, const char* what) {
  MS_CHECK(v.is_string(), "{} must be a string, not {}", what, type_name(v));
  return v.text();
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  if (affix.is_sequence()) {
    for (const Value& a : *affix.list)
      if (affix_matches(s, a, prefix)) return true;
    return false;
  }
  const std::string& a = string_arg(affix, prefix ? "startswith's argument" : "endswith's argument");
  if (a.size() > s.size()) return false;
  return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

// str.format with "{}", "{0}" and "{name}" fields (no format specs).
Str str_format(const Str& format, CallArgs& args) {
  Str out;
  const std::string& f = format.text;
  size_t next_auto = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if ((f[i] == '{' || f[i] == '}') && i + 1 < f.size() && f[i + 1] == f[i]) {
      out.append(std::string_view(&f[i], 1));
      ++i;
      continue;
    }
    if (f[i] != '{') {
      out.append(format.substr(i, i + 1));
      continue;
    }
    const size_t close = f.find('}', i);
    MS_CHECK(close != std::string::npos, "Single '{{' encountered in format string");
    const std::string field = f.substr(i + 1, close - i - 1);
    Value v;
    if (field.empty()) {
      MS_CHECK(next_auto < args.positional.size(), "Replacement index {} out of range", next_auto);
      v = args.positional[next_auto++];
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      const size_t index = std::stoul(field);
      MS_CHECK(index < args.positional.size(), "Replacement index {} out of range", index);
      v = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [name, value] : args.keyword)
        if (name == field) v = value, found = true;
      MS_CHECK(found, "KeyError: '{}'", field);
    }
    out.append(to_str(v));
    i = close;
  }
  return out;
}

using Method = Value (*)(const Value& self, CallArgs& args);

Value str_method(const std::string& name, const Value& self, CallArgs& a) {
  const Str& s = *self.str;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto chars = optional_string(a.take(0, "chars"), "strip's chars");
    return Value::string(str_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto sep = optional_string(a.take(0, "sep"), "split's sep");
    MS_CHECK(!sep || !sep->empty(), "empty separator");
    return strings(str_split(s, sep, int_arg(a.take(1, "maxsplit"), -1, "maxsplit"), name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith")
    return Value::from(affix_matches(s.text, a.take(0, "prefix"), name == "startswith"));
  if (name == "replace") {
    const Value replacement = a.take(1, "new");
    string_arg(replacement, "replace's new");
    return Value::string(str_replace(s, string_arg(a.take(0, "old"), "replace's old"), *replacement.str,
                                     int_arg(a.take(2, "count"), -1, "count")));
  }
  if (name == "upper") return Value::string(str_upper(s));
  if (name == "lower") return Value::string(str_lower(s));
  if (name == "title") return Value::string(str_title(s));
  if (name == "capitalize") return Value::string(str_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string& sub = string_arg(a.take(0, "sub"), "the substring");
    if (name == "count") {
      int64_t n = 0;
      for (size_t p = s.text.find(sub); p != std::string::npos && !sub.empty(); p = s.text.find(sub, p + sub.size()))
        ++n;
      return Value::from(n);
    }
    const size_t p = name == "rfind" ? s.text.rfind(sub) : s.text.find(sub);
    MS_CHECK(name != "index" || p != std::string::npos, "substring not found");
    return Value::from(code_point_index(s.text, p));
  }
  if (name == "join") {
    Str out;
    const List items = iterate(a.take(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out.append(s);
      out.append(*Value::string(to_str(items[i])).str);
    }
    return Value::string(std::move(out));
  }
  if (name == "format") {
    Value v = Value::string(str_format(s, a));
    a.consumed = a.positional.size();
    a.keyword.clear();
    return v;
  }
  if (name == "splitlines") return strings(str_splitlines(s));
  fail("'str object' has no attribute '{}'", name);
}

bool is_str_method(const std::string& name) {
  static const char* names[] = {"strip",   "lstrip", "rstrip", "split",  "rsplit",     "startswith", "endswith",
                                "replace", "upper",  "lower",  "title",  "capitalize", "find",       "rfind",
                                "index",   "count",  "join",   "format", "splitlines"};
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Value dict_method(const std::string& name, const Value& self, CallArgs& a) {
  const Dict& d = *self.dict;
  if (name == "get") {
    const Value key = a.take(0, "key");
    const Value fallback = a.take(1, "default", Value::none());
    const Value* v = d.find(key);
    return v ? *v : fallback;
  }
  List out;
  for (const auto& [k, v] : d.items) {
    if (name == "items") out.push_back(Value::from(List{k, v}, Kind::Tuple));
    if (name == "keys") out.push_back(k);
    if (name == "values") out.push_back(v);
  }
  return Value::from(std::move(out));
}

Value list_method(const std::string& name, const Value& self, CallArgs& a) {
  const Value x = a.take(0, "value");
  int64_t count = 0;
  for (size_t i = 0; i < self.list->size(); ++i) {
    if (!equal((*self.list)[i], x)) continue;
    if (name == "index") return Value::from(static_cast<int64_t>(i));
    ++count;
  }
  MS_CHECK(name == "count", "{} is not in list", repr(x));
  return Value::from(count);
}

}  // namespace

Value bound_method(const Value& self, const std::string& name) {
  std::function<Value(const std::string&, const Value&, CallArgs&)> method;
  if (self.is_string() && is_str_method(name)) method = str_method;
  if (self.kind == Kind::Dict && (name == "get" || name == "items" || name == "keys" || name == "values"))
    method = dict_method;
  if (self.is_sequence() && (name == "index" || name == "count")) method = list_method;
  if (self.is_sequence() || self.kind == Kind::Dict) {
    static const char* unsafe[] = {"append", "pop",        "extend",  "insert", "remove", "clear",
                                   "update", "setdefault", "popitem", "sort",   "reverse"};
    for (const char* n : unsafe)
      if (name == n) fail("access to attribute '{}' of '{}' object is unsafe.", name, type_name(self));
  }
  if (!method) return Value::undefined("");
  return Value::function(name, [self, name, method](CallArgs& args, Interpreter&) {
    args.what = fmt::format("{}.{}()", type_name(self), name);
    Value v = method(name, self, args);
    if (name != "format") args.check_consumed();
    return v;
  });
}

Value get_attribute(const Value& object, const std::string& name) {
  Value method = bound_method(object, name);
  if (!method.is_undefined()) return method;
  if (object.kind == Kind::Dict || object.kind == Kind::Namespace) {
    if (const Value* v = object.dict->find(name)) return *v;
  }
  return missing(object, name);
}

namespace {

// Python's index normalisation for a sequence of `n` items; nullopt when out of range.
std::optional<size_t> index_in(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

Value get_item(const Value& object, const Value& key) {
  if (object.kind == Kind::Dict || object.kind == Kind::Namespace) {
    if (const Value* v = object.dict->find(key)) return *v;
  }
  const bool int_key = key.kind == Kind::Int || key.kind == Kind::Bool;
  if (object.is_sequence() && int_key) {
    if (auto i = index_in(key.kind == Kind::Bool ? key.boolean : key.integer, object.list->size()))
      return (*object.list)[*i];
    return Value::undefined(fmt::format("{} object has no element {}", type_name(object), repr(key)));
  }
  if (object.is_string() && int_key) {
    const std::vector<size_t> cps = code_point_offsets(object.text());
    if (auto i = index_in(key.kind == Kind::Bool ? key.boolean : key.integer, cps.size() - 1))
      return Value::string(object.str->substr(cps[*i], cps[*i + 1]));
    return Value::undefined(fmt::format("str object has no element {}", repr(key)));
  }
  if (key.is_string()) {
    Value method = bound_method(object, key.text());
    if (!method.is_undefined()) return method;
    return missing(object, key.text());
  }
  return Value::undefined(fmt::format("{} object has no element {}", type_name(object), repr(key)));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  MS_CHECK(object.is_sequence() || object.is_string(), "'{}' object is not subscriptable", type_name(object));
  const std::vector<size_t> cps = object.is_string() ? code_point_offsets(object.text()) : std::vector<size_t>{};
  const auto n = static_cast<int64_t>(object.is_string() ? cps.size() - 1 : object.list->size());
  const int64_t st = int_arg(step, 1, "a slice step");
  MS_CHECK(st != 0, "slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is_undefined() || v.kind == Kind::None) return fallback;
    int64_t i = int_arg(v, 0, "a slice index");
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : n - 1), e = bound(stop, st > 0 ? n : -1);
  std::vector<int64_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
  if (object.is_string()) {
    Str out;
    for (int64_t i : picks) out.append(object.str->substr(cps[i], cps[i + 1]));
    return Value::string(std::move(out));
  }
  List items;
  for (int64_t i : picks) items.push_back((*object.list)[i]);
  return Value::from(std::move(items), object.kind);
}

namespace {

Value range_function(CallArgs& a, Interpreter&) {
  MS_CHECK(!a.positional.empty() && a.positional.size() <= 3, "range expected 1 to 3 arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = int_arg(a.positional[0], 0, "range's stop");
  } else {
    start = int_arg(a.positional[0], 0, "range's start");
    stop = int_arg(a.positional[1], 0, "range's stop");
    if (a.positional.size() == 3) step = int_arg(a.positional[2], 1, "range's step");
  }
  MS_CHECK(step != 0, "range() arg 3 must not be zero");
  List items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    items.push_back(Value::from(i));
    MS_CHECK(items.size() <= 1000000, "range too big");
  }
  return Value::from(std::move(items));
}

Value mapping_function(CallArgs& a, Kind kind) {
  Dict d;
  for (const Value& p : a.positional) {
    MS_CHECK(p.kind == Kind::Dict, "{}() takes a mapping, not {}", kind == Kind::Dict ? "dict" : "namespace",
             type_name(p));
    for (const auto& [k, v] : p.dict->items) d.set(k, v);
  }
  for (const auto& [k, v] : a.keyword) {
    MS_CHECK(kind == Kind::Dict || k.empty() || k[0] != '_',
             "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'.", k);
    d.set(Value::string(k), v);
  }
  return Value::from(std::move(d), kind);
}

Value strftime_now(CallArgs& a, Interpreter&) {
  const std::string& format = string_arg(a.take(0, "format"), "strftime_now's format");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[256];
  const size_t n = std::strftime(buffer, sizeof buffer, format.c_str(), &local);
  return Value::string(std::string(buffer, n));
}

}  // namespace

const Dict& global_functions() {
  static const Dict globals = [] {
    Dict d;
    d.set(Value::string("range"), Value::function("range", range_function));
    d.set(Value::string("namespace"),
          Value::function("namespace", [](CallArgs& a, Interpreter&) { return mapping_function(a, Kind::Namespace); }));
    d.set(Value::string("dict"),
          Value::function("dict", [](CallArgs& a, Interpreter&) { return mapping_function(a, Kind::Dict); }));
    d.set(Value::string("raise_exception"), Value::function("raise_exception", [](CallArgs& a, Interpreter&) -> Value {
            fail("{}", to_str(a.take(0, "message")).text);
          }));
    d.set(Value::string("strftime_now"), Value::function("strftime_now", strftime_now));
    return d;
  }();
  return globals;
}

}  // namespace moeserve::tokenizer::jinja
