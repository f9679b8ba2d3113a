// moeserve serve: the OpenAI-compatible HTTP server (serve/) over the engine (runtime/) with
// the continuous-batching scheduler (sched/) and the paged, prefix-shared KV cache (kv/).
// Binds to loopback unless --host says otherwise; SIGTERM or SIGINT drains: no new requests,
// the ones in flight finish (up to --drain-timeout), then the process exits 0.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "apps/commands.h"
#include "apps/default_model.h"
#include "apps/dist_cli.h"
#include "apps/kv_sizing.h"
#include "apps/plan_cli.h"
#include "apps/spec_cli.h"
#include "chatout/chat_output_parser.h"
#include "core/error.h"
#include "core/log.h"
#include "grammar/grammar_engine.h"
#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "runtime/engine.h"
#include "runtime/multinode.h"
#include "runtime/rank_devices.h"
#include "runtime/reshard_fit.h"
#include "serve/api_error.h"
#include "serve/api_server.h"
#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {

namespace {

// Prefill tokens per replica per step when --chunked-prefill-size is left at 0.
constexpr int64_t kDefaultChunkedPrefillCuda = 8192;
constexpr int64_t kDefaultChunkedPrefillCpu = 512;
// After a node is lost, the leader answers 503 for this long before it exits.
constexpr int kLostNodeExitDelayMs = 2000;

struct ServeArgs {
  std::string model;  // "": the shipped default model (apps/default_model.h)
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string admin_api_key;
  std::string backend;  // "": runtime::default_backend()
  PlanCliArgs plan;
  EngineCliArgs engine;
  int64_t kv_pages = 0;            // 0: sized by apps/kv_sizing.h
  double mem_fraction_static = 0;  // 0: kDefaultMemFractionStatic
  bool disable_cuda_graph = false;
  std::string log_level = "info";
  std::string tokenizer_path;      // "": the model's own
  bool trust_remote_code = false;  // accepted for SGLang / vLLM command lines; nothing runs remote code here
  uint64_t random_seed = 0;        // the seed of requests that give none
  bool random_seed_set = false;
  int64_t chunked_prefill_size = 0;  // 0: by backend (kDefaultChunkedPrefill*)
  int64_t max_queued_requests = 1024;
  int pp_groups = 0;  // 0: one per pipeline stage
  bool disable_radix_cache = false;
  bool skip_warmup = false;
  double min_step_ms = 0;
  int64_t max_body_bytes = 8 << 20;
  double drain_timeout_s = 30;
  int max_connections = 8192;
  double header_timeout_s = 10;
  double idle_timeout_s = 60;
  std::string chat_template;
  bool special_tokens_in_content = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  bool test_scripted_output = false;
  spec::SpeculativeFlags speculative;
  dist::LaunchArgs launch;
};

// --tool-call-parser and --reasoning-parser, checked before the model loads (an unknown name
// is an error listing the known ones).
void check_output_parsers(const ServeArgs& args) {
  chatout::ChatOutputOptions options;
  options.tool_parser = args.tool_call_parser;
  options.reasoning_parser = args.reasoning_parser;
  chatout::ChatOutputParser check(options);
}

std::unique_ptr<tokenizer::Tokenizer> tokenizer_of(const ModelSource& model, const std::string& tokenizer_path) {
  if (!tokenizer_path.empty()) return tokenizer::load_tokenizer(tokenizer_path);
  if (model.synthetic) return tokenizer::make_builtin_tokenizer(model.config.vocab_size);
  MS_CHECK(!model.directory.empty(), "serve: model '{}' has no directory with tokenizer files", model.spec);
  return tokenizer::load_tokenizer(model.directory);
}

// What an engine and its scheduler need under `plan`: the start-up plan and every re-plan
// (POST /admin/replan) go through here.
runtime::EngineOptions engine_options_of(const ServeArgs& args, const ModelRunOptions& run,
                                         const parallel::ParallelPlan& plan, dist::Cluster* cluster) {
  runtime::EngineOptions engine_options;
  engine_options.backend = args.backend;
  engine_options.plan = plan;
  engine_options.page_size = args.engine.page_size;
  engine_options.num_pages = args.kv_pages;
  engine_options.graphs = !args.disable_cuda_graph;
  engine_options.pp_max_micro_batch_size = args.engine.pp_max_micro_batch_size;
  engine_options.pp_async_batch_depth = args.engine.pp_async_batch_depth;
  engine_options.run = run;
  engine_options.batch_invariant = args.engine.batch_invariant;
  engine_options.kv_cache_fp8 = args.plan.kv_cache_fp8;  // parsed from --kv-cache-dtype by run_serve
  engine_options.cluster = cluster;
  return engine_options;
}

serve::ReplanTarget replan_target(const ModelSource& model, const ServeArgs& args, const ModelRunOptions& run,
                                  const parallel::ParallelPlan& plan, dist::Cluster* cluster) {
  // A re-plan outside the reduction plan is refused here, before anything drains.
  check_reduction_plan(model.config, plan, run);
  MS_CHECK(!cluster || plan.world() == cluster->nnodes() * static_cast<int>(cluster->local_ranks().size()),
           "a re-plan to '{}' ({} ranks) across nodes is not implemented", plan.name, plan.world());
  const runtime::EngineOptions engine_options = engine_options_of(args, run, plan, cluster);
  serve::ReplanTarget target;
  target.plan_name = plan.name;
  sched::SchedulerOptions& so = target.scheduler;
  so.page_size = args.engine.page_size;
  so.pages_per_replica = args.kv_pages;
  so.attn_dp = plan.attn_dp;
  so.pp = plan.pp;
  so.max_micro_batch_size = args.engine.pp_max_micro_batch_size;
  so.pipeline_groups = args.pp_groups > 0 ? args.pp_groups : plan.pp;
  so.max_running_requests = args.plan.max_running_requests;
  so.chunked_prefill_size = args.chunked_prefill_size;
  so.prefix_cache = !args.disable_radix_cache;
  target.build_engine = [&model, engine_options] { return std::make_unique<runtime::Engine>(model, engine_options); };
  target.reshard_engine = [&model, engine_options](runtime::Engine& from) {
    return std::make_unique<runtime::Engine>(model, engine_options, from, /*take_caches=*/true);
  };
  return target;
}

// Cold start: the weights the ranks loaded and how fast (from a checkpoint directory: its
// bytes as stored over the load's time, page cache cold or warm as the machine has it).
std::unique_ptr<runtime::Engine> load_engine(const ModelSource& model, const serve::ReplanTarget& start) {
  const auto load_start = std::chrono::steady_clock::now();
  std::unique_ptr<runtime::Engine> engine = start.build_engine();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  int64_t held = 0;
  for (int64_t b : engine->stats().weight_bytes) held += b;
  const double stored_gb = static_cast<double>(stored_model_bytes(model.config)) / 1e9;
  std::printf("moeserve: loaded the weights (%.3f GB stored, %.3f GB held by the ranks) from %s in %.3f s: %.2f GB/s\n",
              stored_gb, static_cast<double>(held) / 1e9,
              model.synthetic ? "the synthetic generator" : model.spec.c_str(), seconds,
              seconds > 0 ? stored_gb / seconds : 0.0);
  std::fflush(stdout);
  return engine;
}

// /get_server_info's settings, under SGLang's names where SGLang has the same setting.
serve::ServerInfo server_info_of(const ServeArgs& args, const ModelSource& model, const parallel::ParallelPlan& plan,
                                 const KvSizing& kv) {
  serve::ServerInfo info;
  if (!model.synthetic) info.model_path = model.directory;
  info.tokenizer_path = !args.tokenizer_path.empty() ? args.tokenizer_path : info.model_path;
  info.settings = {
      {"host", args.host},
      {"port", args.port},
      {"backend", args.backend},
      {"plan", plan.name},
      {"tp_size", plan.ranks_per_stage()},
      {"dp_size", plan.attn_dp},
      {"pp_size", plan.pp},
      {"ep_size", plan.moe_ep},
      {"enable_dp_attention", plan.attn_dp > 1},
      {"context_length",
       args.plan.context_length > 0 ? args.plan.context_length : model.config.max_position_embeddings},
      {"max_running_requests", args.plan.max_running_requests},
      {"max_total_num_tokens", kv.tokens},
      {"page_size", args.engine.page_size},
      {"kv_pages", kv.pages},
      {"kv_cache_sized_by", kv.how},
      {"chunked_prefill_size", args.chunked_prefill_size},
      {"mem_fraction_static", args.mem_fraction_static > 0 ? args.mem_fraction_static : kDefaultMemFractionStatic},
      {"disable_radix_cache", args.disable_radix_cache},
      {"disable_cuda_graph", args.disable_cuda_graph},
      {"random_seed", args.random_seed_set ? nlohmann::ordered_json(args.random_seed) : nullptr},
      {"speculative_algorithm", args.speculative.algorithm.empty()
                                    ? nlohmann::ordered_json(nullptr)
                                    : nlohmann::ordered_json(args.speculative.algorithm)}};
  return info;
}

// --random-seed: requests without a seed take the next draw of one generator seeded with it,
// so that a server's run is reproducible from its command line (SGLang's meaning).
std::function<uint64_t()> seed_source(const ServeArgs& args) {
  if (!args.random_seed_set) return nullptr;
  auto state = std::make_shared<std::pair<std::mutex, std::mt19937_64>>();
  state->second.seed(args.random_seed);
  return [state] {
    std::lock_guard<std::mutex> lock(state->first);
    return state->second();
  };
}

// The model as the API shows it: name, limits, end ids, chat template.
// across_processes: structured output is off (its masks are filled while the leader's step
// runs, after the step went to the followers), and requests asking for it get a 400.
serve::ServedModel served_model(const ServeArgs& args, const ModelSource& model, const tokenizer::Tokenizer& tok,
                                bool across_processes) {
  serve::ServedModel served;
  // The default model is served as "default" unless --served-model-name names it.
  served.name = !args.served_model_name.empty() ? args.served_model_name : args.model.empty() ? "default" : args.model;
  served.vocab_size = model.config.vocab_size;
  served.context_length = args.plan.context_length > 0
                              ? std::min(args.plan.context_length, model.config.max_position_embeddings)
                              : model.config.max_position_embeddings;
  served.max_request_tokens = (args.kv_pages - 1) * args.engine.page_size;
  if (model.config.eos_token_id >= 0) served.eos_id = static_cast<int32_t>(model.config.eos_token_id);
  served.end_of_turn_id = tok.added_token_id("<|im_end|>");
  try {
    served.chat_template = tokenizer::chat_template_for(tok, args.chat_template);
  } catch (const Error& e) {
    MS_CHECK(args.chat_template.empty(), "--chat-template: {}", e.what());
    log(LogLevel::kWarning, "no chat template ({}); /v1/chat/completions is off", e.what());
  }
  served.special_tokens_in_content = args.special_tokens_in_content;
  served.tool_call_parser = args.tool_call_parser;
  served.reasoning_parser = args.reasoning_parser;
  served.scripted_output = args.test_scripted_output;
  served.tokenizer = &tok;
  // Structured output: the vocabulary as the logits see it; a grammar ends on the end ids.
  std::vector<int32_t> stop_ids;
  for (const auto& id : {served.eos_id, served.end_of_turn_id})
    if (id) stop_ids.push_back(*id);
  if (across_processes)
    log(LogLevel::kWarning,
        "structured output across processes is not implemented yet: response_format and tool_choice "
        "required / named are refused");
  else
    served.grammar = std::make_shared<grammar::GrammarEngine>(
        grammar::make_vocabulary(tok, {.model_vocab_size = model.config.vocab_size, .stop_ids = stop_ids}));
  served.next_seed = seed_source(args);
  return served;
}

int64_t ms(double seconds) { return static_cast<int64_t>(seconds * 1000); }

// Serves until SIGTERM / SIGINT, then stops accepting, drains within --drain-timeout and stops.
void serve_until_signal(const sigset_t& signals, serve::EngineLoop& loop, serve::HttpServer& http,
                        const ServeArgs& args) {
  int signal = 0;
  sigwait(&signals, &signal);
  std::printf("moeserve: %s: draining (%d requests in flight)\n", signal == SIGTERM ? "SIGTERM" : "SIGINT",
              static_cast<int>(loop.snapshot().running + loop.snapshot().waiting));
  std::fflush(stdout);
  // Idle and slow connections close now; the requests in flight get what is left of the timeout,
  // and whatever the clients do, the HTTP layer is closed by then (a moment more for the answers
  // of requests the engine failed, which are ready at once).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms(args.drain_timeout_s));
  http.stop_accepting();
  const bool drained = loop.drain(std::chrono::milliseconds(ms(args.drain_timeout_s)));
  loop.stop();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  http.stop(std::max(left, std::chrono::milliseconds(200)));
  std::printf("moeserve: stopped%s\n", drained ? "" : " (drain timeout: requests in flight were failed)");
  std::fflush(stdout);
}

// A follower node: its ranks run the leader's steps until the leader closes the cluster
// (returns) or is lost (throws: the process exits non-zero).
void follow_leader(const ModelSource& model, const runtime::EngineOptions& options) {
  runtime::Engine engine(model, options);
  std::printf("moeserve: %s ready; following the leader\n",
              options.cluster->describe(options.cluster->node_rank()).c_str());
  std::fflush(stdout);
  runtime::run_follower(engine, *options.cluster);
}

// The leader: a lost node fails the engine (the requests in flight fail, new ones are answered
// 503 naming the node); a moment later, so that clients get those answers, the process exits
// non-zero (a supervisor such as systemd restarts the whole server). The followers see the
// leader's connections close and exit too.
void exit_when_lost(dist::Cluster& cluster) {
  cluster.on_lost([](const std::string& why) {
    std::thread([why] {
      std::fprintf(stderr, "moeserve: %s; exiting in %d ms\n", why.c_str(), kLostNodeExitDelayMs);
      std::this_thread::sleep_for(std::chrono::milliseconds(kLostNodeExitDelayMs));
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(3);
    }).detach();
  });
}

// The HTTP layer's flags, checked before the model loads.
serve::HttpServerOptions http_options_of(const ServeArgs& args) {
  MS_CHECK(args.port >= 0 && args.port <= 65535, "--port {} outside [0, 65535]", args.port);
  MS_CHECK(args.max_body_bytes > 0, "--max-body-bytes must be positive");
  MS_CHECK(args.max_connections > 0, "--max-connections must be positive");
  MS_CHECK(args.header_timeout_s > 0 && args.header_timeout_s < 86400, "--header-timeout must be in (0, 86400) s");
  MS_CHECK(args.idle_timeout_s > 0 && args.idle_timeout_s < 86400, "--idle-timeout must be in (0, 86400) s");
  serve::HttpServerOptions options;
  options.host = args.host;
  options.port = args.port;
  options.max_body_bytes = static_cast<size_t>(args.max_body_bytes);
  options.max_connections = args.max_connections;
  options.header_timeout_ms = static_cast<int>(ms(args.header_timeout_s));
  options.idle_timeout_ms = static_cast<int>(ms(args.idle_timeout_s));
  options.error_body = [](int status, const std::string& message) { return serve::api_error_json(status, message); };
  return options;
}

serve::EngineLoopOptions loop_options_of(const ServeArgs& args, const serve::ReplanTarget& start) {
  serve::EngineLoopOptions loop_options;
  loop_options.scheduler = start.scheduler;
  loop_options.speculative = spec::speculative_options(args.speculative);
  loop_options.plan_name = start.plan_name;
  loop_options.rebuild_engine = start.build_engine;
  loop_options.max_queued_requests = args.max_queued_requests;
  loop_options.warmup = !args.skip_warmup;
  MS_CHECK(args.min_step_ms >= 0 && args.min_step_ms <= 60000, "--min-step-ms must be in [0, 60000] (got {})",
           args.min_step_ms);
  loop_options.min_step = std::chrono::microseconds(static_cast<int64_t>(args.min_step_ms * 1000));
  return loop_options;
}

// SIGTERM and SIGINT, blocked: they are taken by sigwait on this thread only, so this runs
// before any thread starts. SIGPIPE is ignored (a client gone mid-write is an error, not a death).
sigset_t block_serving_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Sized once, before the weights load; a re-plan keeps the page count.
KvSizing size_kv_for(const ServeArgs& args, const ModelSource& model, const parallel::ParallelPlan& plan,
                     const ModelRunOptions& run) {
  return size_kv_cache({.config = model.config,
                        .plan = plan,
                        .backend = args.backend,
                        .page_size = args.engine.page_size,
                        .kv_pages = args.kv_pages,
                        .mem_fraction_static = args.mem_fraction_static,
                        .kv_cache_fp8 = args.plan.kv_cache_fp8,
                        .mtp = run.mtp});
}

// The start-up line scripts wait for: the model, plan, KV capacity and the address.
void print_serving(const ServeArgs& args, const serve::ServedModel& served, const parallel::ParallelPlan& plan,
                   const KvSizing& kv, int port) {
  const bool ipv6 = args.host.find(':') != std::string::npos;
  std::printf(
      "moeserve: serving %s (plan %s, %d ranks on %s, %lld KV pages of %lld tokens per replica: %lld tokens fit, "
      "by %s) on http://%s%s%s:%d\n",
      served.name.c_str(), plan.name.c_str(), plan.world(), args.backend.c_str(), static_cast<long long>(kv.pages),
      static_cast<long long>(args.engine.page_size), static_cast<long long>(kv.tokens), kv.how.c_str(), ipv6 ? "[" : "",
      args.host.c_str(), ipv6 ? "]" : "", port);
  std::fflush(stdout);
}

void run_serve(ServeArgs args) {
  const sigset_t signals = block_serving_signals();

  set_log_level(args.log_level);
  const serve::HttpServerOptions http_options = http_options_of(args);
  check_output_parsers(args);
  const ModelSource model = open_model(resolve_model_spec(args.model));
  const auto tok = tokenizer_of(model, args.tokenizer_path);
  MS_CHECK(tok->vocab_size() <= model.config.vocab_size,
           "serve: the tokenizer has {} ids, more than the model's vocabulary of {}", tok->vocab_size(),
           model.config.vocab_size);

  const int64_t bytes_per_element = args.backend == "cuda" ? 2 : 4;
  MS_CHECK(args.chunked_prefill_size >= 0, "--chunked-prefill-size must be >= 0 (0: the backend's default)");
  MS_CHECK(args.pp_groups >= 0, "--pp-groups must be >= 0 (0: one per pipeline stage), got {}", args.pp_groups);
  if (args.chunked_prefill_size == 0)
    args.chunked_prefill_size = args.backend == "cuda" ? kDefaultChunkedPrefillCuda : kDefaultChunkedPrefillCpu;
  ModelRunOptions run = run_options_for(args.engine.reduction_plan);
  // NEXTN drafts with the model's MTP layer: the last stage loads it.
  run.mtp = spec::speculative_options(args.speculative).algorithm == spec::Algorithm::kNextn;
  std::unique_ptr<dist::Cluster> cluster;
  auto target_for = [&model, &args, run, &cluster](const parallel::ParallelPlan& plan) {
    return replan_target(model, args, run, plan, cluster.get());
  };
  args.plan.kv_cache_fp8 = kv_cache_fp8(args.engine.kv_cache_dtype);
  const parallel::ParallelPlan plan = plan_for_model(args.plan, model.config, bytes_per_element);
  const KvSizing kv = size_kv_for(args, model, plan, run);
  args.kv_pages = kv.pages;
  cluster = join_cluster(args.launch, model, engine_options_of(args, run, plan, nullptr));
  if (cluster && !cluster->leader()) return follow_leader(model, engine_options_of(args, run, plan, cluster.get()));
  if (cluster) exit_when_lost(*cluster);
  serve::ReplanTarget start = target_for(plan);

  const serve::EngineLoopOptions loop_options = loop_options_of(args, start);
  std::unique_ptr<runtime::Engine> engine = load_engine(model, start);
  const auto warmup_start = std::chrono::steady_clock::now();
  serve::EngineLoop loop(std::move(engine), *tok, loop_options);
  if (!args.skip_warmup)
    std::printf("moeserve: warmed up the %lld-token step and decode steps 1..%lld in %.2f s\n",
                static_cast<long long>(args.chunked_prefill_size + args.plan.max_running_requests),
                static_cast<long long>(args.plan.max_running_requests),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - warmup_start).count());

  const serve::ServedModel served = served_model(args, model, *tok, cluster != nullptr);
  serve::ApiServer api(loop, served, {args.api_key, args.admin_api_key});
  api.enable_native_routes(server_info_of(args, model, plan, kv));
  // A re-plan keeps every flag but the plan: the memory check (--mem-per-rank, with
  // --context-length and --max-running-requests) applies to the new plan too.
  api.enable_replan([&](const std::string& spec) {
    PlanCliArgs plan_args = args.plan;
    plan_args.preset = spec;
    plan_args.flags = {};
    const parallel::ParallelPlan to = plan_for_model(plan_args, model.config, bytes_per_element);
    serve::ReplanTarget target = target_for(to);
    // Both plans' weights must fit each rank while one is copied from the other (--mem-per-rank).
    if (args.plan.mem_per_rank.empty()) return target;
    const parallel::ParallelPlan from = parallel::parse_plan(loop.plan_name());
    target.in_place_refusal =
        runtime::reshard_fit({.config = model.config,
                              .from = from,
                              .to = to,
                              .element_bytes = bytes_per_element,
                              .bytes_per_rank = parallel::parse_byte_size(args.plan.mem_per_rank, "--mem-per-rank")});
    return target;
  });

  serve::HttpServer http(http_options, [&api](const serve::HttpRequest& request, serve::HttpExchange& exchange) {
    api.handle(request, exchange);
  });
  http.start();
  print_serving(args, served, plan, kv, http.port());

  serve_until_signal(signals, loop, http, args);
}

// The HTTP server's limits and timeouts.
void add_http_flags(CLI::App* cmd, ServeArgs& args) {
  cmd->add_option("--max-body-bytes", args.max_body_bytes, "Largest request body accepted (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", args.drain_timeout_s, "Seconds SIGTERM waits for requests in flight")
      ->capture_default_str();
  cmd->add_option("--max-connections", args.max_connections,
                  "Open HTTP connections; more are answered 503 (lowered to what the open-file limit allows)")
      ->capture_default_str();
  cmd->add_option("--header-timeout", args.header_timeout_s,
                  "Seconds for a request's head, from the accept or a keep-alive request's first byte (408 after)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", args.idle_timeout_s, "Seconds a keep-alive connection may wait for a request")
      ->capture_default_str();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  args->plan.max_running_requests = 128;
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model,-m,--model-path", args->model,
                  "A model directory, or synthetic:NAME[:layers=N][:seed=S] (random weights); default: the shipped "
                  "model (models/default)");
  cmd->add_option("--served-model-name", args->served_model_name, "The model name clients send (default: --model)");
  cmd->add_option("--host", args->host, "Address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", args->port, "Port (0: any free port; the chosen one is printed)")->capture_default_str();
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--admin-api-key", args->admin_api_key,
                  "Enable the admin routes (/admin/replan, /admin/flush_cache) for 'Authorization: Bearer KEY'; "
                  "without it they answer 403");
  cmd->add_option("--backend", args->backend,
                  "cpu, cpu-bf16 (the CUDA backend's bf16 rounding on the host) or cuda; default: cuda when a GPU is "
                  "visible");
  cmd->add_option("--plan", args->plan.preset, "Parallel plan preset (single, tp2, ep2, pp2, ep2-dp, ...)");
  add_plan_flags(cmd, args->plan);  // also --max-running-requests and --context-length
  add_engine_flags(cmd, args->engine);
  add_speculative_flags(cmd, args->speculative);
  add_dist_flags(cmd, args->launch);
  cmd->add_option("--kv-pages", args->kv_pages,
                  "KV cache pages per DP replica, one kept for batch padding (default: on GPUs sized by "
                  "--mem-fraction-static, on CPU ranks 2048)");
  cmd->add_option("--mem-fraction-static,--gpu-memory-utilization", args->mem_fraction_static,
                  "Fraction of each GPU's memory for weights and KV cache; the rest is kept for activations, CUDA "
                  "graphs and cuBLAS (SGLang's flag; vLLM's name as alias; default 0.85)");
  cmd->add_flag("--disable-cuda-graph", args->disable_cuda_graph,
                "Run decode steps op by op instead of replaying CUDA graphs");
  cmd->add_option("--log-level", args->log_level,
                  "debug (also one line per request), info, warning, error or critical: what goes to stderr")
      ->capture_default_str();
  cmd->add_option("--tokenizer-path", args->tokenizer_path,
                  "A directory with tokenizer.json / tiktoken files to use instead of the model's");
  cmd->add_flag("--trust-remote-code", args->trust_remote_code,
                "Accepted so that SGLang and vLLM command lines run; meaningless here (no model code is loaded)");
  cmd->add_option("--random-seed", args->random_seed,
                  "Seed of the seeds drawn for requests that give none (default: random per request)")
      ->each([args](const std::string&) { args->random_seed_set = true; });
  cmd->add_option("--chunked-prefill-size", args->chunked_prefill_size,
                  "Prefill tokens per DP replica per step; longer prompts run in chunks (default: 8192 with "
                  "--backend cuda, SGLang's choice on 80+ GB GPUs; 512 on CPU ranks, where a step is slow)");
  cmd->add_option("--max-queued-requests", args->max_queued_requests,
                  "Requests waiting beyond --max-running-requests; more are refused with 429")
      ->capture_default_str();
  cmd->add_option("--pp-groups", args->pp_groups,
                  "Pipeline plans: groups of requests whose steps overlap across stages (0: one per stage; 1: one "
                  "step at a time)")
      ->capture_default_str();
  cmd->add_flag("--disable-radix-cache", args->disable_radix_cache, "Do not share KV pages of common prefixes");
  cmd->add_flag("--skip-warmup,--skip-server-warmup", args->skip_warmup,
                "Do not run the largest step and every padded decode size once at start-up "
                "(memory then grows while serving)");
  cmd->add_option("--min-step-ms", args->min_step_ms,
                  "Every engine step lasts at least this long, as on a slower device (for checking benchmark "
                  "clients on a loaded machine; 0: off)")
      ->capture_default_str();
  add_http_flags(cmd, *args);
  cmd->add_option("--chat-template", args->chat_template,
                  "Chat template: a built-in name or a .jinja file (default: the tokenizer's)");
  cmd->add_flag("--allow-special-tokens-in-content", args->special_tokens_in_content,
                "Special-token text in chat messages becomes those tokens (by default it is plain text, so that "
                "a message cannot forge another role's turn)");
  cmd->add_option("--tool-call-parser", args->tool_call_parser,
                  "Parse the model's tool calls into OpenAI tool_calls: kimi_k2, deepseek_v3, deepseek_v31, qwen3 "
                  "(requests with tools; tool_choice none turns it off)");
  cmd->add_option("--reasoning-parser", args->reasoning_parser,
                  "Return the model's thinking (<think>...</think>) as reasoning_content: kimi_k2, deepseek_r1");
  // Tests only, hidden: a request's "moeserve_test_script" text replaces the model's first
  // output tokens, so that the output path can be tested on formats no test model produces.
  cmd->add_flag("--test-scripted-output", args->test_scripted_output)->group("");
  cmd->callback([args] {
    if (args->backend.empty()) args->backend = runtime::default_backend();
    run_serve(*args);
  });
}

}  // namespace moeserve::apps
