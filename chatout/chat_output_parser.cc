#include "chatout/chat_output_parser.h"

#include <algorithm>

namespace moeserve::chatout {

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options) {
  if (!options.tool_parser.empty()) tools_ = make_tool_parser(options.tool_parser, options.tools);
  if (!options.reasoning_parser.empty()) {
    ReasoningOptions reasoning = reasoning_options(options.reasoning_parser);
    if (tools_)
      for (std::string& marker : tools_->call_start_markers())
        if (std::find(reasoning.implicit_ends.begin(), reasoning.implicit_ends.end(), marker) ==
            reasoning.implicit_ends.end())
          reasoning.implicit_ends.push_back(std::move(marker));
    reasoning_.emplace(std::move(reasoning));
  }
}

void ChatOutputParser::pass_on(const std::string& text, OutputDelta& out) {
  if (tools_)
    tools_->feed(text, out);
  else
    out.content += text;
}

OutputDelta ChatOutputParser::feed(std::string_view text) {
  OutputDelta out;
  pass_on(reasoning_ ? reasoning_->feed(text, out) : std::string(text), out);
  return out;
}

OutputDelta ChatOutputParser::finish() {
  OutputDelta out;
  if (reasoning_) pass_on(reasoning_->finish(out), out);
  if (tools_) tools_->finish(out);
  return out;
}

std::string ChatOutputParser::finish_reason(const std::string& engine_reason) const {
  // "length" stays: the client must know the output was cut, calls or not.
  if (engine_reason != "stop" || !tools_) return engine_reason;
  const bool called = tools_->calls_started() > static_cast<int>(tools_->invalid_calls().size());
  return called && tools_->invalid_calls().empty() && tools_->rejected_calls() == 0 ? "tool_calls" : engine_reason;
}

void ParsedMessage::append(const OutputDelta& delta) {
  content += delta.content;
  reasoning += delta.reasoning;
  for (const ToolCallDelta& piece : delta.tool_calls) {
    if (piece.index >= static_cast<int>(tool_calls.size())) tool_calls.resize(piece.index + 1);
    ToolCall& call = tool_calls[piece.index];
    if (!piece.id.empty()) call.id = piece.id;
    if (!piece.name.empty()) call.name = piece.name;
    call.arguments += piece.arguments;
  }
}

void ParsedMessage::drop_calls(const std::vector<int>& indices) {
  std::vector<ToolCall> kept;
  for (size_t i = 0; i < tool_calls.size(); ++i)
    if (std::find(indices.begin(), indices.end(), static_cast<int>(i)) == indices.end())
      kept.push_back(std::move(tool_calls[i]));
  tool_calls = std::move(kept);
}

}  // namespace moeserve::chatout
