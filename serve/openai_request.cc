#include "serve/openai_request.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/response_format.h"
#include "tokenizer/chat_template.h"

namespace moeserve::serve {

namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxStopStrings = 16;
constexpr int kMaxTopLogprobs = 20;
constexpr int kMaxN = 16;
constexpr int kMaxChoices = 64;
constexpr size_t kMaxStopTokenIds = 256;
constexpr int kMaxJsonDepth = 64;  // far beyond any real request; bounds every recursive walk of it

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// Typed access to the body's optional fields; null counts as absent.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  const Json* get(const char* name) const {
    auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<double> number(const char* name, double lo, double hi) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(name, fmt::format("{}: expected a number, got {}", name, v->type_name()));
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) bad(name, fmt::format("{}: {} is outside [{}, {}]", name, x, lo, hi));
    return x;
  }

  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) bad(name, fmt::format("{}: expected an integer, got {}", name, describe(*v)));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(name, fmt::format("{}: {} is outside [{}, {}]", name, v->dump(), lo, hi));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) bad(name, fmt::format("{}: {} is outside [{}, {}]", name, x, lo, hi));
    return x;
  }

  std::optional<bool> boolean(const char* name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(name, fmt::format("{}: expected a boolean, got {}", name, v->type_name()));
    return v->get<bool>();
  }

  static std::string describe(const Json& v) {
    return v.is_number_float() ? "a non-integer number" : std::string(v.type_name());
  }

 private:
  const Json& body_;
};

std::vector<int32_t> token_ids(const Json& list, const std::string& where, const ServedModel& model) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& v = list[i];
    if (!v.is_number_integer())
      bad(where, fmt::format("{}[{}]: expected a token id (integer), got {}", where, i, Fields::describe(v)));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= model.vocab_size)
      bad(where, fmt::format("{}[{}]: token id {} is outside the vocabulary [0, {})", where, i, id, model.vocab_size));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<int32_t> encode(const std::string& text, const std::string& param, const ServedModel& model,
                            bool allow_special) {
  try {
    return model.tokenizer->encode(text, allow_special);
  } catch (const Error& e) {
    bad(param, fmt::format("{}: {}", param, e.what()));
  }
}

void parse_prompt(const Json& prompt, const ServedModel& model, CompletionRequest& out) {
  const char* kShapes =
      "prompt: expected a string, an array of strings, an array of token ids, or an array of "
      "arrays of token ids";
  auto add_text = [&](const Json& s, const std::string& where) {
    const std::string& text = s.get_ref<const std::string&>();
    if (text.empty()) bad("prompt", where + ": the prompt is empty");
    // As vLLM and SGLang (transformers' tokenizers): a raw prompt's special-token text is that
    // token. The caller writes the whole prompt, so there is no other role's turn to forge.
    out.prompts.push_back(encode(text, "prompt", model, /*allow_special=*/true));
    out.prompt_texts.push_back(text);
  };
  auto add_ids = [&](const Json& list, const std::string& where) {
    if (list.empty()) bad("prompt", where + ": the prompt is empty");
    out.prompts.push_back(token_ids(list, where, model));
    out.prompt_texts.push_back(model.tokenizer->decode(out.prompts.back()));
  };
  if (prompt.is_string()) return add_text(prompt, "prompt");
  if (!prompt.is_array()) bad("prompt", fmt::format("{}, got {}", kShapes, prompt.type_name()));
  if (prompt.empty()) bad("prompt", "prompt: the prompt is empty");
  if (prompt[0].is_number()) return add_ids(prompt, "prompt");
  for (size_t i = 0; i < prompt.size(); ++i) {
    const Json& p = prompt[i];
    const std::string where = fmt::format("prompt[{}]", i);
    if (p.is_string() && prompt[0].is_string())
      add_text(p, where);
    else if (p.is_array() && prompt[0].is_array())
      add_ids(p, where);
    else
      bad("prompt", fmt::format("{}; {} is {}", kShapes, where, p.type_name()));
  }
}

// Only text parts are rendered: an image (or any other part) would be dropped unseen.
void check_text_part(const Json& part, const std::string& where) {
  if (auto type = part.find("type"); type != part.end() && *type != "text")
    bad("messages", fmt::format("{}.type: '{}' parts are not supported (text only)", where, type->get<std::string>()));
}

// The fields a template prints must have OpenAI's types: Jinja would print a number or
// object as text where the client most likely sent something malformed.
void check_message_fields(const Json& m, const std::string& where) {
  for (const char* key : {"name", "tool_call_id", "reasoning_content"})
    if (auto v = m.find(key); v != m.end() && !v->is_null() && !v->is_string())
      bad("messages", fmt::format("{}.{}: expected a string, got {}", where, key, v->type_name()));
  if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null() && !calls->is_array())
    bad("messages", fmt::format("{}.tool_calls: expected an array, got {}", where, calls->type_name()));
  auto content = m.find("content");
  if (content == m.end() || content->is_null() || content->is_string()) return;
  if (!content->is_array())
    bad("messages",
        fmt::format("{}.content: expected a string or an array of parts, got {}", where, content->type_name()));
  for (size_t k = 0; k < content->size(); ++k) {
    const Json& part = (*content)[k];
    const std::string part_where = fmt::format("{}.content[{}]", where, k);
    if (!part.is_object()) bad("messages", fmt::format("{}: expected an object, got {}", part_where, part.type_name()));
    for (const char* key : {"type", "text"})
      if (auto v = part.find(key); v != part.end() && !v->is_string())
        bad("messages", fmt::format("{}.{}: expected a string, got {}", part_where, key, v->type_name()));
    check_text_part(part, part_where);
  }
}

void check_messages(const Json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad("messages", "messages: required");
  const Json& messages = *it;
  if (!messages.is_array()) bad("messages", fmt::format("messages: expected an array, got {}", messages.type_name()));
  if (messages.empty()) bad("messages", "messages: must contain at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad("messages", fmt::format("{}: expected an object, got {}", where, m.type_name()));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad("messages", where + ".role: required string");
    const std::string& r = role->get_ref<const std::string&>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      bad("messages", fmt::format("{}.role: '{}' is not one of system, user, assistant, tool, developer", where, r));
    check_message_fields(m, where);
  }
}

// The chat request's template inputs: messages, tools, chat_template_kwargs,
// add_generation_prompt and continue_final_message (vLLM's fields and defaults).
tokenizer::ChatRequest chat_request(const Json& body) {
  const Fields f(body);
  tokenizer::ChatRequest chat;
  chat.messages = body["messages"];
  // OpenAI's "developer" role is the system role of older models.
  for (auto& m : chat.messages)
    if (m["role"] == "developer") m["role"] = "system";
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) bad("tools", fmt::format("tools: expected an array, got {}", tools->type_name()));
    for (size_t i = 0; i < tools->size(); ++i)
      if (!(*tools)[i].is_object())
        bad("tools", fmt::format("tools[{}]: expected an object, got {}", i, (*tools)[i].type_name()));
    chat.tools = *tools;
  }
  if (const Json* kwargs = f.get("chat_template_kwargs")) {
    if (!kwargs->is_object())
      bad("chat_template_kwargs", fmt::format("chat_template_kwargs: expected an object, got {}", kwargs->type_name()));
    chat.template_kwargs = *kwargs;
  }
  chat.continue_final_message = f.boolean("continue_final_message").value_or(false);
  chat.add_generation_prompt = f.boolean("add_generation_prompt").value_or(!chat.continue_final_message);
  if (chat.continue_final_message && chat.add_generation_prompt)
    bad("continue_final_message", "continue_final_message: cannot be true with add_generation_prompt: true");
  return chat;
}

void parse_messages(const Json& body, const ServedModel& model, CompletionRequest& out) {
  check_messages(body);
  if (!model.chat_template)
    throw ApiError(400, "this model's tokenizer has no chat template; use /v1/completions", "messages");
  const tokenizer::ChatRequest chat = chat_request(body);
  tokenizer::RenderedChat rendered;
  try {
    rendered = model.chat_template->render(chat, {model.tokenizer->bos_token(), model.tokenizer->eos_token()});
    // The template's markers are special tokens; what the request wrote is plain text unless
    // the server allows otherwise.
    const std::span<const tokenizer::TextRange> plain =
        model.special_tokens_in_content ? std::span<const tokenizer::TextRange>() : rendered.request_text;
    out.prompts.push_back(model.tokenizer->encode(rendered.text, plain));
  } catch (const Error& e) {
    bad("messages", fmt::format("messages: {}", e.what()));
  }
  out.prompt_texts.push_back(std::move(rendered.text));
}

void reject_unsupported(const Fields& f) {
  if (auto best_of = f.integer("best_of", 1, kMaxN); best_of && *best_of != 1)
    bad("best_of", "best_of: not supported (only 1)");
  if (const Json* suffix = f.get("suffix"); suffix) bad("suffix", "suffix: not supported");
}

void parse_stop(const Fields& f, const ServedModel& model, GenerationParams& p) {
  if (const Json* stop = f.get("stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) bad("stop", fmt::format("stop: at most {} strings", kMaxStopStrings));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string())
          bad("stop", fmt::format("stop[{}]: expected a string, got {}", i, (*stop)[i].type_name()));
        p.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      bad("stop", fmt::format("stop: expected a string or an array of strings, got {}", stop->type_name()));
    }
    for (const auto& s : p.stop)
      if (s.empty()) bad("stop", "stop: stop strings must not be empty");
  }
  if (const Json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array())
      bad("stop_token_ids", fmt::format("stop_token_ids: expected an array of token ids, got {}", ids->type_name()));
    if (ids->size() > kMaxStopTokenIds)
      bad("stop_token_ids", fmt::format("stop_token_ids: at most {} token ids", kMaxStopTokenIds));
    p.stop_token_ids = token_ids(*ids, "stop_token_ids", model);
  }
}

// logit_bias: {"token id": bias in [-100, 100]}, as OpenAI and vLLM.
void parse_logit_bias(const Json& bias, const ServedModel& model, GenerationParams& p) {
  if (!bias.is_object())
    bad("logit_bias", fmt::format("logit_bias: expected an object of token id -> bias, got {}", bias.type_name()));
  for (const auto& [key, value] : bias.items()) {
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size()) bad("logit_bias", fmt::format("logit_bias: key '{}' is not a token id", key));
    if (id < 0 || id >= model.vocab_size)
      bad("logit_bias", fmt::format("logit_bias: token id {} is outside the vocabulary [0, {})", id, model.vocab_size));
    if (!value.is_number()) bad("logit_bias", fmt::format("logit_bias[{}]: expected a number", key));
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100)) bad("logit_bias", fmt::format("logit_bias[{}]: {} is outside [-100, 100]", key, b));
    if (b != 0) p.logit_adjust.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
}

// The fields that change the logits or the stop handling (vLLM's SamplingParams). Called once
// the stop token ids are known: min_tokens masks them.
void parse_sampling_fields(const Fields& f, const ServedModel& model, GenerationParams& p) {
  ops::LogitAdjustOptions& a = p.logit_adjust;
  a.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2, 2).value_or(0.0));
  a.presence_penalty = static_cast<float>(f.number("presence_penalty", -2, 2).value_or(0.0));
  a.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 0, 100).value_or(1.0));
  if (a.repetition_penalty <= 0) bad("repetition_penalty", "repetition_penalty: must be greater than 0");
  if (const Json* bias = f.get("logit_bias")) parse_logit_bias(*bias, model, p);
  a.min_tokens = f.integer("min_tokens", 0, INT64_MAX).value_or(0);
  if (a.min_tokens > 0) a.min_tokens_mask = p.stop_token_ids;
  p.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  if (auto n = f.integer("prompt_logprobs", 0, kMaxTopLogprobs)) p.prompt_logprobs = static_cast<int>(*n);
}

// Checks that need the whole request: lengths, echo, streaming.
void check_scoring_fields(const Fields& f, const CompletionRequest& out) {
  const GenerationParams& p = out.params;
  if (p.logit_adjust.min_tokens > p.max_tokens)
    bad("min_tokens",
        fmt::format("min_tokens: {} is more than max_tokens ({})", p.logit_adjust.min_tokens, p.max_tokens));
  if ((p.prompt_logprobs >= 0 || (p.echo && p.top_logprobs >= 0)) && p.stream)
    bad(p.prompt_logprobs >= 0 ? "prompt_logprobs" : "echo",
        "prompt logprobs (prompt_logprobs, or echo with logprobs) are not supported with stream: true");
}

// Fields of OpenAI's or vLLM's API that would change the output and that this server does not
// implement: refused by name rather than ignored. These are refused when present (lists
// unless empty).
void reject_ignored_presence(const Fields& f) {
  for (const char* field : {"truncate_prompt_tokens", "function_call", "prompt_embeds", "audio", "prediction"})
    if (f.get(field)) bad(field, fmt::format("{}: not supported", field));
  for (const char* list : {"allowed_token_ids", "bad_words", "logits_processors", "functions"})
    if (const Json* v = f.get(list); v && !(v->is_array() && v->empty()))
      bad(list, fmt::format("{}: not supported", list));
}

// The same for fields refused unless they hold their default.
void reject_ignored(const Fields& f, bool chat) {
  reject_ignored_presence(f);
  if (chat && f.boolean("echo").value_or(false)) bad("echo", "echo: not supported for chat completions");
  if (f.boolean("use_beam_search").value_or(false)) bad("use_beam_search", "use_beam_search: not supported");
  if (auto v = f.number("length_penalty", -1e9, 1e9); v && *v != 1.0)
    bad("length_penalty", "length_penalty: not supported (beam search only)");
  if (!f.boolean("spaces_between_special_tokens").value_or(true))
    bad("spaces_between_special_tokens", "spaces_between_special_tokens: only true is supported");
  if (f.boolean("return_tokens_as_token_ids").value_or(false))
    bad("return_tokens_as_token_ids", "return_tokens_as_token_ids: not supported (use return_token_ids)");
  const Json* m = f.get("modalities");
  if (m && !(m->is_array() && (m->empty() || (m->size() == 1 && (*m)[0] == "text"))))
    bad("modalities", "modalities: only [\"text\"] is supported");
}

Json parse_body_object(const std::string& body) {
  const Json json = parse_request_json(body);
  if (!json.is_object())
    throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", json.type_name()));
  return json;
}

// The "model" field, which must name the served model (404 otherwise, as OpenAI answers).
std::string requested_model(const Fields& f, const ServedModel& model) {
  const Json* name = f.get("model");
  if (!name) bad("model", "model: required");
  if (!name->is_string()) bad("model", fmt::format("model: expected a string, got {}", name->type_name()));
  std::string requested = name->get<std::string>();
  if (requested != model.name)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", requested, model.name),
                   "model", "model_not_found");
  return requested;
}

// Sampling, choices and streaming: the fields both endpoints share.
void parse_sampling(const Fields& f, GenerationParams& p) {
  p.sampling.temperature = static_cast<float>(f.number("temperature", 0, 2).value_or(1.0));
  p.sampling.top_p = static_cast<float>(f.number("top_p", 0, 1).value_or(1.0));
  if (p.sampling.top_p <= 0) bad("top_p", "top_p: must be greater than 0");
  const int64_t top_k = f.integer("top_k", -1, INT32_MAX).value_or(0);
  p.sampling.top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);
  p.sampling.min_p = static_cast<float>(f.number("min_p", 0, 1).value_or(0.0));
  if (auto seed = f.integer("seed", INT64_MIN, INT64_MAX))
    p.sampling.seed = static_cast<uint64_t>(*seed);
  else
    p.sampling.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  p.n = static_cast<int>(f.integer("n", 1, kMaxN).value_or(1));
  p.stream = f.boolean("stream").value_or(false);
  if (const Json* options = f.get("stream_options")) {
    if (!options->is_object())
      bad("stream_options", fmt::format("stream_options: expected an object, got {}", options->type_name()));
    if (!p.stream) bad("stream_options", "stream_options: only allowed with stream: true");
    p.include_usage = Fields(*options).boolean("include_usage").value_or(false);
  }
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  p.return_token_ids = f.boolean("return_token_ids").value_or(false);
}

// The generation length a client asked for, and the field it came in (for errors).
struct MaxTokens {
  std::optional<int64_t> tokens;  // none: the default applies
  const char* param = "max_tokens";
};

// The endpoint's own fields: logprobs, the length limit and the prompts (messages for chat,
// prompt otherwise). Returns max_tokens as asked.
MaxTokens parse_endpoint_fields(const Json& json, const Fields& f, const ServedModel& model, CompletionRequest& out) {
  GenerationParams& p = out.params;
  MaxTokens max_tokens;
  if (out.chat) {
    const bool logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) bad("top_logprobs", "top_logprobs: requires logprobs: true");
    p.top_logprobs = logprobs ? static_cast<int>(top.value_or(0)) : -1;
    max_tokens.tokens = f.integer("max_completion_tokens", 1, INT64_MAX);
    if (max_tokens.tokens)
      max_tokens.param = "max_completion_tokens";
    else
      max_tokens.tokens = f.integer("max_tokens", 1, INT64_MAX);
    parse_messages(json, model, out);
  } else {
    if (auto logprobs = f.integer("logprobs", 0, kMaxTopLogprobs)) p.top_logprobs = static_cast<int>(*logprobs);
    p.echo = f.boolean("echo").value_or(false);
    // 0 scores the prompt (echo with logprobs) without generating.
    max_tokens.tokens = f.integer("max_tokens", 0, INT64_MAX);
    if (max_tokens.tokens == 0 && !p.echo) bad("max_tokens", "max_tokens: 0 requires echo: true (prompt scoring)");
    const Json* prompt = f.get("prompt");
    if (!prompt) bad("prompt", "prompt: required");
    parse_prompt(*prompt, model, out);
  }
  return max_tokens;
}

// Lengths: every prompt plus max_tokens must fit the context and one KV cache replica. Sets
// params.max_tokens (the default: what is left for chat, at most 16 for completions).
void fit_lengths(const ServedModel& model, const MaxTokens& asked, CompletionRequest& out) {
  const char* prompt_param = out.chat ? "messages" : "prompt";
  const int64_t limit = std::min(model.context_length, model.max_request_tokens);
  int64_t longest = 0;
  for (const auto& ids : out.prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
  if (longest >= model.context_length)
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens",
                               model.context_length, longest),
                   prompt_param, "context_length_exceeded");
  if (longest >= model.max_request_tokens)
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens; one request can hold at most {} tokens in the KV cache "
                               "(raise --kv-pages)",
                               longest, model.max_request_tokens),
                   prompt_param, "context_length_exceeded");
  if (!asked.tokens) {
    out.params.max_tokens = out.chat ? limit - longest : std::min<int64_t>(16, limit - longest);
    return;
  }
  // Compared against what is left, never as longest + max_tokens: a max_tokens near INT64_MAX
  // would overflow that sum, pass the check and leave the engine a request it cannot hold.
  const int64_t max_tokens = *asked.tokens;
  if (max_tokens > limit - longest)
    throw ApiError(400,
                   fmt::format("{}: the prompt ({} tokens) plus {} ({}) is more than the {} tokens allowed ({})",
                               asked.param, longest, asked.param, max_tokens, limit,
                               limit == model.context_length ? "the model's context length"
                                                             : "what one request can hold in the KV cache"),
                   asked.param, "context_length_exceeded");
  out.params.max_tokens = max_tokens;
}

// Thrown by the parser callback: the body nests deeper than kMaxJsonDepth.
struct TooDeep {};

// "[json.exception.parse_error.101] parse error at ..." without the library's prefix.
std::string without_exception_id(const char* what) {
  const std::string text = what;
  const size_t close = text.find("] ");
  return text.rfind("[json.exception.", 0) == 0 && close != std::string::npos ? text.substr(close + 2) : text;
}

}  // namespace

Json parse_request_json(const std::string& body) {
  // The depth is bounded while parsing, so that no recursive copy, dump or renderer ever sees
  // a depth bomb (tens of thousands of "[" overflow the stack). The top-level key last seen
  // names the field at fault, which the parser's own errors do not.
  std::string field;
  auto bound = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw TooDeep{};
    if (event == Json::parse_event_t::key && depth == 1) field = parsed.get<std::string>();
    return true;
  };
  try {
    return Json::parse(body, bound);
  } catch (const TooDeep&) {
    throw ApiError(400,
                   fmt::format("{}JSON nested deeper than {} levels", field.empty() ? "" : field + ": ", kMaxJsonDepth),
                   field);
  } catch (const Json::out_of_range& e) {  // 406: a number beyond the double range
    throw ApiError(400,
                   fmt::format("{}a number is beyond the range of a double ({})", field.empty() ? "" : field + ": ",
                               without_exception_id(e.what())),
                   field);
  } catch (const Json::exception& e) {
    throw ApiError(400, fmt::format("malformed JSON body: {}", without_exception_id(e.what())));
  }
}

CompletionRequest parse_completion_request(const std::string& body, bool chat, const ServedModel& model) {
  const Json json = parse_body_object(body);
  const Fields f(json);
  CompletionRequest out;
  out.chat = chat;
  out.model = requested_model(f, model);
  reject_unsupported(f);
  reject_ignored(f, chat);
  GenerationParams& p = out.params;
  parse_sampling(f, p);
  if (model.next_seed && !f.get("seed")) p.sampling.seed = model.next_seed();  // --random-seed
  const bool ignore_eos = f.boolean("ignore_eos").value_or(false);
  parse_stop(f, model, p);
  p.client_stop_token_ids = p.stop_token_ids.size();
  if (!ignore_eos && model.eos_id) p.stop_token_ids.push_back(*model.eos_id);
  if (!ignore_eos && chat && model.end_of_turn_id) p.stop_token_ids.push_back(*model.end_of_turn_id);
  p.grammar = parse_response_format(json);
  if (p.grammar) check_grammar(model.grammar.get(), *p.grammar);
  parse_sampling_fields(f, model, p);
  const MaxTokens max_tokens = parse_endpoint_fields(json, f, model, out);
  if (chat) parse_output_parsing(json, model, p.parsing, p.grammar);
  // The parsers' markers are special tokens (Kimi's, DeepSeek's): they must reach the parser
  // (vLLM's tool parsers' adjust_request turns skip_special_tokens off the same way).
  if (p.parsing.enabled) p.skip_special_tokens = false;
  p.scripted_output = parse_scripted_output(json, model);
  if (static_cast<int64_t>(out.prompts.size()) * p.n > kMaxChoices)
    bad("n", fmt::format("n: {} prompts x n = {} choices, more than {}", out.prompts.size(), out.prompts.size() * p.n,
                         kMaxChoices));
  fit_lengths(model, max_tokens, out);
  check_scoring_fields(f, out);
  return out;
}

}  // namespace moeserve::serve
