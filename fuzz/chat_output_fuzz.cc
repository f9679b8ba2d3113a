// Fuzz target: the chat output parsers (chatout/): the first line names the tool-call parser and
// the reasoning parser ("kimi_k2 kimi_k2", "qwen3 -", "- deepseek_r1"), the second the piece
// length the output is fed in (1..64), the rest is the model output. Invariants: nothing throws
// or hangs; fed in pieces the output parses as it does whole (content, reasoning, each call's
// name and arguments, finish_reason); every call returned has arguments that are JSON.
#include <nlohmann/json.hpp>

#include "chatout/chat_output_parser.h"
#include "fuzz/fuzz_input.h"

namespace {

namespace co = moeserve::chatout;

struct Outcome {
  co::ParsedMessage message;
  std::string finish_reason;
};

Outcome parse(const co::ChatOutputOptions& options, std::string_view output, size_t piece) {
  co::ChatOutputParser parser(options);
  Outcome out;
  for (size_t i = 0; i < output.size(); i += piece) out.message.append(parser.feed(output.substr(i, piece)));
  out.message.append(parser.finish());
  if (parser.tools()) out.message.drop_calls(parser.tools()->invalid_calls());
  out.finish_reason = parser.finish_reason("stop");
  return out;
}

bool same(const Outcome& a, const Outcome& b) {
  if (a.message.content != b.message.content || a.message.reasoning != b.message.reasoning ||
      a.finish_reason != b.finish_reason || a.message.tool_calls.size() != b.message.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.message.tool_calls.size(); ++i)
    if (a.message.tool_calls[i].name != b.message.tool_calls[i].name ||
        a.message.tool_calls[i].arguments != b.message.tool_calls[i].arguments)
      return false;
  return true;
}

bool known(const std::string& name, const std::vector<std::string>& names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = moeserve::fuzz::as_text(data, size);
  const size_t line1 = input.find('\n');
  const size_t line2 = line1 == std::string_view::npos ? line1 : input.find('\n', line1 + 1);
  if (line2 == std::string_view::npos) return 0;
  const std::string_view names = input.substr(0, line1);
  const size_t space = names.find(' ');
  if (space == std::string_view::npos) return 0;
  co::ChatOutputOptions options;
  options.tool_parser = names.substr(0, space) == "-" ? "" : std::string(names.substr(0, space));
  options.reasoning_parser = names.substr(space + 1) == "-" ? "" : std::string(names.substr(space + 1));
  if ((!options.tool_parser.empty() && !known(options.tool_parser, co::tool_parser_names())) ||
      (!options.reasoning_parser.empty() && !known(options.reasoning_parser, co::reasoning_parser_names())))
    return 0;
  const size_t piece =
      1 + static_cast<size_t>(std::atoi(std::string(input.substr(line1 + 1, line2 - line1 - 1)).c_str()) & 63);
  const std::string_view output = input.substr(line2 + 1);
  const Outcome whole = parse(options, output, output.size() + 1);
  const Outcome cut = parse(options, output, piece);
  MS_FUZZ_ASSERT(same(whole, cut), "the output parses differently fed in pieces");
  for (const co::ToolCall& call : whole.message.tool_calls)
    MS_FUZZ_ASSERT(nlohmann::json::accept(call.arguments), "a returned call's arguments are not JSON");
  return 0;
}
