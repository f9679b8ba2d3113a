// tool_choice required / named as a grammar: the kimi_k2 and qwen3 call formats (as those
// models emit them; see tool_call_grammar.h) are accepted for an allowed tool with arguments
// matching its parameters, and rejected at the first byte of a wrong tool name, of arguments
// that break the schema, or of a missing marker.
#include "grammar/tool_call_grammar.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/grammar/grammar_fixture.h"

namespace moeserve::grammar {
namespace {

using Json = nlohmann::json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters":
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters":
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}}}
])");

std::unique_ptr<TokenConstraint> tool_matcher(const std::string& format, const Json& choice) {
  return byte_engine().matcher(tool_call_grammar({format, kTools, choice}));
}

// Accepts the whole call and then ends on the stop id.
void expect_complete(TokenConstraint& m, const std::string& call) {
  EXPECT_EQ(feed(m, call), call.size()) << call;
  EXPECT_TRUE(m.accept(kEos)) << call;
  EXPECT_TRUE(m.terminated()) << call;
}

TEST(ToolCallGrammar, Qwen3RequiredAcceptsACallOfAnyToolAndRejectsOthers) {
  const Json required = "required";
  expect_complete(*tool_matcher("qwen3", required),
                  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  expect_complete(*tool_matcher("qwen3", required),
                  "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1, \"y\": 2}}\n</tool_call>");
  const std::string wrong_name = "<tool_call>\n{\"name\": \"get_time";
  EXPECT_EQ(feed(*tool_matcher("qwen3", required), wrong_name), wrong_name.size() - 4);  // "get_" then 't'
  const std::string bad_args = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": \"";
  EXPECT_EQ(feed(*tool_matcher("qwen3", required), bad_args), bad_args.size() - 1);
  EXPECT_EQ(feed(*tool_matcher("qwen3", required), "Sure, "), 0u);  // text instead of a call
}

TEST(ToolCallGrammar, NamedChoiceAllowsOnlyThatTool) {
  const Json named = {{"type", "function"}, {"function", {{"name", "add"}}}};
  expect_complete(*tool_matcher("qwen3", named),
                  "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 3, \"y\": 4}}\n</tool_call>");
  const std::string other = "<tool_call>\n{\"name\": \"g";
  EXPECT_EQ(feed(*tool_matcher("qwen3", named), other), other.size() - 1);
  EXPECT_THROW(tool_call_grammar({"qwen3", kTools, Json{{"type", "function"}, {"function", {{"name", "nope"}}}}}),
               Error);
}

TEST(ToolCallGrammar, KimiK2SectionWithOneCall) {
  const std::string call =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>";
  expect_complete(*tool_matcher("kimi_k2", "required"), call);
  const std::string unsectioned = "<|tool_call_begin|>";
  // A call outside the section: "<|tool_call" is a prefix of the section marker, '_' is not.
  EXPECT_EQ(feed(*tool_matcher("kimi_k2", "required"), unsectioned), 11u);
}

TEST(ToolCallGrammar, DeepSeekFormatsAsTheirParsersReadThem) {
  // chatout/deepseek_v3.cc and chatout/deepseek_v31.cc (the byte tokenizer spells the markers).
  expect_complete(*tool_matcher("deepseek_v3", "required"),
                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"x\": 1, \"y\": 2}"
                  "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  expect_complete(*tool_matcher("deepseek_v31", "required"),
                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}"
                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  const std::string bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"z";
  EXPECT_EQ(feed(*tool_matcher("deepseek_v3", "required"), bad), bad.size() - 1);
}

TEST(ToolCallGrammar, ArgumentsTakeBoundedWhitespaceAndNoControlCharacters) {
  // A small model fills unbounded whitespace until max_tokens (xgrammar's structural tags allow it).
  const std::string open = "<tool_call>\n{\"name\": \"add\", \"arguments\": {";
  EXPECT_EQ(feed(*tool_matcher("qwen3", "required"), open + "      "), open.size() + 4);
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}, "required": ["s"]}}}])");
  auto m = byte_engine().matcher(tool_call_grammar({"qwen3", tools, "required"}));
  const std::string s = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"a";
  EXPECT_EQ(feed(*m, s + "\x01"), s.size());
}

TEST(ToolCallGrammar, ChoicesThatConstrainNothingOrUnknownFormatsAreErrors) {
  EXPECT_THROW(tool_call_grammar({"qwen3", kTools, "auto"}), Error);
  EXPECT_THROW(tool_call_grammar({"mistral", kTools, "required"}), Error);
  EXPECT_THROW(tool_call_grammar({"qwen3", Json::array(), "required"}), Error);
}

}  // namespace
}  // namespace moeserve::grammar
