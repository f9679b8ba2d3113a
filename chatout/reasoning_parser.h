// Reasoning parsers: the model's thinking (<think>...</think>) apart from its answer, as
// `reasoning_content`. Both formats start in reasoning: DeepSeek R1's template opens "<think>\n"
// in the prompt, and Kimi K2 Thinking thinks by default (vLLM's kimi_k2 parser is R1's with
// thinking on); a "<think>" the model writes itself at the start is dropped.
//
// Reasoning ends at "</think>" (dropped) or at the start of a tool-call section, which is
// passed on: Kimi may open its tool calls without closing its thinking (vLLM PR #32216), and
// the calls must not be swallowed as reasoning. Output that never ends its reasoning is all
// reasoning (vLLM's DeepSeek R1 semantics).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chatout/deltas.h"

namespace moeserve::chatout {

struct ReasoningOptions {
  // Markers that end reasoning and belong to what follows (a tool parser's call_start_markers).
  std::vector<std::string> implicit_ends;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningOptions options);

  // Reasoning that became final goes to out.reasoning; returns the text after the reasoning.
  std::string feed(std::string_view text, OutputDelta& out);
  // The output ended: what was held back.
  std::string finish(OutputDelta& out);

 private:
  enum class State { kStart, kReasoning, kAfter };

  std::vector<std::string> end_markers() const;

  ReasoningOptions options_;
  State state_ = State::kStart;
  std::string buffer_;
};

const std::vector<std::string>& reasoning_parser_names();
// The options of a named parser (--reasoning-parser); an unknown name is an error.
ReasoningOptions reasoning_options(std::string_view name);

}  // namespace moeserve::chatout
