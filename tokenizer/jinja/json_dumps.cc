// Python's json.dumps over interpreter values: transformers' `tojson` filter.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/value.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer::jinja {
namespace {

// "\uXXXX" escapes of every non-ASCII code point (surrogate pairs above U+FFFF).
std::string ascii_escaped(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += s[i++];
      continue;
    }
    const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    i += n;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
  }
  return out;
}

class Dumper {
 public:
  explicit Dumper(const JsonOptions& options) : options_(options) {}

  void value(const Value& v, int level) {
    switch (v.kind) {
      case Kind::None:
        out += "null";
        break;
      case Kind::Bool:
        out += v.boolean ? "true" : "false";
        break;
      case Kind::Int:
        out += std::to_string(v.integer);
        break;
      case Kind::Float:
        out += python_float(v.real);
        break;
      case Kind::String:
        string(v.text());
        break;
      case Kind::List:
      case Kind::Tuple:
        list(*v.list, level);
        break;
      case Kind::Dict:
        dict(*v.dict, level);
        break;
      default:
        fail("Object of type {} is not JSON serializable", type_name(v));
    }
  }

  std::string out;

 private:
  void string(const std::string& s) {
    if (!options_.ensure_ascii) return append_python_json_string(s, out);
    std::string quoted;
    append_python_json_string(s, quoted);
    out += ascii_escaped(quoted);
  }

  void newline(int level) {
    if (options_.indent < 0) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += options_.indent_text;
  }

  void list(const List& items, int level) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out += options_.item_separator;
        newline(level + 1);
      }
      value(items[i], level + 1);
    }
    newline(level);
    out += ']';
  }

  std::string key_text(const Value& key) {
    switch (key.kind) {
      case Kind::String:
        return key.text();
      case Kind::None:
        return "null";
      case Kind::Bool:
        return key.boolean ? "true" : "false";
      case Kind::Int:
        return std::to_string(key.integer);
      case Kind::Float:
        return python_float(key.real);
      default:
        fail("keys must be str, int, float, bool or None, not {}", type_name(key));
    }
  }

  void dict(const Dict& d, int level) {
    if (d.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> items;
    for (const auto& [k, v] : d.items) items.emplace_back(key_text(k), &v);
    if (options_.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
    out += '{';
    newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out += options_.item_separator;
        newline(level + 1);
      }
      string(items[i].first);
      out += options_.key_separator;
      value(*items[i].second, level + 1);
    }
    newline(level);
    out += '}';
  }

  const JsonOptions& options_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& options) {
  Dumper dumper(options);
  dumper.value(v, 0);
  return std::move(dumper.out);
}

}  // namespace moeserve::tokenizer::jinja
