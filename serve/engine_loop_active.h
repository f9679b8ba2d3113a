// Internal to serve/engine_loop*.cc: what the engine thread keeps of a request it runs.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "serve/engine_loop.h"

namespace moeserve::serve {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct EngineLoop::Active {
  Active(std::shared_ptr<RequestStream> s, EngineRequest r, const tokenizer::Tokenizer& tokenizer)
      : stream(std::move(s)), request(std::move(r)), output(tokenizer, request.limits) {}
  std::shared_ptr<RequestStream> stream;
  EngineRequest request;
  OutputProcessor output;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_token, last_token;
  bool admitted = false;
  int64_t spec_verify_ct = 0, spec_accepted_tokens = 0;
  std::vector<int32_t> generated;  // every token streamed (a re-plan carries the request on from them)
};

}  // namespace moeserve::serve
