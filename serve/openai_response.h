// OpenAI wire format of completion results: whole responses, SSE chunks, logprobs, usage.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chatout/deltas.h"
#include "serve/request_stream.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::serve {

// What a response is about: one per HTTP request.
struct ResponseContext {
  bool chat = false;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  bool return_token_ids = false;
  const tokenizer::Tokenizer* tokenizer = nullptr;
};

// Everything one choice produced (a non-streaming response accumulates its events here).
struct ChoiceOutput {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<runtime::TokenLogprob> logprobs;
  std::vector<int64_t> text_offsets;
  std::string finish_reason;
  std::string stop_string;  // stop_reason: the stop string, or the client's stop token id
  int32_t stop_token = -1;
  std::vector<runtime::TokenLogprob> prompt_logprobs;  // prompt tokens 1..
  bool logprobs_requested = false;
  // Chat output parsing (serve/chat_output.h): `text` is then the content, and the message
  // also has reasoning_content and tool_calls (streamed: this chunk's pieces; whole: one per call).
  bool parsed = false;
  std::string reasoning;
  std::vector<chatout::ToolCallDelta> tool_calls;
  bool prompt_logprobs_requested = false;  // vLLM's prompt_logprobs field
  // Completions' echo with logprobs: the prompt's tokens lead the logprobs (the first's null).
  const std::vector<int32_t>* echo_prompt = nullptr;
  void append(const OutputEvent& event);
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int64_t spec_verify_ct = 0, spec_accepted_tokens = 0;  // speculative decoding (OutputEvent's)
};

std::string new_response_id(bool chat);

// The logprobs object of a choice (completions or chat shape), or null when not requested.
nlohmann::ordered_json logprobs_json(const ResponseContext& ctx, const std::vector<runtime::TokenLogprob>& logprobs,
                                     const std::vector<int64_t>& text_offsets, bool requested);
nlohmann::ordered_json usage_json(const Usage& usage);

// The whole (non-streaming) response body; echo_texts: per choice, its echoed prompt text
// (read for choices with echo_prompt).
std::string response_json(const ResponseContext& ctx, const std::vector<ChoiceOutput>& choices,
                          const std::vector<std::vector<int32_t>>& prompt_ids_per_choice, const Usage& usage,
                          const std::vector<std::string>& echo_texts = {});

// One SSE event "data: {...}\n\n" carrying a choice's delta. `first` (chat) adds the
// assistant role.
std::string stream_chunk(const ResponseContext& ctx, int index, const ChoiceOutput& delta, bool first);
// The final usage event (choices empty), and the terminator.
std::string stream_usage_chunk(const ResponseContext& ctx, const Usage& usage);
std::string stream_error_event(const std::string& error_json);
inline constexpr const char* kStreamDone = "data: [DONE]\n\n";

}  // namespace moeserve::serve
