// Parsing and validation of /v1/completions and /v1/chat/completions bodies into what the
// engine runs. Every problem is an ApiError (400 unless said otherwise) naming the parameter:
// malformed JSON, wrong types, out-of-range values, unknown model (404), empty prompt or
// messages, token ids outside the vocabulary, prompts longer than the context.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar_engine.h"
#include "ops/ops.h"
#include "serve/tool_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::serve {

// What the server knows about the model it serves.
struct ServedModel {
  std::string name;  // the "model" clients must send
  int64_t vocab_size = 0;
  int64_t context_length = 0;      // prompt + generated tokens
  int64_t max_request_tokens = 0;  // what one request can hold in a KV cache replica
  std::optional<int32_t> eos_id;
  std::optional<int32_t> end_of_turn_id;  // "<|im_end|>": chat completions also stop there
  // Parsed once at start-up (null if the tokenizer has none).
  std::shared_ptr<const tokenizer::ChatTemplate> chat_template;
  // Special-token text in chat messages ("<|im_end|><|im_system|>" in a user's content) becomes
  // those tokens, as the template's own markers do. Off: it is plain text, so that a message
  // cannot forge a turn of another role (--allow-special-tokens-in-content).
  bool special_tokens_in_content = false;
  std::string tool_call_parser;  // --tool-call-parser ("": tool calls are not parsed)
  std::string reasoning_parser;  // --reasoning-parser ("": none)
  bool scripted_output = false;  // --test-scripted-output (tests only): moeserve_test_script is accepted
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::shared_ptr<grammar::GrammarEngine> grammar;  // structured output (null: refused)
  // The seed of a request that gives none (--random-seed); unset: a random one per request.
  std::function<uint64_t()> next_seed;
};

struct GenerationParams {
  int64_t max_tokens = 16;
  ops::SamplingOptions sampling;  // seed filled in (random when the client gave none)
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // EOS added unless ignore_eos
  bool skip_special_tokens = true;
  int top_logprobs = -1;  // -1: no logprobs; else the chosen token's plus this many alternatives
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_token_ids = false;
  bool echo = false;  // completions: the prompt text precedes the completion
  int n = 1;
  OutputParsing parsing;                        // chat: reasoning and tool calls (serve/tool_request.h)
  std::vector<int32_t> scripted_output;         // tests only: the tokens the model is made to emit
  std::optional<grammar::GrammarSpec> grammar;  // structured output (serve/response_format.h)
  // vLLM's sampling fields. logit_bias, the penalties and min_tokens (its mask: the stop
  // token ids, EOS included unless ignore_eos) change the logits on the devices.
  ops::LogitAdjustOptions logit_adjust;
  bool include_stop_str_in_output = false;
  // stop_token_ids[0, this) are the client's (a stop there is the choice's stop_reason); the
  // rest are EOS / end of turn, which end a choice with stop_reason null as in vLLM.
  size_t client_stop_token_ids = 0;
  // >= 0: vLLM's prompt_logprobs, every prompt token's logprob (the first has none) with this
  // many alternatives. Completions' echo with logprobs reports them too (prompt_alternatives()).
  int prompt_logprobs = -1;
  // The alternatives the engine computes per prompt token; -1: no prompt logprobs at all.
  int prompt_alternatives() const { return std::max(prompt_logprobs, echo ? top_logprobs : -1); }
};

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one per prompt
  std::vector<std::string> prompt_texts;      // the text of each (for echo)
  GenerationParams params;
};

// A request body as JSON, nested at most 64 levels deep. Throws ApiError (400) naming the
// problem: malformed JSON, too deep, a number beyond the double range.
nlohmann::ordered_json parse_request_json(const std::string& body);

// Parses a request body. `chat` selects the chat-completions schema. Throws ApiError.
CompletionRequest parse_completion_request(const std::string& body, bool chat, const ServedModel& model);

}  // namespace moeserve::serve
