#include "tokenizer/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer::jinja {

void Str::append(std::string_view piece, bool from_request) {
  if (piece.empty()) return;
  if (from_request) {
    if (!request.empty() && request.back().end == text.size())
      request.back().end += piece.size();
    else
      request.push_back({text.size(), text.size() + piece.size()});
  }
  text += piece;
}

void Str::append(const Str& other) {
  size_t done = 0;
  for (const TextRange& r : other.request) {
    append(std::string_view(other.text).substr(done, r.begin - done), false);
    append(std::string_view(other.text).substr(r.begin, r.end - r.begin), true);
    done = r.end;
  }
  append(std::string_view(other.text).substr(done), false);
}

Str Str::substr(size_t begin, size_t end) const {
  Str out;
  out.text = text.substr(begin, end - begin);
  for (const TextRange& r : request) {
    const size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
    if (b < e) out.request.push_back({b - begin, e - begin});
  }
  return out;
}

Str Str::from_request(std::string text) {
  Str s;
  s.append(text, true);
  return s;
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.text() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value CallArgs::take(size_t index, std::string_view name, Value fallback) {
  for (auto it = keyword.begin(); it != keyword.end(); ++it) {
    if (it->first == name) {
      Value v = std::move(it->second);
      keyword.erase(it);
      return v;
    }
  }
  if (index < positional.size()) {
    consumed = std::max(consumed, index + 1);
    return positional[index];
  }
  return fallback;
}

void CallArgs::check_consumed() const {
  MS_CHECK(keyword.empty(), "{} got an unexpected keyword argument '{}'", what, keyword.front().first);
  MS_CHECK(positional.size() <= consumed, "{} takes {} positional arguments but {} were given", what, consumed,
           positional.size());
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.boolean;
    case Kind::Int:
      return v.integer != 0;
    case Kind::Float:
      return v.real != 0;
    case Kind::String:
      return !v.text().empty();
    case Kind::List:
    case Kind::Tuple:
      return !v.list->empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

namespace {

std::string float_str(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return python_float(d);
}

std::string string_repr(const std::string& s) {
  const bool double_quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = double_quote ? '"' : '\'';
  std::string out(1, quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out + quote;
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::String:
      return string_repr(v.text());
    case Kind::List:
    case Kind::Tuple: {
      std::string out = v.kind == Kind::List ? "[" : "(";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      if (v.kind == Kind::Tuple && v.list->size() == 1) out += ",";
      return out + (v.kind == Kind::List ? "]" : ")");
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        out += (first ? "" : ", ") + repr(k) + ": " + repr(item);
        first = false;
      }
      return out + "}";
    }
    default:
      return to_str(v).text;
  }
}

Str to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::None:
      return {"None", {}};
    case Kind::Bool:
      return {v.boolean ? "True" : "False", {}};
    case Kind::Int:
      return {std::to_string(v.integer), {}};
    case Kind::Float:
      return {float_str(v.real), {}};
    case Kind::String:
      return *v.str;
    case Kind::Namespace:
      return {"<Namespace>", {}};
    case Kind::Callable:
      return {fmt::format("<function {}>", v.callable->name), {}};
    default: {
      std::string text = repr(v);
      return holds_request_text(v) ? Str::from_request(std::move(text)) : Str{std::move(text), {}};
    }
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    return (a.kind == Kind::Bool ? a.boolean : a.integer) == (b.kind == Kind::Bool ? b.boolean : b.integer);
  }
  if (a.kind != b.kind) {
    if (a.is_sequence() || b.is_sequence()) return false;
    return false;
  }
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.text() == b.text();
    case Kind::List:
    case Kind::Tuple:
      return std::equal(a.list->begin(), a.list->end(), b.list->begin(), b.list->end(), equal);
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, item] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equal(item, *other)) return false;
      }
      return true;
    }
    default:
      return a.dict == b.dict && a.callable == b.callable;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.text() < b.text();
  if (a.kind == b.kind && a.is_sequence()) {
    return std::lexicographical_compare(a.list->begin(), a.list->end(), b.list->begin(), b.list->end(), less);
  }
  fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

bool holds_request_text(const Value& v) {
  switch (v.kind) {
    case Kind::String:
      return !v.str->request.empty();
    case Kind::List:
    case Kind::Tuple:
      return std::any_of(v.list->begin(), v.list->end(), holds_request_text);
    case Kind::Dict:
      for (const auto& [k, item] : v.dict->items)
        if (holds_request_text(k) || holds_request_text(item)) return true;
      return false;
    default:
      return false;
  }
}

namespace {

// The length of the UTF-8 sequence starting with `lead` (1 for a stray byte).
size_t utf8_length(unsigned char lead) {
  if (lead >= 0xf0) return 4;
  if (lead >= 0xe0) return 3;
  if (lead >= 0xc0) return 2;
  return 1;
}

}  // namespace

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
    case Kind::Tuple:
      return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& item : v.dict->items) keys.push_back(item.first);
      return keys;
    }
    case Kind::String: {
      List chars;
      const std::string& s = v.text();
      for (size_t i = 0; i < s.size();) {
        const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
        chars.push_back(Value::string(v.str->substr(i, i + n)));
        i += n;
      }
      return chars;
    }
    default:
      fail("'{}' object is not iterable", type_name(v));
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String: {
      int64_t n = 0;
      for (char c : v.text()) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
      return n;
    }
    case Kind::List:
    case Kind::Tuple:
      return static_cast<int64_t>(v.list->size());
    case Kind::Dict:
    case Kind::Namespace:
      return static_cast<int64_t>(v.dict->items.size());
    default:
      fail("object of type '{}' has no len()", type_name(v));
  }
}

Value from_json(const nlohmann::ordered_json& json, bool from_request) {
  using T = nlohmann::json::value_t;
  switch (json.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::from(json.get<bool>());
    case T::number_integer:
    case T::number_unsigned:
      return Value::from(json.get<int64_t>());
    case T::number_float:
      return Value::real_number(json.get<double>());
    case T::string: {
      const std::string& s = json.get_ref<const std::string&>();
      return Value::string(from_request ? Str::from_request(s) : Str{s, {}});
    }
    case T::array: {
      List items;
      for (const auto& item : json) items.push_back(from_json(item, from_request));
      return Value::from(std::move(items));
    }
    case T::object: {
      Dict d;
      for (const auto& [k, item] : json.items()) {
        d.items.emplace_back(Value::string(from_request ? Str::from_request(k) : Str{k, {}}),
                             from_json(item, from_request));
      }
      return Value::from(std::move(d));
    }
    default:
      fail("a JSON value of type {} cannot be passed to a template", json.type_name());
  }
}

}  // namespace moeserve::tokenizer::jinja
