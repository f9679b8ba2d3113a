// What the output parsers make of a chat completion's text: content, reasoning_content and tool
// calls, as OpenAI's streaming deltas (a call's index, its id and name on its first delta, its
// JSON arguments as string pieces) and as the whole message they add up to.
#pragma once

#include <string>
#include <vector>

namespace moeserve::chatout {

// One piece of a tool call. The first piece of call `index` carries its id and name; every
// piece may carry more of its arguments. A whole call (non-streamed) is one piece with all.
struct ToolCallDelta {
  int index = 0;          // the call's position in this response (0, 1, ...), never the model's own number
  std::string id;         // "" on every piece but the first
  std::string name;       // "" on every piece but the first
  std::string arguments;  // the next characters of the arguments' JSON text
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  // Appends `more`; pieces of the call already last here are merged into it.
  void append(const OutputDelta& more);
  void add_arguments(int index, const std::string& text);
};

}  // namespace moeserve::chatout
