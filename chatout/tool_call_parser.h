// Tool-call parsers: the model's own tool-call markup (one format per model family) in
// streamed text to OpenAI tool calls. A parser belongs to one response: all its state is its
// own, so concurrent requests cannot disturb one another (vLLM #54701 was a shared one).
//
// Malformed output is never an error: a call that is unclosed when the output ends, names a
// tool the request did not offer, or whose arguments are not JSON is returned as content (its
// raw text) and counted in invalid_calls(); the response's finish_reason is then not
// "tool_calls" (ChatOutputParser::finish_reason).
#pragma once

#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chatout/deltas.h"

namespace moeserve::chatout {

struct ToolParserOptions {
  // The names of the tools the request offered: a call of any other is returned as content.
  // Empty: every name is accepted.
  std::vector<std::string> tool_names;
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolParserOptions options);
  virtual ~ToolCallParser() = default;

  // The next piece of the output: content and call pieces that became final go to `out`.
  virtual void feed(std::string_view text, OutputDelta& out) = 0;
  // The output ended: whatever was held back goes to `out` (an unfinished call as content).
  virtual void finish(OutputDelta& out) = 0;
  // The markers that open this format's tool calls (a reasoning parser ends reasoning there).
  virtual std::vector<std::string> call_start_markers() const = 0;

  int calls_started() const { return next_index_; }
  // The indices of calls whose first piece was sent but which turned out malformed.
  const std::vector<int>& invalid_calls() const { return invalid_; }
  // Calls that were also returned as content: unknown names, or malformed before any piece was sent.
  int rejected_calls() const { return rejected_; }

 protected:
  bool tool_known(std::string_view name) const;
  // Starts call `calls_started()`: its first piece, with `id` or a new "call_..." id.
  int begin_call(const std::string& name, const std::string& id, OutputDelta& out);
  void mark_invalid(int index) { invalid_.push_back(index); }
  void mark_rejected() { ++rejected_; }

 private:
  std::string new_call_id();

  ToolParserOptions options_;
  std::mt19937_64 rng_;  // call ids; per parser, seeded from the OS
  int next_index_ = 0;
  std::vector<int> invalid_;
  int rejected_ = 0;
};

// The parser names of --tool-call-parser.
const std::vector<std::string>& tool_parser_names();
// A parser for one response; an unknown name is an error listing the known ones.
std::unique_ptr<ToolCallParser> make_tool_parser(std::string_view name, ToolParserOptions options);

// The formats, one file each.
std::unique_ptr<ToolCallParser> make_kimi_k2_parser(ToolParserOptions options);
std::unique_ptr<ToolCallParser> make_deepseek_v3_parser(ToolParserOptions options);
std::unique_ptr<ToolCallParser> make_deepseek_v31_parser(ToolParserOptions options);
std::unique_ptr<ToolCallParser> make_qwen3_parser(ToolParserOptions options);

}  // namespace moeserve::chatout
