// The channel between the engine thread and the HTTP thread of one request: the engine
// pushes output events, the HTTP thread waits for them and writes them out; the HTTP thread
// cancels when its client is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/logprobs.h"

namespace moeserve::serve {

struct OutputEvent {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<runtime::TokenLogprob> logprobs;  // one per token when asked for
  std::vector<int64_t> text_offsets;            // one per token: where its text starts in the output
  std::string finish_reason;                    // set on the last event: "stop", "length"
  std::string stop_string;                      // the last event's stop_reason: a stop string,
  int32_t stop_token = -1;                      // or a client's stop token id (-1: none)
  // Prompt tokens 1.. (the first has no logprob), when prompt logprobs were asked for: they
  // come in events of their own, before the first token's.
  std::vector<runtime::TokenLogprob> prompt_logprobs;
  int error_status = 0;  // set on a failure (the last event): 500, 503
  std::string error;
  // Usage, on the last event.
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // Speculative decoding, on the last event: steps that verified drafts for the request, and
  // the drafts accepted in them.
  int64_t spec_verify_ct = 0, spec_accepted_tokens = 0;
  bool last() const { return !finish_reason.empty() || error_status != 0; }
};

class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Engine side.
  void push(OutputEvent event);

  // HTTP side: waits up to `timeout` for events and moves them into `out`; false if none came.
  bool wait(std::vector<OutputEvent>& out, std::chrono::milliseconds timeout);

 private:
  uint64_t id_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<OutputEvent> events_;
};

}  // namespace moeserve::serve
