#include "serve/response_format.h"

#include <fmt/format.h>

#include "core/error.h"
#include "serve/api_error.h"

namespace moeserve::serve {
namespace {

using Json = nlohmann::ordered_json;
using grammar::GrammarKind;
using grammar::GrammarSpec;

[[noreturn]] void bad(const std::string& field, const std::string& message) { throw ApiError(400, message, field); }

// A schema given as a JSON value or as its text.
std::string schema_text(const Json& v, const std::string& field) {
  if (v.is_string()) {
    const Json parsed = Json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) bad(field, field + ": not valid JSON");
    return parsed.dump();
  }
  if (!v.is_object() && !v.is_boolean())
    bad(field, fmt::format("{}: expected a JSON schema (object or string), got {}", field, v.type_name()));
  return v.dump();
}

GrammarSpec json_schema_format(const Json& format) {
  auto it = format.find("json_schema");
  if (it == format.end() || !it->is_object())
    bad("response_format", "response_format.json_schema: required object with a \"schema\"");
  auto schema = it->find("schema");
  if (schema == it->end() || schema->is_null()) bad("response_format", "response_format.json_schema.schema: required");
  bool strict = true;
  if (auto s = it->find("strict"); s != it->end() && !s->is_null()) {
    if (!s->is_boolean()) bad("response_format", "response_format.json_schema.strict: expected a boolean");
    strict = s->get<bool>();
  }
  return {GrammarKind::kJsonSchema, schema_text(*schema, "response_format.json_schema.schema"), strict};
}

std::optional<GrammarSpec> response_format(const Json& format) {
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    bad("response_format", "response_format: expected an object with a string \"type\"");
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") return GrammarSpec{GrammarKind::kJsonObject, "", true};
  if (type == "json_schema") return json_schema_format(format);
  if (type == "structural_tag") return GrammarSpec{GrammarKind::kStructuralTag, format.dump(), true};
  bad("response_format",
      fmt::format("response_format.type: '{}' is not one of text, json_object, json_schema, structural_tag", type));
}

}  // namespace

std::optional<GrammarSpec> parse_response_format(const Json& body) {
  std::optional<GrammarSpec> spec;
  std::string from;
  auto take = [&](const char* field, std::optional<GrammarSpec> s) {
    if (!s) return;
    if (spec) bad(field, fmt::format("{}: only one structured-output field per request (also {})", field, from));
    spec = std::move(s);
    from = field;
  };
  auto field = [&](const char* name) -> const Json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* f = field("response_format")) take("response_format", response_format(*f));
  for (const char* name : {"guided_json", "json_schema"})
    if (const Json* f = field(name)) take(name, GrammarSpec{GrammarKind::kJsonSchema, schema_text(*f, name), true});
  for (const char* name : {"guided_grammar", "ebnf"})
    if (const Json* f = field(name)) {
      if (!f->is_string()) bad(name, fmt::format("{}: expected an EBNF grammar string", name));
      take(name, GrammarSpec{GrammarKind::kEbnf, f->get<std::string>(), true});
    }
  return spec;
}

void check_grammar(grammar::GrammarEngine* engine, const GrammarSpec& spec) {
  if (engine == nullptr) bad("response_format", "structured output: this server has no grammar engine");
  try {
    engine->compile(spec);
  } catch (const Error& e) {
    bad("response_format", fmt::format("response_format: {}", e.what()));
  }
}

}  // namespace moeserve::serve
