// DeepSeek V3 (and R1, V3-0324): the format its chat template prints for assistant tool calls
// and the model emits (vLLM's deepseek_v3 and SGLang's deepseekv3 parsers):
//
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{json}\n```<｜tool▁call▁end｜>
//   ...<｜tool▁calls▁end｜>
//
// The header is "TYPE<｜tool▁sep｜>NAME\n" with TYPE "function"; the fence around the arguments
// is dropped (SectionedParser drops the closing "```").
#include "chatout/markers.h"
#include "chatout/sectioned_parser.h"

namespace moeserve::chatout {

namespace {

constexpr std::string_view kToolSep = "<｜tool▁sep｜>";

std::optional<CallHeader> parse_v3_header(std::string_view header) {
  const size_t sep = header.find(kToolSep);
  if (sep == std::string_view::npos || trim(header.substr(0, sep)) != "function") return std::nullopt;
  return CallHeader{std::string(trim(header.substr(sep + kToolSep.size()))), ""};
}

}  // namespace

SectionFormat deepseek_section_format() {
  SectionFormat format;
  format.section_begin = {"<｜tool▁calls▁begin｜>"};
  format.section_end = {"<｜tool▁calls▁end｜>"};
  format.call_begin = "<｜tool▁call▁begin｜>";
  format.call_end = "<｜tool▁call▁end｜>";
  return format;
}

std::unique_ptr<ToolCallParser> make_deepseek_v3_parser(ToolParserOptions options) {
  SectionFormat format = deepseek_section_format();
  format.args_begin = "```json";
  format.parse_header = parse_v3_header;
  return make_sectioned_parser(std::move(format), std::move(options));
}

}  // namespace moeserve::chatout
