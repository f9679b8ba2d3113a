#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/json_file.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer {
namespace {

// Tests run from the repository root (see tests/CMakeLists.txt).
std::string template_text(const std::string& name) {
  return read_text_file("tokenizer/chat_templates/" + name + ".jinja");
}

TEST(ChatTemplate, BuiltinTemplatesAreTheShippedFiles) {
  ASSERT_EQ(chat_template_names(), (std::vector<std::string>{"kimi-k2", "kimi-k2-thinking", "deepseek-v3"}));
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  for (const std::string& name : chat_template_names()) {
    // The compiled-in text renders as the file does (loaded by path).
    EXPECT_EQ(render_chat(name, request), render_chat("tokenizer/chat_templates/" + name + ".jinja", request)) << name;
    EXPECT_EQ(load_chat_template(name), load_chat_template(name)) << "parsed once: " << name;
  }
}

TEST(ChatTemplate, UnknownNamesAreErrors) {
  try {
    load_chat_template("chatml");
    FAIL();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("unknown chat template \"chatml\" (known: kimi-k2, kimi-k2-thinking, deepseek-v3", 0), 0u)
        << message;
  }
}

TEST(ChatTemplate, AnyTemplateTextRenders) {
  // A one-character revision of a known template is just another template.
  std::string text = template_text("deepseek-v3");
  const size_t user = text.find("<｜User｜>");
  ASSERT_NE(user, std::string::npos);
  text.replace(user, std::string("<｜User｜>").size(), "<|user|>");
  const ChatTemplate revised(text, "m/tokenizer_config.json: chat_template");
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(revised.render(request, {"[BOS]", "[EOS]"}).text, "[BOS]<|user|>hi<｜Assistant｜>");
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

std::string marked(const RenderedChat& rendered) {
  std::string out;
  for (const TextRange& r : rendered.request_text) {
    out += '[';
    out.append(rendered.text, r.begin, r.end - r.begin);
    out += ']';
  }
  return out;
}

TEST(ChatTemplate, RenderedPartsMarkWhatTheRequestWrote) {
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi<|im_end|>"}])");
  for (const char* name : {"kimi-k2", "kimi-k2-thinking", "deepseek-v3"}) {
    const RenderedChat rendered = render_chat_parts(name, request, {"[BOS]", "[EOS]"});
    EXPECT_EQ(rendered.text, render_chat(name, request, {"[BOS]", "[EOS]"})) << name;
    // kimi-k2-thinking prints the role from the message (`message.get('name') or message['role']`).
    EXPECT_EQ(marked(rendered), std::string(name) == "kimi-k2-thinking" ? "[user][hi<|im_end|>]" : "[hi<|im_end|>]")
        << name;
  }
}

TEST(ChatTemplate, DerivedStringsKeepTheirProvenance) {
  // Slices, strips, splits, concatenations, macros, block sets and tojson of request data stay
  // request text; literals of the template do not.
  const ChatTemplate t(
      "{% macro wrap(x) %}<{{ x }}>{% endmacro %}"
      "{% for m in messages %}{% set c = m.content %}"
      "{{ c.strip()[:3] ~ '|' ~ c.split('/')[-1] | trim }}{{ wrap('T' + c[1:2]) }}"
      "{% set block %}B{{ m.role | upper }}{% endset %}{{ block }}{% endfor %}"
      "{{ tools | tojson }}{{ 'lit' }}",
      "t");
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "  abcd / efg "}])");
  request.tools = nlohmann::ordered_json::parse(R"([{"a": 1}])");
  const RenderedChat r = t.render(request);
  EXPECT_EQ(r.text, "abc|efg<T >BUSER[{\"a\": 1}]lit");
  EXPECT_EQ(marked(r), "[abc][efg][ ][USER[{\"a\": 1}]]");
}

TEST(ChatTemplate, KwargsContinueFinalMessageAndReasoningAliases) {
  const ChatTemplate t(
      "{% for m in messages %}{{ m.role }}:{{ m.thinking }}/{{ m.reasoning_content }}:{{ m.content }};{% endfor %}"
      "{% if thinking %}T{% endif %}{% if add_generation_prompt %}>{% endif %}",
      "t");
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "q"}, {"role": "assistant", "reasoning": "r", "content": "partial "}])");
  request.template_kwargs = {{"thinking", true}};
  EXPECT_EQ(t.render(request).text, "user:/:q;assistant:r/r:partial ;T>");
  request.add_generation_prompt = false;
  request.continue_final_message = true;
  EXPECT_EQ(t.render(request).text, "user:/:q;assistant:r/r:partial ");
  request.template_kwargs = {{"messages", 1}};
  EXPECT_THROW(t.render(request), Error);
}

TEST(ChatTemplate, BadMessagesNameTheMessageOrTheTemplateLine) {
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "a"}, {"content": "b"}])");
  try {
    render_chat("deepseek-v3", request);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "messages[1] must be an object with a string \"role\"");
  }
  // As jinja2: `'<｜User｜>' + message['content']` with no content fails on that line.
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user"}])");
  try {
    render_chat("deepseek-v3", request);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("chat template deepseek-v3:3: ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no attribute 'content'"), std::string::npos) << e.what();
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
