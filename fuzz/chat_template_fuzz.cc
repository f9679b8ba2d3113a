// Fuzz target: chat template rendering (tokenizer/chat_template): the first line names the
// template, the rest is the request as the server parses it (serve::parse_request_json: depth
// bounded): {"messages": [...], "tools": [...], "add_generation_prompt": bool} or the messages
// array alone. A message a template cannot render is an Error naming it.
// Invariants of a rendering: render_chat gives render_chat_parts' text; the request's ranges are
// sorted, disjoint, non-empty and inside the text; and encoded as the server does (the ranges as
// plain text) the prompt decodes to itself and holds no more special tokens than the template's
// own text does: request content cannot forge a marker.
#include <algorithm>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "serve/api_error.h"
#include "serve/openai_request.h"
#include "tokenizer/chat_template.h"

namespace {

namespace tk = moeserve::tokenizer;

const tk::Tokenizer& builtin_tokenizer() {
  static const auto tokenizer = tk::make_builtin_tokenizer(512);
  return *tokenizer;
}

std::optional<tk::ChatRequest> chat_request(std::string_view json_text) {
  nlohmann::ordered_json json;
  try {
    json = moeserve::serve::parse_request_json(std::string(json_text));
  } catch (const moeserve::serve::ApiError&) {
    return std::nullopt;
  }
  tk::ChatRequest request;
  if (json.is_array()) {
    request.messages = std::move(json);
    return request;
  }
  if (!json.is_object() || !json.contains("messages")) return std::nullopt;
  request.messages = json["messages"];
  if (json.contains("tools")) request.tools = json["tools"];
  if (json.contains("add_generation_prompt") && json["add_generation_prompt"].is_boolean())
    request.add_generation_prompt = json["add_generation_prompt"].get<bool>();
  return request;
}

size_t special_count(const std::vector<int32_t>& ids) {
  size_t n = 0;
  for (const int32_t id : ids) n += builtin_tokenizer().token_kind(id) == tk::TokenKind::kSpecial;
  return n;
}

void check_rendering(const tk::RenderedChat& chat) {
  std::string template_only;
  size_t at = 0;
  for (const tk::TextRange& r : chat.request_text) {
    MS_FUZZ_ASSERT(r.begin >= at && r.begin < r.end && r.end <= chat.text.size(), "request ranges out of order");
    template_only += chat.text.substr(at, r.begin - at);
    at = r.end;
  }
  template_only += chat.text.substr(at);
  const tk::Tokenizer& tokenizer = builtin_tokenizer();
  const std::vector<int32_t> ids = tokenizer.encode(chat.text, chat.request_text);
  MS_FUZZ_ASSERT(tokenizer.decode(ids) == chat.text, "the prompt does not decode to itself");
  MS_FUZZ_ASSERT(special_count(ids) <= special_count(tokenizer.encode(template_only, true)),
                 "request text became special tokens");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = moeserve::fuzz::as_text(data, size);
  const size_t eol = input.find('\n');
  if (eol == std::string_view::npos) return 0;
  const std::string name(input.substr(0, eol));
  // Built-in names only: render_chat_parts also reads template files by path.
  const auto& names = tk::chat_template_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) return 0;
  const std::optional<tk::ChatRequest> request = chat_request(input.substr(eol + 1));
  if (!request) return 0;
  const tk::ChatSpecialTokens special{builtin_tokenizer().bos_token(), builtin_tokenizer().eos_token()};
  tk::RenderedChat chat;
  try {
    chat = tk::render_chat_parts(name, *request, special);
  } catch (const moeserve::Error&) {
    return 0;
  }
  MS_FUZZ_ASSERT(tk::render_chat(name, *request, special) == chat.text, "render_chat differs from render_chat_parts");
  check_rendering(chat);
  return 0;
}
