// Filters and tests: jinja2's built-in ones that chat templates use, and transformers'
// `tojson` (json.dumps with ensure_ascii=False by default, indent, separators, sort_keys).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/str_ops.h"
#include "tokenizer/jinja/template.h"

namespace moeserve::tokenizer::jinja {
namespace {

using Filter = Value (*)(const Value& in, CallArgs& a, Interpreter& interpreter);
using Test = bool (*)(const Value& in, CallArgs& a, Interpreter& interpreter);

Value str_value(Str s) { return Value::string(std::move(s)); }

std::optional<std::string> optional_text(const Value& v) {
  if (v.is_undefined() || v.kind == Kind::None) return std::nullopt;
  return to_str(v).text;
}

Value tojson(const Value& in, CallArgs& a, Interpreter&) {
  JsonOptions o;
  o.ensure_ascii = truthy(a.take(0, "ensure_ascii", Value::from(false)));
  const Value indent = a.take(1, "indent", Value::none());
  const Value separators = a.take(2, "separators", Value::none());
  o.sort_keys = truthy(a.take(3, "sort_keys", Value::from(false)));
  if (indent.kind == Kind::Int) {
    o.indent = static_cast<int>(indent.integer);
    o.indent_text.assign(static_cast<size_t>(std::max<int64_t>(0, indent.integer)), ' ');
  } else if (indent.is_string()) {
    o.indent = 1;
    o.indent_text = indent.text();
  }
  if (o.indent >= 0) o.item_separator.resize(1);  // "," (json.dumps' default with an indent)
  if (separators.is_sequence()) {
    MS_CHECK(separators.list->size() == 2, "separators must be (item_separator, key_separator)");
    o.item_separator = to_str((*separators.list)[0]).text;
    o.key_separator = to_str((*separators.list)[1]).text;
  }
  std::string text = json_dumps(in, o);
  return str_value(holds_request_text(in) ? Str::from_request(std::move(text)) : Str{std::move(text), {}});
}

Value trim(const Value& in, CallArgs& a, Interpreter&) {
  return str_value(str_strip(to_str(in), optional_text(a.take(0, "chars")), true, true));
}

Value length_filter(const Value& in, CallArgs&, Interpreter&) { return Value::from(length(in)); }

Value first(const Value& in, CallArgs&, Interpreter&) {
  const List items = iterate(in);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value last(const Value& in, CallArgs&, Interpreter&) {
  const List items = iterate(in);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_undefined() || attribute.kind == Kind::None) return item;
  Value v = item;
  for (const Str& part : str_split(to_str(attribute), std::string("."), -1, false)) {
    const bool digits = !part.text.empty() && std::all_of(part.text.begin(), part.text.end(), ::isdigit);
    v = get_item(v, digits ? Value::from(static_cast<int64_t>(std::stoll(part.text))) : Value::string(part.text));
  }
  return v;
}

Value join(const Value& in, CallArgs& a, Interpreter&) {
  const Str separator = to_str(a.take(0, "d", Value::string("")));
  const Value attribute = a.take(1, "attribute");
  Str out;
  const List items = iterate(in);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out.append(separator);
    out.append(to_str(attribute_of(items[i], attribute)));
  }
  return str_value(std::move(out));
}

Value upper(const Value& in, CallArgs&, Interpreter&) { return str_value(str_upper(to_str(in))); }
Value lower(const Value& in, CallArgs&, Interpreter&) { return str_value(str_lower(to_str(in))); }
Value capitalize(const Value& in, CallArgs&, Interpreter&) { return str_value(str_capitalize(to_str(in))); }

Value title(const Value& in, CallArgs&, Interpreter&) { return str_value(str_word_title(to_str(in))); }

Value replace(const Value& in, CallArgs& a, Interpreter&) {
  const Str old = to_str(a.take(0, "old"));
  const Str replacement = to_str(a.take(1, "new"));
  const Value count = a.take(2, "count", Value::none());
  return str_value(str_replace(to_str(in), old.text, replacement, count.kind == Kind::Int ? count.integer : -1));
}

Value default_filter(const Value& in, CallArgs& a, Interpreter&) {
  const Value fallback = a.take(0, "default_value", Value::string(""));
  const bool boolean = truthy(a.take(1, "boolean", Value::from(false)));
  if (in.is_undefined() || (boolean && !truthy(in))) return fallback;
  return in;
}

Value list_filter(const Value& in, CallArgs&, Interpreter&) { return Value::from(iterate(in)); }

Value map_filter(const Value& in, CallArgs& a, Interpreter& interpreter) {
  List out;
  const Value attribute = a.take(SIZE_MAX, "attribute");
  const Value fallback = a.take(SIZE_MAX, "default");
  if (!attribute.is_undefined()) {
    for (const Value& item : iterate(in)) {
      Value v = attribute_of(item, attribute);
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value::from(std::move(out));
  }
  MS_CHECK(!a.positional.empty(), "map requires a filter name or attribute=");
  const std::string name = to_str(a.positional[0]).text;
  MS_CHECK(known_filter(name), "No filter named '{}'.", name);
  for (const Value& item : iterate(in)) {
    CallArgs rest;
    rest.what = fmt::format("filter '{}'", name);
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    out.push_back(apply_filter(name, item, rest, interpreter));
  }
  a.consumed = a.positional.size();
  a.keyword.clear();
  return Value::from(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_common(const Value& in, CallArgs& a, Interpreter& interpreter, bool attr, bool keep) {
  const size_t test_index = attr ? 1 : 0;
  const Value attribute = attr ? a.take(0, "attribute") : Value::none();
  const bool has_test = a.positional.size() > test_index;
  const std::string name = has_test ? to_str(a.positional[test_index]).text : "";
  MS_CHECK(!has_test || known_test(name), "No test named '{}'.", name);
  List out;
  for (const Value& item : iterate(in)) {
    const Value subject = attr ? attribute_of(item, attribute) : item;
    bool ok = truthy(subject);
    if (has_test) {
      CallArgs rest;
      rest.what = fmt::format("test '{}'", name);
      rest.positional.assign(a.positional.begin() + test_index + 1, a.positional.end());
      ok = apply_test(name, subject, rest, interpreter);
    }
    if (ok == keep) out.push_back(item);
  }
  a.consumed = a.positional.size();
  return Value::from(std::move(out));
}

Value select(const Value& in, CallArgs& a, Interpreter& i) { return select_common(in, a, i, false, true); }
Value reject(const Value& in, CallArgs& a, Interpreter& i) { return select_common(in, a, i, false, false); }
Value selectattr(const Value& in, CallArgs& a, Interpreter& i) { return select_common(in, a, i, true, true); }
Value rejectattr(const Value& in, CallArgs& a, Interpreter& i) { return select_common(in, a, i, true, false); }

Value items(const Value& in, CallArgs&, Interpreter&) {
  if (in.is_undefined()) return Value::from(List{});
  MS_CHECK(in.kind == Kind::Dict, "Can only get item pairs from a mapping, not {}", type_name(in));
  List out;
  for (const auto& [k, v] : in.dict->items) out.push_back(Value::from(List{k, v}, Kind::Tuple));
  return Value::from(std::move(out));
}

Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(str_lower(*v.str)) : v;
}

Value dictsort(const Value& in, CallArgs& a, Interpreter& i) {
  const bool case_sensitive = truthy(a.take(0, "case_sensitive", Value::from(false)));
  const std::string by = to_str(a.take(1, "by", Value::string("key"))).text;
  const bool reverse = truthy(a.take(2, "reverse", Value::from(false)));
  CallArgs none;
  List out = items(in, none, i).list ? *items(in, none, i).list : List{};
  const size_t pos = by == "value" ? 1 : 0;
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key((*x.list)[pos], case_sensitive), ky = sort_key((*y.list)[pos], case_sensitive);
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return Value::from(std::move(out));
}

Value sort(const Value& in, CallArgs& a, Interpreter&) {
  const bool reverse = truthy(a.take(0, "reverse", Value::from(false)));
  const bool case_sensitive = truthy(a.take(1, "case_sensitive", Value::from(false)));
  const Value attribute = a.take(2, "attribute");
  List out = iterate(in);
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(attribute_of(x, attribute), case_sensitive);
    const Value ky = sort_key(attribute_of(y, attribute), case_sensitive);
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return Value::from(std::move(out));
}

Value string_filter(const Value& in, CallArgs&, Interpreter&) { return str_value(to_str(in)); }

Value int_filter(const Value& in, CallArgs& a, Interpreter&) {
  const Value fallback = a.take(0, "default", Value::from(int64_t{0}));
  if (in.kind == Kind::Int) return in;
  if (in.kind == Kind::Bool) return Value::from(static_cast<int64_t>(in.boolean));
  if (in.kind == Kind::Float) return Value::from(static_cast<int64_t>(in.real));
  if (in.is_string()) {
    try {
      size_t used = 0;
      const std::string t = str_strip(*in.str, std::nullopt, true, true).text;
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value::from(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value float_filter(const Value& in, CallArgs& a, Interpreter&) {
  const Value fallback = a.take(0, "default", Value::real_number(0.0));
  if (in.is_number()) return Value::real_number(in.as_double());
  if (in.is_string()) {
    try {
      size_t used = 0;
      const std::string t = str_strip(*in.str, std::nullopt, true, true).text;
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value::real_number(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value abs_filter(const Value& in, CallArgs&, Interpreter&) {
  MS_CHECK(in.is_number(), "bad operand type for abs(): '{}'", type_name(in));
  if (in.kind == Kind::Float) return Value::real_number(std::fabs(in.real));
  return Value::from(std::abs(in.kind == Kind::Bool ? int64_t{in.boolean} : in.integer));
}

Value round_filter(const Value& in, CallArgs& a, Interpreter&) {
  const int64_t precision = a.take(0, "precision", Value::from(int64_t{0})).integer;
  const std::string method = to_str(a.take(1, "method", Value::string("common"))).text;
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = in.as_double() * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::real_number(r / scale);
}

Value unique(const Value& in, CallArgs&, Interpreter&) {
  List out;
  for (const Value& v : iterate(in)) {
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); })) out.push_back(v);
  }
  return Value::from(std::move(out));
}

Value indent(const Value& in, CallArgs& a, Interpreter&) {
  const Value width = a.take(0, "width", Value::from(int64_t{4}));
  const bool indent_first = truthy(a.take(1, "first", Value::from(false)));
  const bool blank = truthy(a.take(2, "blank", Value::from(false)));
  const Str pad = width.is_string() ? *width.str : Str{std::string(static_cast<size_t>(width.integer), ' '), {}};
  Str s = to_str(in);
  s.append("\n");  // as jinja2 does before splitlines()
  std::vector<Str> lines = str_splitlines(s);
  Str out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out.append("\n");
    if (i == 0 ? indent_first : blank || !lines[i].text.empty()) out.append(pad);
    out.append(lines[i]);
  }
  return str_value(std::move(out));
}

Value safe(const Value& in, CallArgs&, Interpreter&) { return in; }

// jinja2's format filter: printf-style `%s`, `%d`, `%r` and `%%` (Python's str % args).
Value format_filter(const Value& in, CallArgs& a, Interpreter&) {
  const Str f = to_str(in);
  Str out;
  size_t next = 0;
  for (size_t i = 0; i < f.text.size(); ++i) {
    if (f.text[i] != '%') {
      out.append(f.substr(i, i + 1));
      continue;
    }
    MS_CHECK(i + 1 < f.text.size(), "incomplete format");
    const char spec = f.text[++i];
    if (spec == '%') {
      out.append("%");
      continue;
    }
    MS_CHECK(spec == 's' || spec == 'd' || spec == 'r', "unsupported format character '{}'", spec);
    MS_CHECK(next < a.positional.size(), "not enough arguments for format string");
    const Value& v = a.positional[next++];
    if (spec == 'd') {
      MS_CHECK(v.is_number(), "%d format: a real number is required, not {}", type_name(v));
      out.append(std::to_string(v.kind == Kind::Float ? static_cast<int64_t>(v.real) : v.integer));
    } else {
      out.append(spec == 'r' ? Str{repr(v), {}} : to_str(v));
    }
  }
  MS_CHECK(next == a.positional.size(), "not all arguments converted during string formatting");
  a.consumed = a.positional.size();
  return str_value(std::move(out));
}

Value escape(const Value& in, CallArgs&, Interpreter&) {
  Str s = to_str(in);
  for (const auto& [from, to] :
       {std::pair{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&#34;"}, {"'", "&#39;"}})
    s = str_replace(s, from, Str{to, {}}, -1);
  return str_value(std::move(s));
}

Value reverse(const Value& in, CallArgs&, Interpreter&) {
  if (in.is_string()) {
    const List chars = iterate(in);
    Str out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(*it->str);
    return str_value(std::move(out));
  }
  List out = iterate(in);
  std::reverse(out.begin(), out.end());
  return Value::from(std::move(out));
}

Value extreme(const Value& in, CallArgs& a, bool want_max) {
  const bool case_sensitive = truthy(a.take(0, "case_sensitive", Value::from(false)));
  const Value attribute = a.take(1, "attribute");
  const List items = iterate(in);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = &items[0];
  for (const Value& v : items) {
    const Value kv = sort_key(attribute_of(v, attribute), case_sensitive);
    const Value kb = sort_key(attribute_of(*best, attribute), case_sensitive);
    if (want_max ? less(kb, kv) : less(kv, kb)) best = &v;
  }
  return *best;
}

Value max_filter(const Value& in, CallArgs& a, Interpreter&) { return extreme(in, a, true); }
Value min_filter(const Value& in, CallArgs& a, Interpreter&) { return extreme(in, a, false); }

Value sum_filter(const Value& in, CallArgs& a, Interpreter&) {
  const Value attribute = a.take(0, "attribute");
  Value total = a.take(1, "start", Value::from(int64_t{0}));
  for (const Value& v : iterate(in)) {
    const Value x = attribute_of(v, attribute);
    MS_CHECK(x.is_number() && total.is_number(), "unsupported operand type(s) for +");
    const bool real = x.kind == Kind::Float || total.kind == Kind::Float;
    total = real ? Value::real_number(total.as_double() + x.as_double()) : Value::from(total.integer + x.integer);
  }
  return total;
}

const std::map<std::string, Filter, std::less<>>& filters() {
  static const std::map<std::string, Filter, std::less<>> table = {
      {"tojson", tojson},
      {"trim", trim},
      {"length", length_filter},
      {"count", length_filter},
      {"first", first},
      {"last", last},
      {"join", join},
      {"upper", upper},
      {"lower", lower},
      {"title", title},
      {"capitalize", capitalize},
      {"replace", replace},
      {"default", default_filter},
      {"d", default_filter},
      {"list", list_filter},
      {"map", map_filter},
      {"select", select},
      {"reject", reject},
      {"selectattr", selectattr},
      {"rejectattr", rejectattr},
      {"items", items},
      {"dictsort", dictsort},
      {"sort", sort},
      {"string", string_filter},
      {"int", int_filter},
      {"float", float_filter},
      {"abs", abs_filter},
      {"round", round_filter},
      {"unique", unique},
      {"indent", indent},
      {"safe", safe},
      {"e", escape},
      {"escape", escape},
      {"reverse", reverse},
      {"max", max_filter},
      {"min", min_filter},
      {"sum", sum_filter},
      {"format", format_filter},
  };
  return table;
}

}  // namespace

bool known_filter(std::string_view name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args, Interpreter& interpreter) {
  const auto it = filters().find(name);
  MS_CHECK(it != filters().end(), "No filter named '{}'.", name);
  const bool tolerant = name == "default" || name == "d" || name == "length" || name == "count" || name == "string" ||
                        name == "list" || name == "items" || name == "first" || name == "last" || name == "join" ||
                        name == "trim" || name == "safe" || name == "e" || name == "escape" || name == "upper" ||
                        name == "lower" || name == "int" || name == "float" || name == "map" || name == "select" ||
                        name == "reject" || name == "selectattr" || name == "rejectattr" || name == "unique" ||
                        name == "sort" || name == "reverse" || name == "title" || name == "capitalize" ||
                        name == "replace" || name == "indent";
  if (input.is_undefined() && !tolerant) undefined_error(input);
  Value v = it->second(input, args, interpreter);
  args.check_consumed();
  return v;
}

}  // namespace moeserve::tokenizer::jinja
