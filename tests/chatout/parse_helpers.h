// Runs a ChatOutputParser over a model output split into pieces in several ways (whole, byte
// by byte, in pieces of 3 and 7 bytes): streamed parsing must not depend on where the
// detokenizer happens to cut the text.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chatout/chat_output_parser.h"

namespace moeserve::chatout {

struct Parsed {
  ParsedMessage message;  // malformed calls dropped, as a non-streamed response has them
  std::vector<OutputDelta> deltas;
  std::string finish_reason;
};

inline Parsed parse_in_pieces(const ChatOutputOptions& options, const std::string& output, size_t piece,
                              const std::string& engine_reason = "stop") {
  ChatOutputParser parser(options);
  Parsed parsed;
  for (size_t i = 0; i < output.size(); i += piece) parsed.deltas.push_back(parser.feed(output.substr(i, piece)));
  parsed.deltas.push_back(parser.finish());
  for (const OutputDelta& d : parsed.deltas) parsed.message.append(d);
  parsed.message.drop_calls(parser.tools() ? parser.tools()->invalid_calls() : std::vector<int>{});
  parsed.finish_reason = parser.finish_reason(engine_reason);
  return parsed;
}

// The parse, checked to be the same however the output is cut (ids aside: they are random).
inline Parsed parse_every_way(const ChatOutputOptions& options, const std::string& output,
                              const std::string& engine_reason = "stop") {
  const Parsed whole = parse_in_pieces(options, output, output.size() + 1, engine_reason);
  for (size_t piece : {1, 3, 7}) {
    const Parsed cut = parse_in_pieces(options, output, piece, engine_reason);
    EXPECT_EQ(cut.message.content, whole.message.content) << "pieces of " << piece;
    EXPECT_EQ(cut.message.reasoning, whole.message.reasoning) << "pieces of " << piece;
    EXPECT_EQ(cut.finish_reason, whole.finish_reason) << "pieces of " << piece;
    EXPECT_EQ(cut.message.tool_calls.size(), whole.message.tool_calls.size()) << "pieces of " << piece;
    for (size_t i = 0; i < std::min(cut.message.tool_calls.size(), whole.message.tool_calls.size()); ++i) {
      EXPECT_EQ(cut.message.tool_calls[i].name, whole.message.tool_calls[i].name);
      EXPECT_EQ(cut.message.tool_calls[i].arguments, whole.message.tool_calls[i].arguments);
    }
  }
  return whole;
}

inline ChatOutputOptions tools_options(const std::string& parser, std::vector<std::string> names = {},
                                       const std::string& reasoning = "") {
  ChatOutputOptions options;
  options.tool_parser = parser;
  options.reasoning_parser = reasoning;
  options.tools.tool_names = std::move(names);
  return options;
}

}  // namespace moeserve::chatout
