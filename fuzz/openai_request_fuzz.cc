// Fuzz target: /v1/completions and /v1/chat/completions bodies (serve/openai_request). Every
// input is parsed as both; the served model's template and the special-tokens flag vary with the
// input's length. A rejection is an ApiError with a 4xx status whose OpenAI error JSON renders;
// an accepted request has prompts of in-vocabulary ids, n and max_tokens within their limits,
// and prompt + max_tokens within the context and the KV room.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_input.h"
#include "serve/api_error.h"
#include "serve/openai_request.h"
#include "tokenizer/chat_template.h"

namespace {

using moeserve::serve::ServedModel;

const moeserve::tokenizer::Tokenizer& builtin_tokenizer() {
  static const auto tokenizer = moeserve::tokenizer::make_builtin_tokenizer(512);
  return *tokenizer;
}

ServedModel served_model(size_t variant) {
  const std::vector<std::string>& templates = moeserve::tokenizer::chat_template_names();
  ServedModel m;
  m.name = "synthetic:tiny";
  m.vocab_size = builtin_tokenizer().vocab_size();
  m.context_length = 256;
  m.max_request_tokens = variant % 2 ? 300 : 200;  // the KV room below or above the context
  m.eos_id = 257;
  m.end_of_turn_id = 258;
  m.chat_template = moeserve::tokenizer::load_chat_template(templates[variant % templates.size()]);
  m.special_tokens_in_content = variant % 2 == 1;
  m.tokenizer = &builtin_tokenizer();
  return m;
}

void check_accepted(const moeserve::serve::CompletionRequest& r, const ServedModel& m) {
  const moeserve::serve::GenerationParams& p = r.params;
  MS_FUZZ_ASSERT(!r.prompts.empty() && r.prompts.size() == r.prompt_texts.size(), "prompts and their texts differ");
  MS_FUZZ_ASSERT(p.n >= 1 && static_cast<int64_t>(r.prompts.size()) * p.n <= 64, "n or the choice count unbounded");
  // max_tokens 0 scores the prompt (vLLM): only with echo.
  MS_FUZZ_ASSERT(p.max_tokens >= 1 || (p.max_tokens == 0 && p.echo), "max_tokens below 1 accepted without echo");
  for (const auto& ids : r.prompts) {
    MS_FUZZ_ASSERT(!ids.empty(), "empty prompt accepted");
    for (const int32_t id : ids) MS_FUZZ_ASSERT(id >= 0 && id < m.vocab_size, "token id outside the vocabulary");
    const int64_t length = static_cast<int64_t>(ids.size());
    MS_FUZZ_ASSERT(
        length < m.context_length && p.max_tokens <= std::min(m.context_length, m.max_request_tokens) - length,
        "prompt + max_tokens beyond the context or the KV room");
  }
  for (const int32_t id : p.stop_token_ids) MS_FUZZ_ASSERT(id >= 0 && id < m.vocab_size, "stop token id outside");
  MS_FUZZ_ASSERT(p.top_logprobs >= -1 && p.top_logprobs <= 20, "top_logprobs outside [-1, 20]");
}

void check_rejection(const moeserve::serve::ApiError& e) {
  MS_FUZZ_ASSERT(e.status() >= 400 && e.status() < 500, "a request error answered " + std::to_string(e.status()));
  const auto body = nlohmann::json::parse(e.json());  // the error body must be JSON the client can read
  MS_FUZZ_ASSERT(body.at("error").at("message").is_string(), "error JSON without a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(moeserve::fuzz::as_text(data, size));
  const ServedModel model = served_model(size);
  for (const bool chat : {false, true}) {
    try {
      check_accepted(moeserve::serve::parse_completion_request(body, chat, model), model);
    } catch (const moeserve::serve::ApiError& e) {
      check_rejection(e);
    }
  }
  return 0;
}
