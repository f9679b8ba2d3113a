// The reasoning parsers on the models' real output. Sources:
//   deepseek_r1  deepseek-ai/DeepSeek-R1 tokenizer_config.json: the template ends the generation
//                prompt with "<｜Assistant｜><think>\n", so the output starts inside the reasoning
//                and closes it with "</think>"; vLLM tests/reasoning/test_deepseekr1_reasoning_parser.py
//   kimi_k2      moonshotai/Kimi-K2-Thinking: "<think>...</think>" then the answer; vLLM's kimi_k2
//                reasoning parser (R1's with thinking on) and PR #32216: the model may open
//                <|tool_calls_section_begin|> without "</think>", which must end the reasoning
#include <gtest/gtest.h>

#include "parse_helpers.h"

namespace moeserve::chatout {
namespace {

ChatOutputOptions reasoning_only(const std::string& name) {
  ChatOutputOptions options;
  options.reasoning_parser = name;
  return options;
}

TEST(DeepSeekR1Reasoning, PromptOpenedThinkEndsAtClose) {
  const Parsed p = parse_every_way(reasoning_only("deepseek_r1"), "Let me think: 2+2.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(p.message.reasoning, "Let me think: 2+2.\n");
  EXPECT_EQ(p.message.content, "\n\nThe answer is 4.");
}

TEST(DeepSeekR1Reasoning, TheModelsOwnThinkIsDropped) {
  const Parsed p = parse_every_way(reasoning_only("deepseek_r1"), "<think>hmm</think>yes");
  EXPECT_EQ(p.message.reasoning, "hmm");
  EXPECT_EQ(p.message.content, "yes");
}

TEST(DeepSeekR1Reasoning, NeverClosedIsAllReasoning) {
  const Parsed p = parse_every_way(reasoning_only("deepseek_r1"), "still thinking about </thi", "length");
  EXPECT_EQ(p.message.reasoning, "still thinking about </thi");
  EXPECT_EQ(p.message.content, "");
  EXPECT_EQ(p.finish_reason, "length");
}

TEST(KimiK2Reasoning, ThinkThenAnswer) {
  const Parsed p = parse_every_way(reasoning_only("kimi_k2"), "<think>The user greets.</think>Hello!");
  EXPECT_EQ(p.message.reasoning, "The user greets.");
  EXPECT_EQ(p.message.content, "Hello!");
}

// vLLM PR #32216: no </think> before the tool-call section; the calls must not leak into the reasoning.
TEST(KimiK2Reasoning, MissingThinkCloseBeforeToolCallsEndsReasoning) {
  const std::string out =
      "<think>I should look up the weather.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|><|tool_calls_section_end|>";
  const Parsed p = parse_every_way(tools_options("kimi_k2", {"get_weather"}, "kimi_k2"), out);
  EXPECT_EQ(p.message.reasoning, "I should look up the weather.");
  EXPECT_EQ(p.message.content, "");
  ASSERT_EQ(p.message.tool_calls.size(), 1u);
  EXPECT_EQ(p.message.tool_calls[0].arguments, "{\"city\": \"Rome\"}");
  EXPECT_EQ(p.finish_reason, "tool_calls");
}

TEST(DeepSeekR1Reasoning, AV3ToolSectionAlsoEndsTheReasoning) {
  const std::string out =
      "plan<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const Parsed p = parse_every_way(tools_options("deepseek_v3", {}, "deepseek_r1"), out);
  EXPECT_EQ(p.message.reasoning, "plan");
  ASSERT_EQ(p.message.tool_calls.size(), 1u);
}

TEST(ReasoningParsers, UnknownNameIsAnError) { EXPECT_THROW(ChatOutputParser(reasoning_only("qwq")), std::exception); }

}  // namespace
}  // namespace moeserve::chatout
