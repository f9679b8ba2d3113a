#include "tokenizer/python_json.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace moeserve::tokenizer {

// Python's repr(float): shortest round-trip digits, exponent form outside [1e-4, 1e16),
// always a '.' or an exponent. fmt's "{}" follows the same rules except that it drops ".0".
std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

namespace {

void append_string(const std::string& s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_value(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      out += "null";
      break;
    case nlohmann::json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case nlohmann::json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case nlohmann::json::value_t::number_float:
      out += python_float(v.get<double>());
      break;
    case nlohmann::json::value_t::string:
      append_string(v.get_ref<const std::string&>(), out);
      break;
    case nlohmann::json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        append_value(item, out);
      }
      out += ']';
      break;
    }
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(key, out);
        out += ": ";
        append_value(item, out);
      }
      out += '}';
      break;
    }
    default:
      fail("cannot write a JSON value of type {}", v.type_name());
  }
}

}  // namespace

void append_python_json_string(const std::string& s, std::string& out) { append_string(s, out); }

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_value(value, out);
  return out;
}

std::string python_str(const nlohmann::ordered_json& value, std::string_view what) {
  switch (value.type()) {
    case nlohmann::json::value_t::string:
      return value.get<std::string>();
    case nlohmann::json::value_t::null:
      return "None";
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case nlohmann::json::value_t::number_integer:
      return std::to_string(value.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return std::to_string(value.get<uint64_t>());
    case nlohmann::json::value_t::number_float: {
      const double v = value.get<double>();
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      return python_float(v);
    }
    default:
      fail("{} must be a string, number, boolean or null, not an {}", what, value.type_name());
  }
}

}  // namespace moeserve::tokenizer
