// Structured-output fields of a completions or chat request, as a grammar (grammar/):
//   response_format {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name", "schema",
//   "strict"}} | {"type": "structural_tag", "format": ...} (xgrammar's) | {"type": "text"} (none);
//   vLLM's guided_json (a schema, object or string) and guided_grammar (EBNF); SGLang's json_schema
//   (a schema string) and ebnf. At most one of them. "strict" defaults to true (as SGLang and
//   vLLM run xgrammar): objects carry only the properties the schema names.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "grammar/grammar_engine.h"

namespace moeserve::serve {

// The request's grammar, none without structured output. Throws ApiError (400) naming the field.
std::optional<grammar::GrammarSpec> parse_response_format(const nlohmann::ordered_json& body);

// Compiles `spec` on `engine` (null: the server has no grammar engine), so that a schema
// xgrammar cannot take is a 400 naming `field` before the request is queued.
void check_grammar(grammar::GrammarEngine* engine, const grammar::GrammarSpec& spec);

}  // namespace moeserve::serve
