// moeserve bench: the load generator (bench/) against a running server's routes,
// once per --concurrency value; prints sglang.bench_serving's summary and appends one JSON
// line per run to --output-file.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "apps/commands.h"
#include "bench/dataset.h"
#include "bench/protocol.h"
#include "bench/runner.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {

namespace {

struct BenchArgs {
  std::string base_url = "http://127.0.0.1:30000";
  std::string model;
  std::string api_key;
  std::string concurrency = "1";
  std::string request_rate = "inf";
  std::string output_file;
  bool output_details = false;
  bool disable_progress = false;
  std::string tokenizer;            // sharegpt: whose token counts
  int64_t sharegpt_output_len = 0;  // sharegpt: > 0 fixes every output length
  bench::DatasetOptions dataset;
  // sglang.bench_serving's flags (apps/cmd_bench.cc: what each does here).
  std::string backend = "sglang-oai";
  std::string host;
  int port = 0;
  std::string dataset_path;
  int64_t warmup_requests = 1;
  std::string extra_request_body;
  bool disable_stream = false;
  bool apply_chat_template = false;
  bool disable_ignore_eos = false;
  bool tokenize_prompt = false;
  bool flush_cache = false;
  std::string tag;
};

// The sglang.bench_serving flags checked and applied: moeserve bench sends what sglang's
// sglang-oai / vllm / openai (/v1/completions), sglang-oai-chat / vllm-chat (chat) and sglang
// (/generate) backends send, streamed; what it cannot do is refused.
void apply_sglang_flags(BenchArgs& args, bench::RunOptions& run) {
  const bench::Protocol protocol = bench::protocol_of(args.backend);
  MS_CHECK(protocol != bench::Protocol::kChat || args.dataset.name != "random-ids",
           "--backend {}: chat messages are text; use --dataset-name random or sharegpt", args.backend);
  run.backend = args.backend;
  run.token_ids = args.output_details;
  MS_CHECK(!args.disable_stream, "--disable-stream: moeserve bench times tokens as they stream; not supported");
  MS_CHECK(!args.apply_chat_template,
           "--apply-chat-template: use --backend sglang-oai-chat (the server applies its chat template)");
  if (!args.host.empty() || args.port > 0)
    args.base_url = "http://" + (args.host.empty() ? std::string("127.0.0.1") : args.host) + ":" +
                    std::to_string(args.port > 0 ? args.port : 30000);
  if (!args.dataset_path.empty()) {
    MS_CHECK(args.dataset.name == "random" || args.dataset.name == "sharegpt",
             "--dataset-path: only with --dataset-name sharegpt (got {})", args.dataset.name);
    args.dataset.name = "sharegpt:" + args.dataset_path;
  }
  // random-ids prompts are token ids already; random text is sent as text (the server tokenizes).
  MS_CHECK(!args.tokenize_prompt || args.dataset.name == "random-ids",
           "--tokenize-prompt: use --dataset-name random-ids (prompts as token ids)");
  run.ignore_eos = !args.disable_ignore_eos;
  if (!args.extra_request_body.empty()) {
    try {
      run.extra_body = nlohmann::ordered_json::parse(args.extra_request_body);
    } catch (const nlohmann::json::exception& e) {
      fail("--extra-request-body is not valid JSON: {}", e.what());
    }
    MS_CHECK(run.extra_body.is_object(), "--extra-request-body must be a JSON object");
  }
}

// POST /flush_cache (the admin route: --api-key must be the server's admin key).
void flush_server_cache(const bench::RunOptions& run) {
  bench::HttpCall call;
  call.method = "POST";
  call.path = "/flush_cache";
  if (!run.api_key.empty()) call.headers.emplace_back("Authorization", "Bearer " + run.api_key);
  const bench::HttpResponse response = bench::http_call(run.url, call);
  MS_CHECK(response.status == 200, "--flush-cache: POST /flush_cache answered {}: {}", response.status, response.body);
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    MS_CHECK(!item.empty() && end && *end == '\0' && v > 0, "{} '{}': expected positive integers separated by commas",
             flag, text);
    out.push_back(v);
  }
  MS_CHECK(!out.empty(), "{}: empty list", flag);
  return out;
}

double parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  MS_CHECK(end && *end == '\0' && v > 0, "--request-rate '{}': expected a positive number or inf", text);
  return v;
}

void print_summary(const bench::BenchMetrics& m, int64_t concurrency) {
  std::printf("============ Serving Benchmark Result (max concurrency %lld) ============\n",
              static_cast<long long>(concurrency));
  std::printf("%-40s %12lld\n", "Successful requests:", static_cast<long long>(m.completed));
  std::printf("%-40s %12lld\n", "Failed requests:", static_cast<long long>(m.failed));
  std::printf("%-40s %12.2f\n", "Benchmark duration (s):", m.duration_s);
  std::printf("%-40s %12lld\n", "Total input tokens:", static_cast<long long>(m.total_input_tokens));
  std::printf("%-40s %12lld\n", "Total generated tokens:", static_cast<long long>(m.total_output_tokens));
  std::printf("%-40s %12.2f\n", "Request throughput (req/s):", m.request_throughput);
  std::printf("%-40s %12.2f\n", "Input token throughput (tok/s):", m.input_throughput);
  std::printf("%-40s %12.2f\n", "Output token throughput (tok/s):", m.output_throughput);
  std::printf("%-40s %12.2f\n", "Total token throughput (tok/s):", m.total_throughput);
  if (m.accept_length > 0) std::printf("%-40s %12.2f\n", "Accept length:", m.accept_length);
  std::printf("%-40s %12.2f\n", "Concurrency:", m.concurrency);
  const std::pair<const char*, const bench::Distribution*> rows[] = {
      {"E2E Latency", &m.e2e_latency_ms}, {"TTFT", &m.ttft_ms}, {"TPOT", &m.tpot_ms}, {"ITL", &m.itl_ms}};
  for (const auto& [name, d] : rows)
    std::printf("%-12s (ms) mean %10.2f  median %10.2f  p90 %10.2f  p99 %10.2f\n", name, d->mean, d->median, d->p90,
                d->p99);
  std::fflush(stdout);
}

void run_bench_command(BenchArgs args) {
  bench::RunOptions run;
  apply_sglang_flags(args, run);
  run.url = bench::parse_http_url(args.base_url, "--base-url");
  run.api_key = args.api_key;
  run.model = args.model.empty() ? bench::served_model(run.url, args.api_key) : args.model;
  run.request_rate = parse_rate(args.request_rate);
  run.seed = args.dataset.seed;
  run.progress = !args.disable_progress;
  const std::vector<int64_t> levels = parse_int_list(args.concurrency, "--concurrency");
  std::vector<bench::BenchPrompt> prompts;
  const std::string sharegpt = "sharegpt:";
  if (args.dataset.name.rfind(sharegpt, 0) == 0) {
    MS_CHECK(!args.tokenizer.empty(),
             "--dataset {}: needs --tokenizer (a model directory or \"synthetic\") to count tokens", args.dataset.name);
    const auto tok = tokenizer::load_tokenizer(args.tokenizer);
    prompts = bench::sharegpt_prompts(args.dataset.name.substr(sharegpt.size()), args.dataset.num_prompts,
                                      args.sharegpt_output_len, args.dataset.seed, [&](const std::string& text) {
                                        return static_cast<int64_t>(tok->encode(text, false).size());
                                      });
    if (static_cast<int64_t>(prompts.size()) < args.dataset.num_prompts)
      std::fprintf(stderr, "bench: %s holds %zu usable conversations, fewer than --num-prompts %lld\n",
                   args.dataset.name.c_str(), prompts.size(), static_cast<long long>(args.dataset.num_prompts));
  } else {
    prompts = bench::make_prompts(args.dataset);
  }
  std::ofstream out;
  if (!args.output_file.empty()) {
    out.open(args.output_file, std::ios::app);
    MS_CHECK(out.good(), "--output-file '{}': cannot open for appending", args.output_file);
  }
  if (args.flush_cache) flush_server_cache(run);
  if (args.warmup_requests > 0 && !prompts.empty()) {  // as sglang: short requests, not counted
    std::vector<bench::BenchPrompt> warmup(static_cast<size_t>(args.warmup_requests), prompts[0]);
    for (auto& p : warmup) p.output_len = std::min<int64_t>(p.output_len, 16);
    bench::RunOptions quiet = run;
    quiet.progress = false;
    quiet.max_concurrency = args.warmup_requests;
    const bench::RunResult warmed = bench::run_benchmark(quiet, warmup);
    for (const bench::RequestOutcome& o : warmed.outcomes)
      MS_CHECK(o.error.empty(), "bench: a warm-up request failed: {}", o.error);
  }
  const nlohmann::ordered_json info = bench::server_info(run.url, run.api_key);
  int64_t failed = 0;
  for (int64_t concurrency : levels) {
    run.max_concurrency = concurrency;
    const bench::RunResult result = bench::run_benchmark(run, prompts);
    print_summary(result.metrics, concurrency);
    failed += result.metrics.failed;
    for (const bench::RequestOutcome& o : result.outcomes)
      if (!o.success) {
        std::fprintf(stderr, "bench: a request failed: %s\n", o.error.c_str());
        break;
      }
    if (out.is_open()) {
      nlohmann::ordered_json line = bench::run_json(run, args.dataset, result, args.output_details);
      line["tag"] = args.tag.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(args.tag);
      line["server_info"] = info;
      out << line.dump() << "\n";
      out.flush();
    }
  }
  MS_CHECK(failed == 0, "bench: {} requests failed", failed);
}

void add_sglang_flags(CLI::App* cmd, BenchArgs& args) {
  cmd->add_option("--backend", args.backend,
                  "sglang.bench_serving's backend: sglang-oai, vllm, openai (/v1/completions), sglang-oai-chat, "
                  "vllm-chat (/v1/chat/completions) or sglang (/generate)")
      ->capture_default_str();
  cmd->add_option("--host", args.host, "The server's host (with --port: instead of --base-url)");
  cmd->add_option("--port", args.port, "The server's port");
  cmd->add_option("--dataset-path", args.dataset_path, "The ShareGPT JSON file of --dataset-name sharegpt");
  cmd->add_option("--warmup-requests", args.warmup_requests, "Requests sent (and not counted) before each run")
      ->capture_default_str();
  cmd->add_option("--extra-request-body", args.extra_request_body,
                  "A JSON object merged into every request body (e.g. '{\"top_k\": 5}')");
  cmd->add_flag("--disable-stream", args.disable_stream, "Refused: tokens are timed as they stream");
  cmd->add_flag("--apply-chat-template", args.apply_chat_template, "Refused: --backend sglang-oai-chat sends chats");
  cmd->add_flag("--disable-ignore-eos", args.disable_ignore_eos, "Let requests stop at EOS (ignore_eos false)");
  cmd->add_flag("--tokenize-prompt", args.tokenize_prompt,
                "Send prompts as token ids (what --dataset-name random-ids does)");
  cmd->add_flag("--flush-cache", args.flush_cache, "POST /flush_cache before the runs (needs the admin key)");
  cmd->add_option("--tag", args.tag, "A label written into every JSON line");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Load-test a running server (sglang.bench_serving's metrics)");
  cmd->add_option("--base-url", args->base_url, "The server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--model", args->model, "The model clients send (default: the server's first model)");
  cmd->add_option("--api-key", args->api_key, "Bearer key, when the server needs one");
  cmd->add_option("--concurrency,--max-concurrency", args->concurrency,
                  "Requests in flight at most; a comma list runs once per value")
      ->capture_default_str();
  cmd->add_option("--num-prompts", args->dataset.num_prompts, "Requests per run")->capture_default_str();
  cmd->add_option("--dataset,--dataset-name", args->dataset.name,
                  "random (text), random-ids (token ids) or sharegpt:FILE (ShareGPT JSON)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "sharegpt: the served model's directory (or \"synthetic\"), to count prompt and reply tokens");
  cmd->add_option("--sharegpt-output-len", args->sharegpt_output_len,
                  "sharegpt: every output this long (0: the reply's token count)")
      ->capture_default_str();
  cmd->add_option("--random-input-len", args->dataset.input_len, "Longest prompt (words or ids)")
      ->capture_default_str();
  cmd->add_option("--random-output-len", args->dataset.output_len, "Longest output (max_tokens, ignore_eos)")
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", args->dataset.range_ratio,
                  "Lengths drawn from [len * ratio, len] (1: exactly len)")
      ->capture_default_str();
  cmd->add_option("--vocab-size", args->dataset.vocab_size, "random-ids: ids drawn from [0, N)")->capture_default_str();
  cmd->add_option("--request-rate", args->request_rate, "Poisson arrivals per second, or inf (all at once)")
      ->capture_default_str();
  cmd->add_option("--seed", args->dataset.seed, "Seed of prompts, lengths and arrivals")->capture_default_str();
  cmd->add_option("--output-file", args->output_file, "Append one JSON line per run (sglang's fields)");
  cmd->add_flag("--output-details", args->output_details,
                "Also write per-request lengths, TTFTs, ITLs, texts, token ids and errors");
  cmd->add_flag("--disable-tqdm,--no-progress", args->disable_progress, "No progress bar or lines");
  add_sglang_flags(cmd, *args);
  cmd->callback([args] { run_bench_command(*args); });
}

}  // namespace moeserve::apps
