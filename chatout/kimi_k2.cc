// Kimi K2 (Instruct, Thinking, K2.5/K2.6): the format of its chat template and of vLLM's and
// SGLang's kimi_k2 parsers:
//
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}
//   <|tool_call_end|>...<|tool_calls_section_end|>
//
// The id is "functions.NAME:IDX" as the model wrote it (vLLM and SGLang return it so, and the
// template prints tool_call_id back the same way). IDX counts calls across the conversation,
// so it is not the call's index in this response (SGLang #23363 dropped calls by mixing them).
// "<|tool_call_section_begin|>" is a variant the model is known to emit (vLLM accepts both).
#include <cctype>

#include "chatout/markers.h"
#include "chatout/sectioned_parser.h"

namespace moeserve::chatout {

namespace {

std::optional<CallHeader> parse_kimi_header(std::string_view header) {
  const std::string_view id = trim(header);
  const size_t colon = id.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == id.size()) return std::nullopt;
  for (char c : id.substr(colon + 1))
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  std::string_view name = id.substr(0, colon);
  if (name.rfind("functions.", 0) == 0) name.remove_prefix(std::string_view("functions.").size());
  return CallHeader{std::string(name), std::string(id)};
}

}  // namespace

std::unique_ptr<ToolCallParser> make_kimi_k2_parser(ToolParserOptions options) {
  SectionFormat format;
  format.section_begin = {"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"};
  format.section_end = {"<|tool_calls_section_end|>", "<|tool_call_section_end|>"};
  format.call_begin = "<|tool_call_begin|>";
  format.args_begin = "<|tool_call_argument_begin|>";
  format.call_end = "<|tool_call_end|>";
  format.parse_header = parse_kimi_header;
  return make_sectioned_parser(std::move(format), std::move(options));
}

}  // namespace moeserve::chatout
