// What one sglang.bench_serving backend sends and how its client reads the stream: the route,
// the request body, and per SSE event the text that counts as tokens arriving. Timed as
// sglang.bench_serving times it: a token "arrives" with an event whose text is not empty
// (the first such event is the TTFT; the gaps between them are the ITLs), so both clients
// measure the same thing on the same request.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/dataset.h"

namespace moeserve::bench {

enum class Protocol {
  kCompletions,  // sglang-oai, vllm, openai: POST /v1/completions
  kChat,         // sglang-oai-chat, vllm-chat: POST /v1/chat/completions
  kNative,       // sglang: SGLang's POST /generate (cumulative text, meta_info)
};

// The protocol of a --backend name; an Error naming --backend for one moeserve bench lacks.
Protocol protocol_of(const std::string& backend);
const char* route_of(Protocol protocol);

struct BodyOptions {
  std::string model;
  bool ignore_eos = true;
  bool token_ids = false;  // completions: return_token_ids (for --output-details)
  nlohmann::ordered_json extra_body = nlohmann::ordered_json::object();  // merged last, as sglang
};

// The streamed greedy request sglang.bench_serving's backend sends for `prompt`, plus usage
// in the stream (OpenAI routes) so that the output length is the server's count.
nlohmann::ordered_json request_body(Protocol protocol, const BodyOptions& options, const BenchPrompt& prompt);

// What one SSE data event carries.
struct StreamEvent {
  std::string text;                          // new text (the native route's cumulative text is differenced)
  bool tokens_arrived = false;               // sglang's test: the event's text is not empty
  int64_t new_tokens = 1;                    // native: tokens since the last counted event (its ITL split)
  std::optional<int64_t> completion_tokens;  // the server's count so far, when the event says
  std::optional<int64_t> prompt_tokens;
  std::vector<int32_t> ids;  // completions with token_ids
  std::string error;         // an error event's message
  int64_t spec_verify_ct = 0;
  double spec_accept_length = 0;
};

// Reads the stream of one request, event by event (the native route's state: the text and
// token count so far).
class StreamReader {
 public:
  explicit StreamReader(Protocol protocol) : protocol_(protocol) {}
  StreamEvent read(const nlohmann::ordered_json& event);

 private:
  void read_usage(const nlohmann::ordered_json& usage, StreamEvent& out) const;
  Protocol protocol_;
  size_t native_text_ = 0;
  int64_t native_tokens_ = 0;
};

}  // namespace moeserve::bench
