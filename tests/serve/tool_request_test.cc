// The chat request fields of tool calling and output parsing (serve/tool_request.h).
#include "serve/tool_request.h"

#include <gtest/gtest.h>

#include "grammar/grammar_engine.h"
#include "serve/api_error.h"
#include "serve/openai_request.h"
#include "tokenizer/chat_template.h"

namespace moeserve::serve {
namespace {

ServedModel served(const std::string& tool_parser, const std::string& reasoning_parser = "") {
  static const auto tok = tokenizer::make_builtin_tokenizer(512);
  ServedModel m;
  m.name = "synthetic:tiny";
  m.vocab_size = 512;
  m.context_length = 256;
  m.max_request_tokens = 200;
  m.chat_template = tokenizer::chat_template_for(*tok);
  m.tokenizer = tok.get();
  m.tool_call_parser = tool_parser;
  m.reasoning_parser = reasoning_parser;
  return m;
}

std::string chat_body(const std::string& extra) {
  return R"({"model":"synthetic:tiny","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",)"
         R"("function":{"name":"get_weather","parameters":{"type":"object"}}}])" +
         extra + "}";
}

ApiError error_of(const std::string& body, const ServedModel& model) {
  try {
    parse_completion_request(body, true, model);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(ToolRequest, ToolsWithAParserAreParsedAndKeepSpecialTokens) {
  const CompletionRequest r = parse_completion_request(chat_body(""), true, served("kimi_k2"));
  EXPECT_TRUE(r.params.parsing.enabled);
  EXPECT_EQ(r.params.parsing.options.tool_parser, "kimi_k2");
  EXPECT_EQ(r.params.parsing.options.tools.tool_names, std::vector<std::string>{"get_weather"});
  EXPECT_TRUE(r.params.parsing.parallel_tool_calls);
  EXPECT_FALSE(r.params.skip_special_tokens);  // the markers are special tokens
}

TEST(ToolRequest, ToolChoiceNoneParsesNoCalls) {
  const CompletionRequest r =
      parse_completion_request(chat_body(R"(,"tool_choice":"none")"), true, served("kimi_k2", "kimi_k2"));
  EXPECT_EQ(r.params.parsing.options.tool_parser, "");
  EXPECT_EQ(r.params.parsing.options.reasoning_parser, "kimi_k2");  // reasoning still separated
}

TEST(ToolRequest, NoToolsNoParserNoParsing) {
  const CompletionRequest r = parse_completion_request(
      R"({"model":"synthetic:tiny","messages":[{"role":"user","content":"hi"}]})", true, served("kimi_k2"));
  EXPECT_FALSE(r.params.parsing.enabled);
  EXPECT_TRUE(r.params.skip_special_tokens);
}

TEST(ToolRequest, ParallelToolCallsFalse) {
  const CompletionRequest r =
      parse_completion_request(chat_body(R"(,"parallel_tool_calls":false)"), true, served("qwen3"));
  EXPECT_FALSE(r.params.parsing.parallel_tool_calls);
  EXPECT_EQ(error_of(chat_body(R"(,"parallel_tool_calls":"no")"), served("qwen3")).param(), "parallel_tool_calls");
}

TEST(ToolRequest, ConstrainedChoicesSetTheCallGrammar) {
  static const auto tok = tokenizer::make_builtin_tokenizer(512);
  ServedModel model = served("kimi_k2");
  model.grammar = std::make_shared<grammar::GrammarEngine>(
      grammar::make_vocabulary(*tok, {.model_vocab_size = 512, .stop_ids = {257}}));
  for (const char* choice : {R"("required")", R"({"type":"function","function":{"name":"get_weather"}})"}) {
    const CompletionRequest r =
        parse_completion_request(chat_body(std::string(R"(,"tool_choice":)") + choice), true, model);
    ASSERT_TRUE(r.params.grammar) << choice;
    EXPECT_EQ(r.params.grammar->kind, grammar::GrammarKind::kToolCall);
    EXPECT_NE(r.params.grammar->text.find("functions.get_weather:0"), std::string::npos) << r.params.grammar->text;
    EXPECT_EQ(r.params.parsing.options.tool_parser, "kimi_k2");  // the call is parsed back
  }
  // Refused, naming tool_choice: an unknown function, no grammar engine, no parser, no tools,
  // with response_format, not a choice.
  const std::vector<std::pair<std::string, ServedModel>> refused = {
      {chat_body(R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})"), model},
      {chat_body(R"(,"tool_choice":"required")"), served("kimi_k2")},
      {chat_body(R"(,"tool_choice":"required")"),
       [&] {
         ServedModel m = model;
         m.tool_call_parser = "";
         return m;
       }()},
      {R"({"model":"synthetic:tiny","messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})", model},
      {chat_body(R"(,"tool_choice":"required","response_format":{"type":"json_object"})"), model},
      {chat_body(R"(,"tool_choice":"sometimes")"), model}};
  for (const auto& [body, m] : refused) {
    const ApiError e = error_of(body, m);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), "tool_choice") << body << ": " << e.what();
  }
}

TEST(ToolRequest, ExplicitAutoNeedsAParser) {
  const ApiError e = error_of(chat_body(R"(,"tool_choice":"auto")"), served(""));
  EXPECT_EQ(e.param(), "tool_choice");
  EXPECT_NE(std::string(e.what()).find("--tool-call-parser"), std::string::npos) << e.what();
}

TEST(ToolRequest, ScriptOnlyWithTheTestFlag) {
  const std::string body = chat_body(R"(,"moeserve_test_script":"<|tool_call_begin|>x")");
  EXPECT_EQ(error_of(body, served("kimi_k2")).param(), "moeserve_test_script");
  ServedModel testing = served("kimi_k2");
  testing.scripted_output = true;
  const CompletionRequest r = parse_completion_request(body, true, testing);
  EXPECT_EQ(r.params.scripted_output, (std::vector<int32_t>{266, 'x'}));  // the special token whole
}

}  // namespace
}  // namespace moeserve::serve
