// One chat completion choice's output parsing: the reasoning parser first (when configured),
// then the tool-call parser on what follows the reasoning (when the request has tools to call).
// Streamed: feed() each piece of text as the detokenizer releases it and send each delta;
// whole: feed() everything, finish(), and add the deltas up with ParsedMessage.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chatout/deltas.h"
#include "chatout/reasoning_parser.h"
#include "chatout/tool_call_parser.h"

namespace moeserve::chatout {

struct ChatOutputOptions {
  std::string reasoning_parser;  // "": none
  std::string tool_parser;       // "": tool calls are not parsed
  ToolParserOptions tools;
};

class ChatOutputParser {
 public:
  // Throws Error naming an unknown parser.
  explicit ChatOutputParser(const ChatOutputOptions& options);

  OutputDelta feed(std::string_view text);
  // The output ended (after the last feed).
  OutputDelta finish();
  // The choice's finish_reason from the engine's ("stop", "length"): "tool_calls" when it
  // stopped after at least one call and none was malformed.
  std::string finish_reason(const std::string& engine_reason) const;
  const ToolCallParser* tools() const { return tools_.get(); }

 private:
  void pass_on(const std::string& text, OutputDelta& out);

  std::optional<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

struct ToolCall {
  std::string id, name, arguments;
};

// A whole message from its deltas.
struct ParsedMessage {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;  // by index

  void append(const OutputDelta& delta);
  // Drops the calls a parser found malformed (their text is in the content already).
  void drop_calls(const std::vector<int>& indices);
};

}  // namespace moeserve::chatout
