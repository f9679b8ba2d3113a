// The OpenAI-compatible routes over an EngineLoop:
//   POST /v1/completions, POST /v1/chat/completions (SSE with "stream": true)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text: moeserve's series
//        and SGLang's, serve/sglang_metrics.h)
//   SGLang's and vLLM's own routes (/generate, /get_server_info, /tokenize, ...: native_routes.h)
//   POST /admin/flush_cache (also /flush_cache: evicts the prefix cache's unused pages)
//   POST /admin/replan {"plan": "ep2"}: live re-plan (EngineLoop::replan), when enabled
// With an API key, every route but /health needs "Authorization: Bearer KEY". The admin
// routes need the admin key instead ("Bearer ADMIN_KEY"), and without one they are refused
// (403): the HTTP layer does not tell who is calling, so "loopback only" cannot be checked,
// and an API user must never re-plan or flush the server. Each request runs on a handler
// thread of the HTTP layer (never an io thread): parse and tokenize, submit, then wait for the
// engine's events and write them out; a client that hangs up cancels its requests.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "serve/native_routes.h"
#include "serve/openai_request.h"

namespace moeserve::serve {

struct ApiKeys {
  std::string api;    // empty: the API routes are open
  std::string admin;  // empty: the admin routes are refused
};

class ApiServer {
 public:
  ApiServer(EngineLoop& loop, ServedModel model, ApiKeys keys);

  void handle(const HttpRequest& request, HttpExchange& exchange);

  // Enables POST /admin/replan. `prepare` validates a plan spec against the model and the
  // memory budget and returns how to build it; it throws (an Error naming the problem) for a
  // plan that is invalid or does not fit, which is answered 400 before anything stops.
  void enable_replan(std::function<ReplanTarget(const std::string& plan)> prepare);
  // Enables SGLang's and vLLM's own routes (serve/native_routes.h), reporting `info`.
  void enable_native_routes(ServerInfo info);

 private:
  void completions(const HttpRequest& request, HttpExchange& exchange, bool chat);
  void models(const HttpRequest& request, HttpExchange& exchange);
  // Throws the 401 / 403 for a request its route's key does not admit.
  void check_authorized(const HttpRequest& request) const;
  void replan(const HttpRequest& request, HttpExchange& exchange);

  EngineLoop& loop_;
  ServedModel model_;
  ApiKeys keys_;
  int64_t created_;
  std::function<ReplanTarget(const std::string& plan)> prepare_replan_;
  std::unique_ptr<NativeRoutes> native_;
};

}  // namespace moeserve::serve
