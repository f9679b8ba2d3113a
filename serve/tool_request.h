// The request fields of tool calling and output parsing on /v1/chat/completions: tools (their
// names), tool_choice, parallel_tool_calls, and the test-only scripted output. What they decide
// is how the choice's text is parsed (chatout::ChatOutputParser), not what the model is asked.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chatout/chat_output_parser.h"
#include "grammar/grammar_engine.h"

namespace moeserve::serve {

struct ServedModel;

struct OutputParsing {
  bool enabled = false;  // a reasoning parser, or tool calls to parse
  chatout::ChatOutputOptions options;
  // false: only the first call is returned (OpenAI's parallel_tool_calls; vLLM's
  // maybe_filter_parallel_tool_calls keeps the first call, streamed or not; SGLang the same).
  bool parallel_tool_calls = true;
};

// Sets `parsing` from the chat request's tools, tool_choice and parallel_tool_calls and the
// server's --tool-call-parser / --reasoning-parser. Throws ApiError (400) naming the field:
//   tool_choice "none": tools stay in the prompt (vLLM's default), the output is not parsed for calls
//   tool_choice "auto" (the default with tools): calls are parsed; an explicit "auto" without
//     --tool-call-parser is refused, as vLLM does
//   tool_choice "required" or {"type": "function", ...}: calls are parsed, and `grammar` is set to
//     one call of an allowed tool (the named one) in the --tool-call-parser's format, with
//     arguments matching its parameters (grammar/tool_call_grammar.h), so the model must call;
//     refused without tools, without a tool-call parser, or with a response_format
void parse_output_parsing(const nlohmann::ordered_json& body, const ServedModel& model, OutputParsing& parsing,
                          std::optional<grammar::GrammarSpec>& grammar);

// "moeserve_test_script": text the model is made to emit, token by token as the tokenizer splits
// it (special tokens included), instead of its own tokens; only with the hidden serve flag
// --test-scripted-output (tests of output formats no test model can produce). Empty if absent.
std::vector<int32_t> parse_scripted_output(const nlohmann::ordered_json& body, const ServedModel& model);

}  // namespace moeserve::serve
