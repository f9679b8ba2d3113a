#include "serve/openai_response.h"

#include <fmt/format.h>

#include <cmath>
#include <random>

#include "serve/output_processor.h"
#include "tokenizer/detokenizer.h"

namespace moeserve::serve {

using Json = nlohmann::ordered_json;

void ChoiceOutput::append(const OutputEvent& event) {
  text += event.text;
  token_ids.insert(token_ids.end(), event.token_ids.begin(), event.token_ids.end());
  logprobs.insert(logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  text_offsets.insert(text_offsets.end(), event.text_offsets.begin(), event.text_offsets.end());
  prompt_logprobs.insert(prompt_logprobs.end(), event.prompt_logprobs.begin(), event.prompt_logprobs.end());
  if (!event.finish_reason.empty()) {
    finish_reason = event.finish_reason;
    stop_string = event.stop_string;
    stop_token = event.stop_token;
  }
}

std::string new_response_id(bool chat) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", rng(), static_cast<uint32_t>(rng()));
}

namespace {

// A token's text for logprobs (lossy: a partial UTF-8 character shows as U+FFFD).
std::string token_text(const ResponseContext& ctx, int32_t token) {
  const int32_t ids[1] = {token};
  return ctx.tokenizer->decode(ids);
}

// A token's bytes for logprobs; none for an id of the model's vocabulary the tokenizer has no
// token for (its padding).
Json token_bytes(const ResponseContext& ctx, int32_t token) {
  Json bytes = Json::array();
  if (!ctx.tokenizer->has_token(token)) return bytes;
  for (unsigned char c : ctx.tokenizer->token_bytes(token)) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json finish_reason_json(const std::string& reason) { return reason.empty() ? Json(nullptr) : Json(reason); }

// OpenAI's tool_calls: the first piece of a call has its id, type and name; later ones only
// more arguments.
Json tool_calls_json(const std::vector<chatout::ToolCallDelta>& calls, bool streamed) {
  Json list = Json::array();
  for (const chatout::ToolCallDelta& call : calls) {
    Json function = {{"arguments", call.arguments}};
    if (!call.name.empty()) function = {{"name", call.name}, {"arguments", call.arguments}};
    Json item = Json::object();
    if (streamed) item["index"] = call.index;
    if (!call.id.empty()) {
      item["id"] = call.id;
      item["type"] = "function";
    }
    item["function"] = std::move(function);
    list.push_back(std::move(item));
  }
  return list;
}

Json message_json(const ChoiceOutput& c) {
  Json message = {{"role", "assistant"}, {"content", c.text}};
  if (!c.parsed) return message;
  // As OpenAI answers a message that only calls tools: content null.
  if (c.text.empty() && !c.tool_calls.empty()) message["content"] = nullptr;
  message["reasoning_content"] = c.reasoning.empty() ? Json(nullptr) : Json(c.reasoning);
  if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c.tool_calls, false);
  return message;
}

Json stop_reason_json(const ChoiceOutput& c) {
  if (!c.stop_string.empty()) return c.stop_string;
  return c.stop_token >= 0 ? Json(c.stop_token) : Json(nullptr);
}

// vLLM's prompt_logprobs: null for the first token, then per token {id: {logprob, rank,
// decoded_token}} for the token itself and its alternatives.
Json prompt_logprobs_json(const ResponseContext& ctx, const ChoiceOutput& c) {
  Json out = Json::array({nullptr});
  for (const runtime::TokenLogprob& lp : c.prompt_logprobs) {
    Json entry = Json::object();
    for (size_t k = 0; k < lp.top.size(); ++k)
      entry[std::to_string(lp.top[k].first)] = {
          {"logprob", lp.top[k].second}, {"rank", k + 1}, {"decoded_token", token_text(ctx, lp.top[k].first)}};
    entry[std::to_string(lp.token)] = {
        {"logprob", lp.logprob}, {"rank", lp.rank}, {"decoded_token", token_text(ctx, lp.token)}};
    out.push_back(std::move(entry));
  }
  return out;
}

// Completions' echo with logprobs: the prompt's tokens first (the first without a logprob:
// NaN, written null), their offsets in characters, then the output's shifted past the prompt.
void prepend_echoed_prompt(const ResponseContext& ctx, const ChoiceOutput& c, const std::string& echo_text,
                           std::vector<runtime::TokenLogprob>& logprobs, std::vector<int64_t>& offsets) {
  const std::vector<int32_t>& prompt = *c.echo_prompt;
  tokenizer::IncrementalDetokenizer detokenizer(*ctx.tokenizer);
  int64_t chars = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    offsets.push_back(chars);
    chars += code_points(detokenizer.push(prompt[i]));
    runtime::TokenLogprob lp{prompt[i], std::nanf(""), {}};
    if (i > 0 && i - 1 < c.prompt_logprobs.size()) lp = c.prompt_logprobs[i - 1];
    logprobs.push_back(std::move(lp));
  }
  const int64_t shift = code_points(echo_text);
  logprobs.insert(logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  for (int64_t offset : c.text_offsets) offsets.push_back(shift + offset);
}

}  // namespace

Json logprobs_json(const ResponseContext& ctx, const std::vector<runtime::TokenLogprob>& logprobs,
                   const std::vector<int64_t>& text_offsets, bool requested) {
  if (!requested) return nullptr;
  if (ctx.chat) {
    Json content = Json::array();
    for (const runtime::TokenLogprob& lp : logprobs) {
      Json top = Json::array();
      for (const auto& [id, value] : lp.top)
        top.push_back({{"token", token_text(ctx, id)}, {"logprob", value}, {"bytes", token_bytes(ctx, id)}});
      content.push_back({{"token", token_text(ctx, lp.token)},
                         {"logprob", lp.logprob},
                         {"bytes", token_bytes(ctx, lp.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), values = Json::array(), tops = Json::array(), offsets = Json::array();
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const runtime::TokenLogprob& lp = logprobs[i];
    tokens.push_back(token_text(ctx, lp.token));
    const bool scored = !std::isnan(lp.logprob);  // an echoed prompt's first token is not
    values.push_back(scored ? Json(lp.logprob) : Json(nullptr));
    Json top = Json::object();
    for (const auto& [id, value] : lp.top) top[token_text(ctx, id)] = value;
    tops.push_back(scored ? top : Json(nullptr));
    offsets.push_back(i < text_offsets.size() ? text_offsets[i] : 0);
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json usage_json(const Usage& usage) {
  Json out = {{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
  // As SGLang's meta_info: verify steps, and the tokens each gave on average (accepted drafts
  // plus the target's own token), only for requests that speculated.
  if (usage.spec_verify_ct > 0) {
    out["spec_verify_ct"] = usage.spec_verify_ct;
    out["spec_accept_length"] = static_cast<double>(usage.spec_accepted_tokens + usage.spec_verify_ct) /
                                static_cast<double>(usage.spec_verify_ct);
  }
  return out;
}

std::string response_json(const ResponseContext& ctx, const std::vector<ChoiceOutput>& choices,
                          const std::vector<std::vector<int32_t>>& prompt_ids_per_choice, const Usage& usage,
                          const std::vector<std::string>& echo_texts) {
  Json out = {{"id", ctx.id},
              {"object", ctx.chat ? "chat.completion" : "text_completion"},
              {"created", ctx.created},
              {"model", ctx.model}};
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    Json choice = {{"index", i}};
    if (ctx.chat)
      choice["message"] = message_json(c);
    else
      choice["text"] = c.text;
    if (c.echo_prompt != nullptr) {
      std::vector<runtime::TokenLogprob> logprobs;
      std::vector<int64_t> offsets;
      prepend_echoed_prompt(ctx, c, echo_texts.at(i), logprobs, offsets);
      choice["logprobs"] = logprobs_json(ctx, logprobs, offsets, true);
    } else {
      choice["logprobs"] = logprobs_json(ctx, c.logprobs, c.text_offsets, c.logprobs_requested);
    }
    choice["finish_reason"] = finish_reason_json(c.finish_reason);
    choice["stop_reason"] = stop_reason_json(c);
    if (c.prompt_logprobs_requested) choice["prompt_logprobs"] = prompt_logprobs_json(ctx, c);
    if (ctx.return_token_ids) {
      choice["prompt_token_ids"] = prompt_ids_per_choice.at(i);
      choice["token_ids"] = c.token_ids;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string stream_chunk(const ResponseContext& ctx, int index, const ChoiceOutput& delta, bool first) {
  Json out = {{"id", ctx.id},
              {"object", ctx.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", ctx.created},
              {"model", ctx.model}};
  Json choice = {{"index", index}};
  if (ctx.chat) {
    Json d = Json::object();
    if (first) d["role"] = "assistant";
    if (!delta.text.empty() || first) d["content"] = delta.text;
    if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
    if (!delta.tool_calls.empty()) d["tool_calls"] = tool_calls_json(delta.tool_calls, true);
    choice["delta"] = d;
  } else {
    choice["text"] = delta.text;
  }
  choice["logprobs"] = logprobs_json(ctx, delta.logprobs, delta.text_offsets, delta.logprobs_requested);
  choice["finish_reason"] = finish_reason_json(delta.finish_reason);
  choice["stop_reason"] = stop_reason_json(delta);
  if (ctx.return_token_ids) choice["token_ids"] = delta.token_ids;
  out["choices"] = Json::array({choice});
  return "data: " + out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

std::string stream_usage_chunk(const ResponseContext& ctx, const Usage& usage) {
  Json out = {{"id", ctx.id},
              {"object", ctx.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", ctx.created},
              {"model", ctx.model},
              {"choices", Json::array()},
              {"usage", usage_json(usage)}};
  return "data: " + out.dump() + "\n\n";
}

std::string stream_error_event(const std::string& error_json) { return "data: " + error_json + "\n\n"; }

}  // namespace moeserve::serve
