// Parsing and validation of /v1/completions and /v1/chat/completions bodies into what the
// engine runs. Every problem is an ApiError (400 unless said otherwise) naming the parameter:
// malformed JSON, wrong types, out-of-range values, unknown model (404), empty prompt or
// messages, token ids outside the vocabulary, prompts longer than the context.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ops/ops.h"
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
  std::string chat_template;              // the template name ("" if the tokenizer has none)
  // Special-token text in chat messages ("<|im_end|><|im_system|>" in a user's content) becomes
  // those tokens, as the template's own markers do. Off: it is plain text, so that a message
  // cannot forge a turn of another role (--allow-special-tokens-in-content).
  bool special_tokens_in_content = false;
  const tokenizer::Tokenizer* tokenizer = nullptr;
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
