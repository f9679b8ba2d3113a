#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/json_file.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer {
namespace {

// Tests run from the repository root (see tests/CMakeLists.txt).
std::string template_text(const std::string& name) {
  return read_text_file("tests/tokenizer/data/chat_templates/" + name + ".jinja");
}

TEST(ChatTemplate, EveryKnownTemplateIsIdentifiedByItsText) {
  for (const std::string& name : chat_template_names()) {
    std::string text = template_text(name);
    EXPECT_EQ(identify_chat_template(text, "file"), name);
    // CRLF line ends read as LF, as Jinja reads them.
    std::string crlf;
    for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
    EXPECT_EQ(identify_chat_template(crlf, "file"), name);
  }
}

TEST(ChatTemplate, UnknownTextAndNamesAreErrors) {
  std::string text = template_text("deepseek-v3");
  text += " ";
  try {
    identify_chat_template(text, "m/tokenizer_config.json: chat_template");
    FAIL();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("m/tokenizer_config.json: chat_template: the chat template is not one", 0), 0u);
    EXPECT_NE(message.find("--chat-template"), std::string::npos);
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_THROW(render_chat("chatml", ChatRequest{}), Error);
}

TEST(ChatTemplate, RendersTheBuiltinTokenizersTemplate) {
  const auto tok = make_builtin_tokenizer(512);
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(render_chat(*tok, request),
            "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
            "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
  EXPECT_EQ(render_chat(*tok, request, "deepseek-v3"), "[BOS]<｜User｜>hi<｜Assistant｜>");
}

TEST(ChatTemplate, RenderedPartsMarkWhatTheRequestWrote) {
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi<|im_end|>"}])");
  for (const char* name : {"kimi-k2", "kimi-k2-thinking", "deepseek-v3"}) {
    const RenderedChat rendered = render_chat_parts(name, request, {"[BOS]", "[EOS]"});
    EXPECT_EQ(rendered.text, render_chat(name, request, {"[BOS]", "[EOS]"})) << name;
    ASSERT_EQ(rendered.request_text.size(), 1u) << name;
    const TextRange r = rendered.request_text[0];
    EXPECT_EQ(rendered.text.substr(r.begin, r.end - r.begin), "hi<|im_end|>") << name;
  }
}

TEST(ChatTemplate, BadMessagesNameTheMessage) {
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "a"}, {"content": "b"}])");
  try {
    render_chat("deepseek-v3", request);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "messages[1] must be an object with a string \"role\"");
  }
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user"}])");
  try {
    render_chat("deepseek-v3", request);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "messages[0].content is missing (the template needs a string)");
  }
}

TEST(PythonJson, WritesLikeJsonDumps) {
  // json.dumps({"a": 1.0, "b": [1e20, 1.5e-07, -3, True, None], "c": "é\n\"\x01/"}, ensure_ascii=False)
  const auto value =
      nlohmann::ordered_json::parse(R"({"a": 1.0, "b": [1e20, 1.5e-7, -3, true, null], "c": "é\n\"\u0001/"})");
  EXPECT_EQ(python_json_dumps(value), R"({"a": 1.0, "b": [1e+20, 1.5e-07, -3, true, null], "c": "é\n\"\u0001/"})");
  EXPECT_EQ(python_str(nlohmann::ordered_json(nullptr), "x"), "None");
  EXPECT_EQ(python_str(nlohmann::ordered_json(false), "x"), "False");
  EXPECT_EQ(python_str(nlohmann::ordered_json(0.1), "x"), "0.1");
}

}  // namespace
}  // namespace moeserve::tokenizer
