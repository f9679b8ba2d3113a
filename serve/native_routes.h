// The routes other engines' clients call besides the OpenAI ones, in those engines' shapes:
//   POST /generate             SGLang's native generate (text or input_ids, sampling_params,
//                              stream): what `sglang.bench_serving --backend sglang` sends
//   GET  /get_server_info      SGLang's server info (also /server_info, its newer name): the
//                              server's settings and internal_states (the bench reads
//                              avg_spec_accept_length from it)
//   GET  /model_info           SGLang's model info (model_path, tokenizer_path, is_generation)
//   GET  /health_generate      SGLang's: healthy only when a one-token generation runs
//   POST /tokenize, /detokenize  vLLM's shapes (prompt or messages -> tokens; tokens -> prompt)
//   GET  /version              {"version": ...}
// A field that would change the output and is not implemented is refused (400 naming it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "serve/openai_request.h"

namespace moeserve::serve {

// What /get_server_info reports beside the live state: the server's settings, SGLang's names
// where SGLang has one (tp_size, context_length, max_total_num_tokens, ...).
struct ServerInfo {
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();
  std::string model_path;      // "" for synthetic models
  std::string tokenizer_path;  // "" when the tokenizer is built in
};

class NativeRoutes {
 public:
  NativeRoutes(EngineLoop& loop, const ServedModel& model, ServerInfo info);

  // True when `path` is one of these routes (the caller checked the API key).
  static bool serves(const std::string& path);
  // Throws ApiError.
  void handle(const HttpRequest& request, HttpExchange& exchange);

 private:
  void generate(const HttpRequest& request, HttpExchange& exchange);
  void tokenize(const HttpRequest& request, HttpExchange& exchange);
  void detokenize(const HttpRequest& request, HttpExchange& exchange);
  void health_generate(HttpExchange& exchange);
  nlohmann::ordered_json server_info() const;

  EngineLoop& loop_;
  const ServedModel& model_;
  ServerInfo info_;
};

}  // namespace moeserve::serve
