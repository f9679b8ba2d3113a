// moeserve bench: the load generator (bench/) against a running server's /v1/completions,
// once per --concurrency value; prints sglang.bench_serving's summary and appends one JSON
// line per run to --output-file.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "apps/commands.h"
#include "bench/dataset.h"
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
};

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

void run_bench_command(const BenchArgs& args) {
  bench::RunOptions run;
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
      out << bench::run_json(run, args.dataset, result, args.output_details).dump() << "\n";
      out.flush();
    }
  }
  MS_CHECK(failed == 0, "bench: {} requests failed", failed);
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
  cmd->callback([args] { run_bench_command(*args); });
}

}  // namespace moeserve::apps
