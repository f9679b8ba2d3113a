// The OpenAI-compatible routes over an EngineLoop:
//   POST /v1/completions, POST /v1/chat/completions (SSE with "stream": true)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
//   POST /flush_cache (evicts the prefix cache's unused pages)
// With an API key, every route but /health needs "Authorization: Bearer KEY". Each request
// runs on its connection's thread: parse and tokenize, submit, then wait for the engine's
// events and write them out; a client that hangs up cancels its requests.
#pragma once

#include <string>

#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "serve/openai_request.h"

namespace moeserve::serve {

class ApiServer {
 public:
  ApiServer(EngineLoop& loop, ServedModel model, std::string api_key);

  void handle(const HttpRequest& request, HttpExchange& exchange);

 private:
  void completions(const HttpRequest& request, HttpExchange& exchange, bool chat);
  void models(const HttpRequest& request, HttpExchange& exchange);
  bool authorized(const HttpRequest& request) const;

  EngineLoop& loop_;
  ServedModel model_;
  std::string api_key_;
  int64_t created_;
};

}  // namespace moeserve::serve
