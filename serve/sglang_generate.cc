#include "serve/sglang_generate.h"

#include <map>
#include <set>

#include "serve/api_error.h"

namespace moeserve::serve {

namespace {

using Json = nlohmann::ordered_json;

// SGLang's defaults where they differ from OpenAI's.
constexpr int64_t kDefaultMaxNewTokens = 128;
constexpr double kDefaultTemperature = 1.0;

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw ApiError(400, field + ": " + why, field);
}

// One sampling parameter -> the completions body's field of the same meaning (OpenAI / vLLM
// names); refused when it is a constraint (not implemented here) or unknown.
void translate_param(const std::string& key, const Json& value, Json& out) {
  static const std::map<std::string, std::string> renamed = {
      {"max_new_tokens", "max_tokens"}, {"min_new_tokens", "min_tokens"}, {"sampling_seed", "seed"}};
  static const std::set<std::string> same = {"temperature",
                                             "top_p",
                                             "top_k",
                                             "min_p",
                                             "stop",
                                             "stop_token_ids",
                                             "ignore_eos",
                                             "skip_special_tokens",
                                             "frequency_penalty",
                                             "presence_penalty",
                                             "repetition_penalty",
                                             "n"};
  static const std::set<std::string> constraints = {"regex",          "json_schema",   "ebnf",
                                                    "structural_tag", "custom_params", "logit_bias"};
  const std::string field = "sampling_params." + key;
  if (constraints.count(key)) refuse(field, "not supported on /generate");
  if (auto it = renamed.find(key); it != renamed.end()) {
    out[it->second] = value;
  } else if (key == "top_k" && value.is_number_integer() && value.get<int64_t>() < 0) {
    return;  // SGLang's -1: no top-k
  } else if (same.count(key)) {
    out[key] = value;
  } else {
    refuse(field, "unknown sampling parameter");
  }
}

// sampling_params -> the completions body's fields, with SGLang's defaults.
void translate_sampling(const Json& sp, Json& out) {
  if (!sp.is_object()) refuse("sampling_params", "must be an object");
  for (const auto& [key, value] : sp.items())
    if (!value.is_null()) translate_param(key, value, out);
  if (!out.contains("max_tokens")) out["max_tokens"] = kDefaultMaxNewTokens;
  if (!out.contains("temperature")) out["temperature"] = kDefaultTemperature;
  if (out.contains("n") && !(out["n"].is_number_integer() && out["n"].get<int64_t>() == 1))
    refuse("sampling_params.n", "only 1 on /generate (send a list of prompts for a batch)");
}

// Top-level fields SGLang's clients send with their default values; anything else is refused.
void check_top_level(const Json& body) {
  static const std::set<std::string> handled = {"text", "input_ids", "sampling_params", "stream", "rid"};
  // Accepted when off: what they would turn on is not implemented here.
  static const std::set<std::string> off_only = {
      "return_logprob", "return_routed_experts",  "return_hidden_states", "lora_path", "image_data", "video_data",
      "audio_data",     "custom_logit_processor", "token_ids_logprob"};
  // Only meaningful with return_logprob, which is refused when on.
  static const std::set<std::string> with_logprob = {"logprob_start_len", "top_logprobs_num",
                                                     "return_text_in_logprobs"};
  for (const auto& [key, value] : body.items()) {
    if (handled.count(key) || with_logprob.count(key)) continue;
    if (off_only.count(key)) {
      if (!(value.is_null() || (value.is_boolean() && !value.get<bool>()))) refuse(key, "not supported on /generate");
      continue;
    }
    refuse(key, "unknown field of /generate");
  }
}

}  // namespace

SglangGenerateRequest parse_sglang_generate(const std::string& body, const ServedModel& model) {
  const Json json = parse_request_json(body);
  if (!json.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_top_level(json);
  const bool has_text = json.contains("text") && !json["text"].is_null();
  const bool has_ids = json.contains("input_ids") && !json["input_ids"].is_null();
  if (has_text == has_ids) refuse(has_text ? "input_ids" : "text", "give exactly one of text and input_ids");
  const Json& prompt = has_text ? json["text"] : json["input_ids"];
  SglangGenerateRequest out;
  out.batch = prompt.is_array() && (has_text || (!prompt.empty() && prompt[0].is_array()));
  Json completion = {{"model", model.name}, {"prompt", prompt}};
  translate_sampling(json.value("sampling_params", Json::object()), completion);
  if (json.contains("stream")) completion["stream"] = json["stream"];
  if (json.contains("rid") && json["rid"].is_string()) out.rid = json["rid"].get<std::string>();
  if (out.batch && completion.value("stream", false)) refuse("stream", "only for a single prompt");
  out.completion = parse_completion_request(completion.dump(), /*chat=*/false, model);
  return out;
}

void SglangOutput::append(const OutputEvent& event) {
  text += event.text;
  output_ids.insert(output_ids.end(), event.token_ids.begin(), event.token_ids.end());
  if (event.last()) {
    finish_reason = event.finish_reason;
    prompt_tokens = event.prompt_tokens;
    cached_tokens = event.cached_tokens;
  }
}

Json SglangOutput::json(const std::string& id) const {
  Json finish = nullptr;
  if (finish_reason == "length")
    finish = {{"type", "length"}, {"length", static_cast<int64_t>(output_ids.size())}};
  else if (!finish_reason.empty())
    finish = {{"type", finish_reason}, {"matched", nullptr}};
  Json meta = {{"id", id},
               {"finish_reason", finish},
               {"prompt_tokens", prompt_tokens},
               {"completion_tokens", static_cast<int64_t>(output_ids.size())},
               {"cached_tokens", cached_tokens}};
  if (!finish_reason.empty()) meta["e2e_latency"] = e2e_latency_s;
  return {{"text", text}, {"output_ids", output_ids}, {"meta_info", meta}};
}

}  // namespace moeserve::serve
