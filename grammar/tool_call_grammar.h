// tool_choice "required" and named ({"type": "function", "function": {"name": ...}}) as a
// grammar: the output must be one call, in the model's tool-call format, of one of the allowed
// tools, with arguments matching that tool's "parameters" schema. Formats:
//   kimi_k2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
//            {arguments}<|tool_call_end|><|tool_calls_section_end|>
//   deepseek_v3:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{arguments}\n```
//                 <｜tool▁call▁end｜><｜tool▁calls▁end｜>
//   deepseek_v31: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>
//                 <｜tool▁calls▁end｜>
//   qwen3:   <tool_call>\n{"name": "NAME", "arguments": {arguments}}\n</tool_call>
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "grammar/grammar_engine.h"

namespace moeserve::grammar {

struct ToolCallGrammarParams {
  std::string format;            // the tool-call parser's name: kimi_k2, deepseek_v3, deepseek_v31 or qwen3
  const nlohmann::json& tools;   // the request's "tools" (OpenAI: [{"type": "function", "function": {...}}])
  const nlohmann::json& choice;  // the request's "tool_choice": "required" or {"type": "function", ...}
};

// A kToolCall spec for GrammarEngine (an xgrammar structural tag in shape). Throws Error naming the field: an unknown
// format, a choice that constrains nothing ("auto", "none"), a named tool not in `tools`, no tools.
GrammarSpec tool_call_grammar(const ToolCallGrammarParams& params);

}  // namespace moeserve::grammar
