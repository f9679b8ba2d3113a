// SGLang's native /generate request and response shapes, over the OpenAI completions parser
// (so that both routes validate alike): a request becomes a completions body, its output
// SGLang's {"text", "output_ids", "meta_info"} (one object per prompt; a list for a batch).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "serve/openai_request.h"
#include "serve/request_stream.h"

namespace moeserve::serve {

struct SglangGenerateRequest {
  CompletionRequest completion;
  bool batch = false;  // text / input_ids was a list of prompts: the answer is a list
  std::string rid;     // the client's request id ("" : one is made)
};

// Throws ApiError 400 naming the field: an unknown one, or one that would change the output
// and is not implemented here (regex / json_schema constraints, LoRA, images, logprobs).
SglangGenerateRequest parse_sglang_generate(const std::string& body, const ServedModel& model);

// One prompt's output so far, as SGLang streams and answers it.
struct SglangOutput {
  std::string text;
  std::vector<int32_t> output_ids;
  std::string finish_reason;  // "" while running; "stop" or "length"
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double e2e_latency_s = 0;

  void append(const OutputEvent& event);
  nlohmann::ordered_json json(const std::string& id) const;
};

}  // namespace moeserve::serve
