#include "bench/protocol.h"

#include "core/error.h"

namespace moeserve::bench {

namespace {
using Json = nlohmann::ordered_json;

Json prompt_json(const BenchPrompt& prompt) { return prompt.ids.empty() ? Json(prompt.text) : Json(prompt.ids); }
}  // namespace

Protocol protocol_of(const std::string& backend) {
  if (backend == "sglang-oai" || backend == "vllm" || backend == "openai" || backend == "moeserve")
    return Protocol::kCompletions;
  if (backend == "sglang-oai-chat" || backend == "vllm-chat") return Protocol::kChat;
  if (backend == "sglang") return Protocol::kNative;
  fail(
      "--backend {}: moeserve bench speaks sglang-oai, vllm, openai (/v1/completions), sglang-oai-chat, "
      "vllm-chat (/v1/chat/completions) and sglang (/generate); run sglang.bench_serving itself for {}",
      backend, backend);
}

const char* route_of(Protocol protocol) {
  switch (protocol) {
    case Protocol::kChat:
      return "/v1/chat/completions";
    case Protocol::kNative:
      return "/generate";
    default:
      return "/v1/completions";
  }
}

Json request_body(Protocol protocol, const BodyOptions& options, const BenchPrompt& prompt) {
  Json body;
  if (protocol == Protocol::kNative) {
    body[prompt.ids.empty() ? "text" : "input_ids"] = prompt_json(prompt);
    body["sampling_params"] = {
        {"temperature", 0}, {"max_new_tokens", prompt.output_len}, {"ignore_eos", options.ignore_eos}};
    body["stream"] = true;
  } else {
    body["model"] = options.model;
    if (protocol == Protocol::kChat) {
      MS_CHECK(prompt.ids.empty(),
               "--backend sglang-oai-chat: chat messages are text (--dataset-name random or "
               "sharegpt, not random-ids)");
      body["messages"] = Json::array({{{"role", "user"}, {"content", prompt.text}}});
      body["max_completion_tokens"] = prompt.output_len;
    } else {
      body["prompt"] = prompt_json(prompt);
      body["best_of"] = 1;
      body["max_tokens"] = prompt.output_len;
    }
    body["stream"] = true;
    body["temperature"] = 0;
    body["ignore_eos"] = options.ignore_eos;
    body["stream_options"] = {{"include_usage", true}};
    if (options.token_ids && protocol == Protocol::kCompletions) body["return_token_ids"] = true;
  }
  for (const auto& [key, value] : options.extra_body.items()) body[key] = value;  // sglang's --extra-request-body
  return body;
}

void StreamReader::read_usage(const Json& usage, StreamEvent& out) const {
  if (!usage.is_object()) return;
  if (usage.contains("completion_tokens")) out.completion_tokens = usage["completion_tokens"].get<int64_t>();
  if (usage.contains("prompt_tokens")) out.prompt_tokens = usage["prompt_tokens"].get<int64_t>();
  out.spec_verify_ct = usage.value("spec_verify_ct", int64_t{0});
  out.spec_accept_length = usage.value("spec_accept_length", 0.0);
}

StreamEvent StreamReader::read(const Json& event) {
  StreamEvent out;
  if (event.contains("error")) {
    const Json& e = event["error"];
    out.error = e.is_object() ? e.value("message", e.dump()) : e.dump();
    return out;
  }
  if (protocol_ == Protocol::kNative) {
    // Every event carries the text and the token count so far (sglang's async_request_sglang_generate).
    const std::string text = event.value("text", std::string());
    const Json meta = event.value("meta_info", Json::object());
    read_usage(meta, out);
    const int64_t tokens = out.completion_tokens.value_or(native_tokens_);
    out.tokens_arrived = !text.empty() && tokens > native_tokens_;
    out.new_tokens = tokens - native_tokens_;
    if (text.size() > native_text_) out.text = text.substr(native_text_);
    native_text_ = std::max(native_text_, text.size());
    native_tokens_ = tokens;
    return out;
  }
  read_usage(event.value("usage", Json()), out);
  const Json choices = event.value("choices", Json::array());
  if (choices.empty()) return out;  // the usage-only last event
  const Json& choice = choices[0];
  if (protocol_ == Protocol::kChat) {
    const Json delta = choice.value("delta", Json::object());
    for (const char* key : {"reasoning_content", "content"})  // sglang counts thoughts as content
      if (delta.contains(key) && delta[key].is_string()) out.text += delta[key].get<std::string>();
  } else {
    out.text = choice.value("text", std::string());
    for (const Json& id : choice.value("token_ids", Json::array())) out.ids.push_back(id.get<int32_t>());
  }
  out.tokens_arrived = !out.text.empty();
  return out;
}

}  // namespace moeserve::bench
