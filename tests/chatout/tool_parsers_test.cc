// The tool-call parsers on each model's real output format. Sources of the formats:
//   kimi_k2       moonshotai/Kimi-K2-Instruct chat_template.jinja (assistant tool_calls are printed
//                 as <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//                 <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>,
//                 and the model emits the same), vLLM tests/tool_parsers/test_kimi_k2_tool_parser.py,
//                 SGLang test/srt/test_function_call_parser.py (KimiK2Detector)
//   deepseek_v3   deepseek-ai/DeepSeek-V3 tokenizer_config.json chat_template ("<｜tool▁call▁begin｜>" +
//                 type + "<｜tool▁sep｜>" + name + "\n```json\n" + arguments + "\n```<｜tool▁call▁end｜>"),
//                 vLLM tests/tool_parsers/test_deepseekv3_tool_parser.py, SGLang DeepSeekV3Detector tests
//   deepseek_v31  deepseek-ai/DeepSeek-V3.1 chat template (NAME<｜tool▁sep｜>ARGS, no fence), vLLM
//                 tests/tool_use/test_deepseekv31_tool_parser.py
//   qwen3         Qwen/Qwen3-8B tokenizer_config.json chat_template (<tool_call>\n{"name": ..., "arguments":
//                 ...}\n</tool_call>), vLLM's hermes parser tests
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "parse_helpers.h"

namespace moeserve::chatout {
namespace {

const std::string kKimiBegin = "<|tool_calls_section_begin|>";
const std::string kKimiEnd = "<|tool_calls_section_end|>";

std::string kimi_call(const std::string& id, const std::string& args) {
  return "<|tool_call_begin|>" + id + "<|tool_call_argument_begin|>" + args + "<|tool_call_end|>";
}

std::string v3_call(const std::string& name, const std::string& args) {
  return "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args + "\n```<｜tool▁call▁end｜>";
}

std::string v31_call(const std::string& name, const std::string& args) {
  return "<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜>";
}

const std::string kV3Begin = "<｜tool▁calls▁begin｜>";
const std::string kV3End = "<｜tool▁calls▁end｜>";

TEST(KimiK2ToolParser, TwoCallsWithTheModelsIds) {
  const std::string out = "Let me check." + kKimiBegin + kimi_call("functions.get_weather:0", R"({"city": "Paris"})") +
                          kimi_call("functions.get_time:1", R"({"tz": "CET"})") + kKimiEnd;
  const Parsed p = parse_every_way(tools_options("kimi_k2", {"get_weather", "get_time"}), out);
  EXPECT_EQ(p.message.content, "Let me check.");
  ASSERT_EQ(p.message.tool_calls.size(), 2u);
  EXPECT_EQ(p.message.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(p.message.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.message.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(p.message.tool_calls[1].id, "functions.get_time:1");
  EXPECT_EQ(p.message.tool_calls[1].arguments, R"({"tz": "CET"})");
  EXPECT_EQ(p.finish_reason, "tool_calls");
}

TEST(KimiK2ToolParser, StreamsArgumentsAsDeltasWithIdAndNameFirst) {
  const std::string out = kKimiBegin + kimi_call("functions.f:0", R"({"a": "xyzxyzxyz"})") + kKimiEnd;
  const Parsed p = parse_in_pieces(tools_options("kimi_k2"), out, 4);
  std::vector<ToolCallDelta> pieces;
  for (const OutputDelta& d : p.deltas) pieces.insert(pieces.end(), d.tool_calls.begin(), d.tool_calls.end());
  ASSERT_GE(pieces.size(), 3u);  // the arguments arrive in several pieces
  EXPECT_EQ(pieces[0].id, "functions.f:0");
  EXPECT_EQ(pieces[0].name, "f");
  std::string args;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].index, 0);
    if (i > 0) {
      EXPECT_TRUE(pieces[i].id.empty() && pieces[i].name.empty());
    }
    args += pieces[i].arguments;
  }
  EXPECT_EQ(args, R"({"a": "xyzxyzxyz"})");
}

// SGLang #23363: in a later turn Kimi numbers its calls from where the conversation is
// (functions.f:7), and long arguments span many pieces; the calls keep index 0, 1 here.
TEST(KimiK2ToolParser, LaterTurnCallsWithLongArgumentsKeepTheirOwnIndex) {
  std::string long_text(6000, 'x');
  for (size_t i = 0; i < long_text.size(); i += 97) long_text[i] = ' ';
  const std::string args1 = nlohmann::json({{"path", "/tmp/a"}, {"content", long_text}}).dump();
  const std::string args2 = nlohmann::json({{"path", "/tmp/b"}, {"nested", {{"k", {1, 2, 3}}}}}).dump();
  const std::string out =
      kKimiBegin + kimi_call("functions.write:7", args1) + kimi_call("functions.write:8", args2) + kKimiEnd;
  const Parsed p = parse_every_way(tools_options("kimi_k2", {"write"}), out);
  ASSERT_EQ(p.message.tool_calls.size(), 2u);
  EXPECT_EQ(p.message.tool_calls[0].id, "functions.write:7");
  EXPECT_EQ(p.message.tool_calls[0].arguments, args1);
  EXPECT_EQ(p.message.tool_calls[1].arguments, args2);
  EXPECT_EQ(p.message.content, "");
}

TEST(KimiK2ToolParser, AcceptsTheSingularSectionVariant) {
  const std::string out =
      "<|tool_call_section_begin|>" + kimi_call("functions.f:0", "{}") + "<|tool_call_section_end|>done";
  const Parsed p = parse_every_way(tools_options("kimi_k2"), out);
  ASSERT_EQ(p.message.tool_calls.size(), 1u);
  EXPECT_EQ(p.message.content, "done");
}

TEST(KimiK2ToolParser, UnclosedSectionAtTheLengthLimitIsContent) {
  const std::string out = "ok " + kKimiBegin + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1";
  const Parsed p = parse_every_way(tools_options("kimi_k2"), out, "length");
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, "ok <|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1");
  EXPECT_EQ(p.finish_reason, "length");
}

TEST(KimiK2ToolParser, InvalidJsonArgumentsAreContentAndNotToolCalls) {
  const std::string bad = kimi_call("functions.f:1", "{\"a\": tru");
  const std::string out = kKimiBegin + kimi_call("functions.f:0", "{\"a\": 1}") + bad + kKimiEnd;
  const Parsed p = parse_every_way(tools_options("kimi_k2"), out);
  ASSERT_EQ(p.message.tool_calls.size(), 1u);  // the valid one stays
  EXPECT_EQ(p.message.tool_calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(p.message.content, bad);
  EXPECT_EQ(p.finish_reason, "stop");
}

TEST(KimiK2ToolParser, UnknownToolNameIsContent) {
  const std::string call = kimi_call("functions.rm_rf:0", "{}");
  const Parsed p = parse_every_way(tools_options("kimi_k2", {"get_weather"}), kKimiBegin + call + kKimiEnd);
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, call);
  EXPECT_EQ(p.finish_reason, "stop");
}

TEST(KimiK2ToolParser, MalformedHeaderIsContent) {
  const std::string call = kimi_call("get_weather", "{}");  // no ":IDX"
  const Parsed p = parse_every_way(tools_options("kimi_k2"), kKimiBegin + call + kKimiEnd);
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, call);
}

TEST(KimiK2ToolParser, TextWithoutCallsPassesThrough) {
  const std::string out = "a <|tool_calls_section is not a marker, nor is <|tool_call_begin|> outside a section";
  const Parsed p = parse_every_way(tools_options("kimi_k2"), out);
  EXPECT_EQ(p.message.content, out);
  EXPECT_EQ(p.finish_reason, "stop");
}

TEST(DeepSeekV3ToolParser, FencedCalls) {
  const std::string out = "Checking.\n" + kV3Begin + v3_call("get_weather", R"({"location": "Tokyo"})") + "\n" +
                          v3_call("get_time", "{}") + kV3End;
  const Parsed p = parse_every_way(tools_options("deepseek_v3", {"get_weather", "get_time"}), out);
  EXPECT_EQ(p.message.content, "Checking.\n");
  ASSERT_EQ(p.message.tool_calls.size(), 2u);
  EXPECT_EQ(p.message.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.message.tool_calls[0].arguments, R"({"location": "Tokyo"})");
  EXPECT_EQ(p.message.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(p.message.tool_calls[0].id.size(), 29u);
  EXPECT_NE(p.message.tool_calls[0].id, p.message.tool_calls[1].id);
  EXPECT_EQ(p.message.tool_calls[1].arguments, "{}");
  EXPECT_EQ(p.finish_reason, "tool_calls");
}

TEST(DeepSeekV3ToolParser, MultiLineArgumentsAndMissingSectionEnd) {
  const std::string args = "{\n  \"code\": \"print(1)\\nprint(2)\",\n  \"n\": [1, 2]\n}";
  const Parsed p = parse_every_way(tools_options("deepseek_v3"), kV3Begin + v3_call("run", args));
  ASSERT_EQ(p.message.tool_calls.size(), 1u);
  EXPECT_EQ(p.message.tool_calls[0].arguments, args);
  EXPECT_EQ(p.finish_reason, "tool_calls");
}

TEST(DeepSeekV3ToolParser, V31OutputIsNotAV3CallAndEndsAsContent) {
  const std::string call = v31_call("f", "{}");
  const Parsed p = parse_every_way(tools_options("deepseek_v3"), kV3Begin + call + kV3End);
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, call);
  EXPECT_EQ(p.finish_reason, "stop");
}

TEST(DeepSeekV31ToolParser, CallsWithoutFence) {
  const std::string out =
      "normal text" + kV3Begin + v31_call("foo", R"({"x":1})") + v31_call("bar", R"({"y":2})") + kV3End + " suffix";
  const Parsed p = parse_every_way(tools_options("deepseek_v31"), out);
  EXPECT_EQ(p.message.content, "normal text suffix");
  ASSERT_EQ(p.message.tool_calls.size(), 2u);
  EXPECT_EQ(p.message.tool_calls[0].name, "foo");
  EXPECT_EQ(p.message.tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(p.message.tool_calls[1].name, "bar");
  EXPECT_EQ(p.message.tool_calls[1].arguments, R"({"y":2})");
}

TEST(DeepSeekV31ToolParser, UnclosedCallIsContent) {
  const std::string out = kV3Begin + "<｜tool▁call▁begin｜>foo<｜tool▁sep｜>{\"x\":";
  const Parsed p = parse_every_way(tools_options("deepseek_v31"), out, "length");
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, "<｜tool▁call▁begin｜>foo<｜tool▁sep｜>{\"x\":");
  EXPECT_EQ(p.finish_reason, "length");
}

TEST(Qwen3ToolParser, CallsStreamedAndWhole) {
  const std::string out =
      "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const Parsed p = parse_every_way(tools_options("qwen3", {"get_weather", "get_time"}), out);
  EXPECT_EQ(p.message.content, "Sure.\n\n");
  ASSERT_EQ(p.message.tool_calls.size(), 2u);
  EXPECT_EQ(p.message.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.message.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(p.message.tool_calls[1].arguments, "{}");
  EXPECT_EQ(p.finish_reason, "tool_calls");
}

TEST(Qwen3ToolParser, ArgumentsBeforeNameAreParsedWhole) {
  const std::string out = "<tool_call>\n{\"arguments\": {\"q\": 1}, \"name\": \"search\"}\n</tool_call>";
  const Parsed p = parse_every_way(tools_options("qwen3"), out);
  ASSERT_EQ(p.message.tool_calls.size(), 1u);
  EXPECT_EQ(p.message.tool_calls[0].name, "search");
  EXPECT_EQ(p.message.tool_calls[0].arguments, "{\"q\":1}");
}

TEST(Qwen3ToolParser, InvalidJsonAndUnclosedCallsAreContent) {
  const std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  Parsed p = parse_every_way(tools_options("qwen3"), bad);
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, bad);
  EXPECT_EQ(p.finish_reason, "stop");
  const std::string unclosed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1";
  p = parse_every_way(tools_options("qwen3"), unclosed, "length");
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, unclosed);
  EXPECT_EQ(p.finish_reason, "length");
}

TEST(Qwen3ToolParser, ArgumentsFollowedByOtherKeysAreNotACall) {
  const std::string out = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"extra\": 2}</tool_call>";
  const Parsed p = parse_every_way(tools_options("qwen3"), out);
  EXPECT_TRUE(p.message.tool_calls.empty());
  EXPECT_EQ(p.message.content, out);
}

// Text between calls inside a section: content unless it is only spaces, however it is cut.
TEST(KimiK2ToolParser, TextBetweenCallsIsContentUnlessBlank) {
  const std::string out = kKimiBegin + kimi_call("functions.f:0", "{}") + "\n  \n" + kimi_call("functions.f:1", "{}") +
                          " and more " + kimi_call("functions.f:2", "{}") + "\n";
  const Parsed p = parse_every_way(tools_options("kimi_k2"), out);
  EXPECT_EQ(p.message.tool_calls.size(), 3u);
  EXPECT_EQ(p.message.content, " and more ");
}

TEST(ToolParsers, UnknownParserNameIsAnErrorListingTheKnownOnes) {
  try {
    ChatOutputParser parser(tools_options("hermes"));
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("kimi_k2, deepseek_v3, deepseek_v31, qwen3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::chatout
