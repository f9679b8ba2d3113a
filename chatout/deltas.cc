#include "chatout/deltas.h"

namespace moeserve::chatout {

void OutputDelta::add_arguments(int index, const std::string& text) {
  if (text.empty()) return;
  if (!tool_calls.empty() && tool_calls.back().index == index)
    tool_calls.back().arguments += text;
  else
    tool_calls.push_back({index, "", "", text});
}

void OutputDelta::append(const OutputDelta& more) {
  content += more.content;
  reasoning += more.reasoning;
  for (const ToolCallDelta& piece : more.tool_calls) {
    if (piece.id.empty() && piece.name.empty())
      add_arguments(piece.index, piece.arguments);
    else
      tool_calls.push_back(piece);
  }
}

}  // namespace moeserve::chatout
