// DeepSeek V3.1 (and V3.2): the V3 markers without the "function" type and the JSON fence, as
// its chat template prints them (vLLM's deepseek_v31 and SGLang's deepseekv31 parsers):
//
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
#include "chatout/markers.h"
#include "chatout/sectioned_parser.h"

namespace moeserve::chatout {

std::unique_ptr<ToolCallParser> make_deepseek_v31_parser(ToolParserOptions options) {
  SectionFormat format = deepseek_section_format();
  format.args_begin = "<｜tool▁sep｜>";
  format.parse_header = [](std::string_view header) -> std::optional<CallHeader> {
    return CallHeader{std::string(trim(header)), ""};
  };
  return make_sectioned_parser(std::move(format), std::move(options));
}

}  // namespace moeserve::chatout
