// What templates call: filters, tests, attributes and methods of values (str, dict, list
// methods as Python has them), and the globals transformers adds (raise_exception,
// strftime_now, namespace, dict) with jinja2's own (range).
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace moeserve::tokenizer::jinja {

bool known_filter(std::string_view name);
bool known_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& input, CallArgs& args, Interpreter& interpreter);
bool apply_test(const std::string& name, const Value& input, CallArgs& args, Interpreter& interpreter);

// jinja2's getattr (`obj.name`: methods first, then items) and getitem (`obj[key]`: items
// first, then attributes); missing ones are Undefined with jinja2's hint.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists, tuples and strings (absent parts Undefined).
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The globals every template sees (range, namespace, dict, raise_exception, strftime_now...).
const Dict& global_functions();

// The method `name` of str, dict or list values bound to `self`, or Undefined.
Value bound_method(const Value& self, const std::string& name);

// Raises the error an Undefined gives when it is used (jinja2's UndefinedError).
[[noreturn]] void undefined_error(const Value& undefined);

}  // namespace moeserve::tokenizer::jinja
