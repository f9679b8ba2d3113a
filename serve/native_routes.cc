#include "serve/native_routes.h"

#include <chrono>

#include "serve/api_error.h"
#include "serve/openai_response.h"
#include "serve/sglang_generate.h"

#ifndef MOESERVE_VERSION
#define MOESERVE_VERSION "0.1.0"
#endif

namespace moeserve::serve {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollInterval(20);
constexpr std::chrono::seconds kHealthGenerateTimeout(20);

void send_json(HttpExchange& exchange, const Json& body) { exchange.respond(200, "application/json", body.dump()); }

EngineRequest engine_request(const CompletionRequest& c, size_t prompt) {
  EngineRequest er;
  er.prompt = c.prompts[prompt];
  er.sampling = c.params.sampling;
  er.limits = {c.params.max_tokens, c.params.stop_token_ids, c.params.stop, c.params.skip_special_tokens};
  er.top_logprobs = c.params.top_logprobs;
  return er;
}

// The prompts of one /generate request in flight, cancelled if the handler leaves early.
struct NativeRun {
  EngineLoop& loop;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<SglangOutput> outputs;
  std::vector<bool> done;
  Clock::time_point start = Clock::now();

  NativeRun(EngineLoop& engine_loop, const CompletionRequest& c) : loop(engine_loop) {
    for (size_t i = 0; i < c.prompts.size(); ++i) {
      streams.push_back(loop.submit(engine_request(c, i)));
      outputs.emplace_back().prompt_tokens = static_cast<int64_t>(c.prompts[i].size());
      done.push_back(false);
    }
  }
  ~NativeRun() {
    for (size_t i = 0; i < streams.size(); ++i)
      if (!done[i]) loop.cancel(streams[i]->id());
  }
  // Waits for prompt i's next events and appends them; true when it got any. Throws the
  // engine's error as an ApiError.
  bool step(size_t i) {
    std::vector<OutputEvent> events;
    streams[i]->wait(events, kPollInterval);
    for (const OutputEvent& e : events) {
      if (e.error_status != 0) {
        done[i] = true;
        throw ApiError(e.error_status, e.error);
      }
      outputs[i].append(e);
      if (e.last()) {
        done[i] = true;
        outputs[i].e2e_latency_s = std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
    return !events.empty();
  }
  bool all_done() const { return std::find(done.begin(), done.end(), false) == done.end(); }
};

std::string request_id(const SglangGenerateRequest& r, size_t i) {
  const std::string base = r.rid.empty() ? new_response_id(false) : r.rid;
  return r.batch ? base + "-" + std::to_string(i) : base;
}

}  // namespace

NativeRoutes::NativeRoutes(EngineLoop& loop, const ServedModel& model, ServerInfo info)
    : loop_(loop), model_(model), info_(std::move(info)) {}

bool NativeRoutes::serves(const std::string& path) {
  return path == "/generate" || path == "/get_server_info" || path == "/server_info" || path == "/model_info" ||
         path == "/health_generate" || path == "/tokenize" || path == "/detokenize" || path == "/version";
}

void NativeRoutes::handle(const HttpRequest& request, HttpExchange& exchange) {
  const std::string& path = request.path;
  const bool post = path == "/generate" || path == "/tokenize" || path == "/detokenize";
  const char* method = post ? "POST" : "GET";
  if (request.method != method)
    throw ApiError(405, "method " + request.method + " is not allowed on " + path + " (use " + method + ")");
  if (path == "/generate") return generate(request, exchange);
  if (path == "/tokenize") return tokenize(request, exchange);
  if (path == "/detokenize") return detokenize(request, exchange);
  if (path == "/health_generate") return health_generate(exchange);
  if (path == "/version") return send_json(exchange, {{"version", MOESERVE_VERSION}});
  if (path == "/model_info")
    return send_json(exchange,
                     {{"model_path", info_.model_path.empty() ? Json(nullptr) : Json(info_.model_path)},
                      {"tokenizer_path", info_.tokenizer_path.empty() ? Json(nullptr) : Json(info_.tokenizer_path)},
                      {"is_generation", true},
                      {"served_model_name", model_.name}});
  send_json(exchange, server_info());
}

Json NativeRoutes::server_info() const {
  Json info = info_.settings;
  info["model_path"] = info_.model_path.empty() ? Json(nullptr) : Json(info_.model_path);
  info["tokenizer_path"] = info_.tokenizer_path.empty() ? Json(nullptr) : Json(info_.tokenizer_path);
  info["served_model_name"] = model_.name;
  const EngineSnapshot s = loop_.snapshot();
  const LiveStats live = loop_.live_stats();
  info["internal_states"] = Json::array({{{"avg_spec_accept_length", live.spec_accept_length},
                                          {"last_gen_throughput", live.last_gen_throughput},
                                          {"num_running_reqs", s.running},
                                          {"num_waiting_reqs", s.waiting},
                                          {"plan", loop_.plan_name()}}});
  info["version"] = MOESERVE_VERSION;
  return info;
}

void NativeRoutes::generate(const HttpRequest& request, HttpExchange& exchange) {
  const SglangGenerateRequest parsed = parse_sglang_generate(request.body, model_);
  NativeRun run(loop_, parsed.completion);
  if (!parsed.completion.params.stream) {
    while (!run.all_done()) {
      for (size_t i = 0; i < run.streams.size(); ++i)
        if (!run.done[i]) run.step(i);
      if (exchange.client_gone()) return;
    }
    if (!parsed.batch) return send_json(exchange, run.outputs[0].json(request_id(parsed, 0)));
    Json all = Json::array();
    for (size_t i = 0; i < run.outputs.size(); ++i) all.push_back(run.outputs[i].json(request_id(parsed, i)));
    return send_json(exchange, all);
  }
  // SGLang's stream: every chunk carries the text and ids so far; then [DONE].
  if (!exchange.begin_stream(200, "text/event-stream")) return;
  const std::string id = request_id(parsed, 0);
  while (!run.done[0]) {
    bool got = false;
    try {
      got = run.step(0);
    } catch (const ApiError& e) {
      exchange.send_chunk(stream_error_event(e.json()));
      break;
    }
    if (got && !exchange.send_chunk("data: " + run.outputs[0].json(id).dump() + "\n\n")) return;
    if (exchange.client_gone()) return;
  }
  exchange.send_chunk(kStreamDone);
  exchange.end_stream();
}

void NativeRoutes::tokenize(const HttpRequest& request, HttpExchange& exchange) {
  const Json body = parse_request_json(request.body);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  const bool chat = body.contains("messages");
  if (chat == body.contains("prompt")) throw ApiError(400, "give exactly one of prompt and messages", "prompt");
  if (body.value("add_special_tokens", false) && !chat)
    throw ApiError(400, "add_special_tokens: only false (prompts are encoded without BOS, as /v1/completions does)",
                   "add_special_tokens");
  // The same ids /v1/completions and /v1/chat/completions would run.
  Json as_request = {{"model", model_.name}, {"max_tokens", 1}};
  as_request[chat ? "messages" : "prompt"] = body[chat ? "messages" : "prompt"];
  for (const char* key : {"chat_template_kwargs", "tools", "add_generation_prompt"})
    if (chat && body.contains(key)) as_request[key] = body[key];
  const CompletionRequest parsed = parse_completion_request(as_request.dump(), chat, model_);
  if (parsed.prompts.size() != 1) throw ApiError(400, "prompt: one prompt (a string or token ids)", "prompt");
  const std::vector<int32_t>& ids = parsed.prompts[0];
  Json strs = nullptr;
  if (body.value("return_token_strs", false)) {
    strs = Json::array();
    for (int32_t id : ids) strs.push_back(model_.tokenizer->decode(std::vector<int32_t>{id}));
  }
  send_json(exchange,
            {{"count", ids.size()}, {"max_model_len", model_.context_length}, {"tokens", ids}, {"token_strs", strs}});
}

void NativeRoutes::detokenize(const HttpRequest& request, HttpExchange& exchange) {
  const Json body = parse_request_json(request.body);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    throw ApiError(400, "tokens: required, a list of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const Json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model_.tokenizer->vocab_size())
      throw ApiError(
          400, "tokens: every id must be an integer in [0, " + std::to_string(model_.tokenizer->vocab_size()) + ")",
          "tokens");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  send_json(exchange, {{"prompt", model_.tokenizer->decode(ids)}});
}

void NativeRoutes::health_generate(HttpExchange& exchange) {
  if (!loop_.failure().empty()) throw ApiError(503, "the engine failed: " + loop_.failure());
  if (loop_.draining()) throw ApiError(503, "the server is shutting down");
  CompletionRequest one;
  one.prompts = {{0}};
  one.params.max_tokens = 1;
  NativeRun run(loop_, one);
  const auto deadline = Clock::now() + kHealthGenerateTimeout;
  while (!run.done[0]) {
    try {
      run.step(0);
    } catch (const ApiError& e) {
      throw ApiError(503, std::string("a one-token generation failed: ") + e.what());
    }
    if (Clock::now() > deadline) throw ApiError(503, "a one-token generation did not finish within 20 s");
    if (exchange.client_gone()) return;
  }
  exchange.respond(200, "application/json", "{}");
}

}  // namespace moeserve::serve
