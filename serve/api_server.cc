#include "serve/api_server.h"

#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "serve/api_error.h"
#include "serve/chat_output.h"
#include "serve/openai_response.h"
#include "tokenizer/utf8.h"

namespace moeserve::serve {

namespace {

using Json = nlohmann::ordered_json;
constexpr std::chrono::milliseconds kPollInterval(20);  // how often a waiting handler checks its client

void send_error(HttpExchange& exchange, const ApiError& error) {
  exchange.respond(error.status(), "application/json", error.json());
}

void send_json(HttpExchange& exchange, const Json& body) { exchange.respond(200, "application/json", body.dump()); }

// The engine requests of one HTTP request: a choice per (prompt, n).
struct Submission {
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompt_ids;  // per choice
  std::vector<bool> done;
  EngineLoop* loop = nullptr;

  void cancel_unfinished() {
    for (size_t i = 0; i < streams.size(); ++i)
      if (!done[i]) loop->cancel(streams[i]->id());
  }
};

Submission submit_all(EngineLoop& loop, const CompletionRequest& request, grammar::GrammarEngine* grammar) {
  Submission sub;
  sub.loop = &loop;
  const GenerationParams& p = request.params;
  try {
    for (const auto& prompt : request.prompts)
      for (int k = 0; k < p.n; ++k) {
        EngineRequest er;
        er.prompt = prompt;
        er.sampling = p.sampling;
        er.sampling.seed = p.sampling.seed + static_cast<uint64_t>(k);  // n choices differ when sampling
        er.limits = {p.max_tokens,           p.stop_token_ids,          p.stop,
                     p.skip_special_tokens,  p.logit_adjust.min_tokens, p.include_stop_str_in_output,
                     p.client_stop_token_ids};
        er.top_logprobs = p.top_logprobs;
        er.scripted_output = p.scripted_output;
        if (p.grammar) er.constraint = grammar->matcher(*p.grammar, p.stop_token_ids);
        er.logit_adjust = p.logit_adjust;
        er.prompt_alternatives = p.prompt_alternatives();
        sub.streams.push_back(loop.submit(std::move(er)));
        sub.prompt_ids.push_back(prompt);
        sub.done.push_back(false);
      }
  } catch (...) {
    sub.cancel_unfinished();
    throw;
  }
  return sub;
}

// One completion request in flight: its engine requests, what each choice has so far, the usage.
struct Completion {
  Completion(const CompletionRequest& request, ResponseContext context, Submission submission)
      : request(request),
        ctx(std::move(context)),
        sub(std::move(submission)),
        choices(sub.streams.size()),
        cached_counted(request.prompts.size(), false) {
    for (size_t i = 0; i < choices.size(); ++i) {
      choices[i].logprobs_requested = request.params.top_logprobs >= 0;
      choices[i].prompt_logprobs_requested = request.params.prompt_logprobs >= 0;
      if (request.params.echo && choices[i].logprobs_requested) choices[i].echo_prompt = &request.prompts[prompt_of(i)];
    }
    for (const auto& ids : request.prompts) usage.prompt_tokens += static_cast<int64_t>(ids.size());
    // One output parser per choice: its state is this choice's alone.
    if (request.params.parsing.enabled)
      for (size_t i = 0; i < choices.size(); ++i)
        parsers.push_back(std::make_unique<chatout::ChatOutputParser>(request.params.parsing.options));
  }

  chatout::ChatOutputParser* parser(size_t choice) const { return parsers.empty() ? nullptr : parsers[choice].get(); }

  size_t size() const { return choices.size(); }
  size_t prompt_of(size_t choice) const { return choice / static_cast<size_t>(request.params.n); }
  std::string echo_text(size_t choice) const {
    return request.params.echo ? request.prompt_texts[prompt_of(choice)] : std::string();
  }

  // Choice i's last event: it is done, and its tokens count in the usage (a prompt's cached
  // tokens once, however many choices share it).
  void finish(size_t i, const OutputEvent& e) {
    sub.done[i] = true;
    usage.completion_tokens += e.completion_tokens;
    usage.spec_verify_ct += e.spec_verify_ct;
    usage.spec_accepted_tokens += e.spec_accepted_tokens;
    if (!cached_counted[prompt_of(i)]) {
      usage.cached_tokens += e.cached_tokens;
      cached_counted[prompt_of(i)] = true;
    }
  }

  const CompletionRequest& request;
  ResponseContext ctx;
  Submission sub;
  std::vector<ChoiceOutput> choices;
  Usage usage;
  std::vector<bool> cached_counted;                                 // per prompt
  std::vector<std::unique_ptr<chatout::ChatOutputParser>> parsers;  // per choice; none without parsing
};

// A choice's first chunk (the echoed prompt; for chat, the role). False: the client is gone.
bool send_stream_head(const Completion& c, size_t i, HttpExchange& exchange) {
  ChoiceOutput head;
  head.text = c.echo_text(i);
  head.logprobs_requested = c.choices[i].logprobs_requested;
  return !(c.ctx.chat || !head.text.empty()) ||
         exchange.send_chunk(stream_chunk(c.ctx, static_cast<int>(i), head, true));
}

// One engine event of choice i as a chunk, when it carries anything. False: the client is gone.
bool send_stream_event(Completion& c, size_t i, const OutputEvent& e, HttpExchange& exchange) {
  ChoiceOutput delta;
  delta.logprobs_requested = c.choices[i].logprobs_requested;
  delta.append(e);
  if (chatout::ChatOutputParser* parser = c.parser(i))
    parse_stream_delta(*parser, c.request.params.parsing, e.last(), delta);
  if (e.last()) c.finish(i, e);
  const bool worth_sending = !delta.text.empty() || !delta.reasoning.empty() || !delta.tool_calls.empty() || e.last() ||
                             c.ctx.return_token_ids || delta.logprobs_requested;
  return !worth_sending || exchange.send_chunk(stream_chunk(c.ctx, static_cast<int>(i), delta, false));
}

// An engine error ends the whole stream: the other choices are cancelled, the error is the last event.
void end_stream_with_error(Completion& c, size_t i, const OutputEvent& e, HttpExchange& exchange) {
  c.sub.done[i] = true;
  c.sub.cancel_unfinished();
  exchange.send_chunk(stream_error_event(ApiError(e.error_status, e.error).json()));
  exchange.send_chunk(kStreamDone);
  exchange.end_stream();
}

// "stream": true: every choice's events as SSE chunks, interleaved, as they come.
void stream_choices(Completion& c, HttpExchange& exchange) {
  if (!exchange.begin_stream(200, "text/event-stream")) return c.sub.cancel_unfinished();
  const size_t n = c.size();
  std::vector<bool> started(n, false);
  size_t remaining = n;
  while (remaining > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (c.sub.done[i]) continue;
      if (!started[i] && !send_stream_head(c, i, exchange)) return c.sub.cancel_unfinished();
      started[i] = true;
      std::vector<OutputEvent> events;
      c.sub.streams[i]->wait(events, n == 1 ? kPollInterval : std::chrono::milliseconds(1));
      for (const OutputEvent& e : events) {
        if (e.error_status != 0) return end_stream_with_error(c, i, e, exchange);
        if (!send_stream_event(c, i, e, exchange)) return c.sub.cancel_unfinished();
        if (e.last()) --remaining;
      }
      if (exchange.client_gone()) return c.sub.cancel_unfinished();
    }
  }
  if (c.request.params.include_usage) exchange.send_chunk(stream_usage_chunk(c.ctx, c.usage));
  exchange.send_chunk(kStreamDone);
  exchange.end_stream();
}

// No streaming: every choice whole, then one response (an engine error answers instead).
void collect_choices(Completion& c, HttpExchange& exchange) {
  const size_t n = c.size();
  size_t remaining = n;
  for (size_t i = 0; i < n; ++i) c.choices[i].text = c.echo_text(i);
  while (remaining > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (c.sub.done[i]) continue;
      std::vector<OutputEvent> events;
      c.sub.streams[i]->wait(events, kPollInterval);
      for (const OutputEvent& e : events) {
        if (e.error_status != 0) {
          c.sub.done[i] = true;
          c.sub.cancel_unfinished();
          throw ApiError(e.error_status, e.error);
        }
        c.choices[i].append(e);
        if (e.last()) {
          c.finish(i, e);
          --remaining;
        }
      }
      if (exchange.client_gone()) return c.sub.cancel_unfinished();
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (chatout::ChatOutputParser* parser = c.parser(i))
      parse_whole_choice(*parser, c.request.params.parsing, c.choices[i]);
  std::vector<std::string> echo_texts;
  for (size_t i = 0; i < n; ++i) echo_texts.push_back(c.echo_text(i));
  exchange.respond(200, "application/json", response_json(c.ctx, c.choices, c.sub.prompt_ids, c.usage, echo_texts));
}

}  // namespace

ApiServer::ApiServer(EngineLoop& loop, ServedModel model, ApiKeys keys)
    : loop_(loop), model_(std::move(model)), keys_(std::move(keys)), created_(std::time(nullptr)) {}

namespace {

bool is_admin_route(const std::string& path) { return path.rfind("/admin/", 0) == 0 || path == "/flush_cache"; }

bool bearer_matches(const HttpRequest& request, const std::string& key) {
  const std::string* header = request.header("authorization");
  const std::string expected = "Bearer " + key;
  if (header == nullptr || header->size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the key's length
  for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned char>((*header)[i] ^ expected[i]);
  return diff == 0;
}

}  // namespace

void ApiServer::check_authorized(const HttpRequest& request) const {
  if (!is_admin_route(request.path)) {
    if (!keys_.api.empty() && !bearer_matches(request, keys_.api))
      throw ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", "", "invalid_api_key");
    return;
  }
  if (keys_.admin.empty())
    throw ApiError(403,
                   "admin routes are off: start the server with --admin-api-key KEY and send "
                   "Authorization: Bearer KEY",
                   "", "admin_disabled");
  if (!bearer_matches(request, keys_.admin))
    throw ApiError(401, "invalid or missing admin API key (Authorization: Bearer KEY of --admin-api-key)", "",
                   "invalid_api_key");
}

void ApiServer::handle(const HttpRequest& request, HttpExchange& exchange) {
  try {
    const std::string& path = request.path;
    log(LogLevel::kDebug, "{} {} ({} body bytes)", request.method, path, request.body.size());
    auto only = [&](const char* method) {
      if (request.method != method)
        throw ApiError(405, "method " + request.method + " is not allowed on " + path + " (use " + method + ")");
    };
    if (path == "/health") {
      only("GET");
      const std::string failure = loop_.failure();
      if (!failure.empty()) throw ApiError(503, "the engine failed: " + failure);
      if (loop_.draining()) throw ApiError(503, "the server is shutting down");
      return send_json(exchange, {{"status", "ok"}, {"plan", loop_.plan_name()}, {"replans", loop_.replans()}});
    }
    check_authorized(request);
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      only("POST");
      return completions(request, exchange, path == "/v1/chat/completions");
    }
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
      only("GET");
      return models(request, exchange);
    }
    if (path == "/metrics") {
      only("GET");
      std::string text = loop_.render_metrics();
      loop_.render_sglang_metrics(model_.name, text);
      exchange.respond(200, "text/plain; version=0.0.4; charset=utf-8", text);
      return;
    }
    if (path == "/admin/replan") {
      only("POST");
      return replan(request, exchange);
    }
    if (path == "/admin/flush_cache" || path == "/flush_cache") {
      only("POST");
      return send_json(exchange, {{"evicted_pages", loop_.flush_prefix_cache()}});
    }
    if (native_ && NativeRoutes::serves(path)) return native_->handle(request, exchange);
    throw ApiError(404, "no route " + request.method + " " + path);
  } catch (const ApiError& e) {
    send_error(exchange, e);
  } catch (const nlohmann::json::exception&) {
    // A request field of a type some reader did not check: the client's error, and the
    // library's text (with its exception ids) is no answer to show.
    send_error(exchange, ApiError(400, "a request field has the wrong type or value"));
  }
}

void ApiServer::enable_replan(std::function<ReplanTarget(const std::string& plan)> prepare) {
  prepare_replan_ = std::move(prepare);
}

void ApiServer::enable_native_routes(ServerInfo info) {
  native_ = std::make_unique<NativeRoutes>(loop_, model_, std::move(info));
}

void ApiServer::replan(const HttpRequest& request, HttpExchange& exchange) {
  if (!prepare_replan_) throw ApiError(404, "re-plan is not enabled on this server");
  const Json body = parse_request_json(request.body);
  if (!body.is_object() || !body.contains("plan") || !body["plan"].is_string() ||
      body["plan"].get<std::string>().empty())
    throw ApiError(400, "plan: required, a plan preset such as \"ep2\"", "plan");
  const std::string plan = body["plan"].get<std::string>();
  ReplanTarget target;
  try {
    target = prepare_replan_(plan);
  } catch (const std::exception& e) {  // refused before anything stops: the old plan serves on
    throw ApiError(400, "plan '" + plan + "' refused: " + e.what(), "plan");
  }
  const ReplanReport report = loop_.replan(std::move(target));
  send_json(
      exchange,
      {{"plan", report.plan},
       {"previous_plan", report.previous_plan},
       {"time_to_ready_s", report.ready_s},
       {"drain_s", report.drain_s},
       {"build_s", report.build_s},
       {"warmup_s", report.warmup_s},
       {"phases_s",
        {{"pause", report.pause_s}, {"move", report.move_s}, {"graphs", report.graphs_s}, {"resume", report.resume_s}}},
       {"weights_from", report.weights_from},
       {"fallback_reason", report.fallback_reason},
       {"move_detail_s", {{"build", report.move_build_s}, {"free_old", report.move_free_s}}},
       {"moved_bytes",
        {{"local", report.moved_local_bytes},
         {"peer", report.moved_peer_bytes},
         {"viewed", report.viewed_bytes},
         {"reused_cache", report.reused_cache_bytes}}},
       {"requests_carried", report.requests_carried},
       {"tokens_recomputed", report.tokens_recomputed},
       {"requests_waited", report.requests_waited},
       {"replans", loop_.replans()}});
}

void ApiServer::models(const HttpRequest& request, HttpExchange& exchange) {
  const Json card = {{"id", model_.name},
                     {"object", "model"},
                     {"created", created_},
                     {"owned_by", "moeserve"},
                     {"max_model_len", model_.context_length}};
  if (request.path == "/v1/models") return send_json(exchange, {{"object", "list"}, {"data", Json::array({card})}});
  const std::string id = request.path.substr(std::string("/v1/models/").size());
  if (id != model_.name) throw ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found");
  send_json(exchange, card);
}

void ApiServer::completions(const HttpRequest& request, HttpExchange& exchange, bool chat) {
  if (const size_t bad = tokenizer::first_invalid_utf8(request.body); bad != std::string::npos)
    throw ApiError(400, "the request body is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  const CompletionRequest parsed = parse_completion_request(request.body, chat, model_);
  ResponseContext ctx;
  ctx.chat = chat;
  ctx.id = new_response_id(chat);
  ctx.created = std::time(nullptr);
  ctx.model = model_.name;
  ctx.return_token_ids = parsed.params.return_token_ids;
  ctx.tokenizer = model_.tokenizer;
  Completion completion(parsed, std::move(ctx), submit_all(loop_, parsed, model_.grammar.get()));
  if (parsed.params.stream)
    stream_choices(completion, exchange);
  else
    collect_choices(completion, exchange);
}

}  // namespace moeserve::serve
