#include "serve/chat_output.h"

#include <algorithm>

namespace moeserve::serve {

namespace {

// parallel_tool_calls false: only the first call (index 0) is returned, as vLLM's
// maybe_filter_parallel_tool_calls does for streamed and whole responses.
void keep_first_call_only(std::vector<chatout::ToolCallDelta>& calls) {
  calls.erase(std::remove_if(calls.begin(), calls.end(), [](const chatout::ToolCallDelta& c) { return c.index > 0; }),
              calls.end());
}

}  // namespace

void parse_stream_delta(chatout::ChatOutputParser& parser, const OutputParsing& parsing, bool last,
                        ChoiceOutput& delta) {
  chatout::OutputDelta parsed = parser.feed(delta.text);
  if (last) {
    parsed.append(parser.finish());
    delta.finish_reason = parser.finish_reason(delta.finish_reason);
  }
  delta.parsed = true;
  delta.text = std::move(parsed.content);
  delta.reasoning = std::move(parsed.reasoning);
  delta.tool_calls = std::move(parsed.tool_calls);
  if (!parsing.parallel_tool_calls) keep_first_call_only(delta.tool_calls);
}

void parse_whole_choice(chatout::ChatOutputParser& parser, const OutputParsing& parsing, ChoiceOutput& choice) {
  chatout::ParsedMessage message;
  message.append(parser.feed(choice.text));
  message.append(parser.finish());
  // Calls found malformed after their first piece: their text is in the content already.
  if (parser.tools()) message.drop_calls(parser.tools()->invalid_calls());
  if (!parsing.parallel_tool_calls && message.tool_calls.size() > 1) message.tool_calls.resize(1);
  choice.parsed = true;
  choice.text = std::move(message.content);
  choice.reasoning = std::move(message.reasoning);
  choice.tool_calls.clear();
  for (size_t i = 0; i < message.tool_calls.size(); ++i) {
    chatout::ToolCall& call = message.tool_calls[i];
    choice.tool_calls.push_back(
        {static_cast<int>(i), std::move(call.id), std::move(call.name), std::move(call.arguments)});
  }
  choice.finish_reason = parser.finish_reason(choice.finish_reason);
}

}  // namespace moeserve::serve
