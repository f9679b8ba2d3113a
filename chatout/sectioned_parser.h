// The engine of the formats that wrap tool calls in special-token markers (Kimi K2, DeepSeek
// V3, DeepSeek V3.1):
//
//   SECTION_BEGIN ( CALL_BEGIN header ARGS_BEGIN arguments CALL_END )* SECTION_END
//
// Only the header differs in shape (SectionFormat::parse_header). Arguments are streamed as they
// come, less a tail that could still be a marker or the closing fence / spaces before CALL_END.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chatout/tool_call_parser.h"

namespace moeserve::chatout {

struct CallHeader {
  std::string name;
  std::string id;  // "": a new "call_..." id
};

struct SectionFormat {
  std::vector<std::string> section_begin;  // any of them opens the section (variants the model emits)
  std::vector<std::string> section_end;
  std::string call_begin;
  std::string args_begin;  // ends the header
  std::string call_end;
  // The header (the text between CALL_BEGIN and ARGS_BEGIN); nullopt: malformed.
  std::function<std::optional<CallHeader>(std::string_view header)> parse_header;
};

std::unique_ptr<ToolCallParser> make_sectioned_parser(SectionFormat format, ToolParserOptions options);

// The markers DeepSeek V3 and V3.1 share (deepseek_v3.cc); each sets its header's shape.
SectionFormat deepseek_section_format();

}  // namespace moeserve::chatout
