// moeserve bench-step: the decode step alone, per batch size, against the hardware ceilings
// measured in the same run (device-to-device copy bandwidth, large bf16 GEMM rate).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "apps/plan_cli.h"
#include "core/error.h"
#include "model/model_source.h"
#include "runtime/prefill_benchmark.h"
#include "runtime/rank_devices.h"
#include "runtime/step_benchmark.h"

#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/ceilings.h"
#endif

namespace moeserve::apps {

namespace {

struct BenchStepArgs {
  std::string model = "synthetic:kimi-k2.6";
  int64_t layers = 0;
  std::string batches = "1,8,32,64,128";
  PlanCliArgs plan;
  int64_t context = 1024;
  int iterations = 20;
  int warmup = 3;
  bool breakdown = false;
  bool no_cuda_graph = false;
  std::string backend;
  std::string json_out;
  int64_t page_size = 64;
  std::string reduction_plan = "single";
  bool batch_invariant = false;
  std::string kv_cache_dtype = "auto";
  std::string prefill;              // prompt lengths: time prefill passes instead of decode steps
  std::string verify_tokens = "1";  // tokens per sequence: > 1 times speculative verify steps
  double accept_length = 4;         // tokens a verify step yields, for the expected speedup
};

// --verify-tokens as widths, 1 first (every other width is compared with it); --accept-length
// checked with them, before the model is loaded.
std::vector<int64_t> verify_widths(const BenchStepArgs& args) {
  MS_CHECK(args.accept_length >= 1, "--accept-length: tokens per verify step must be >= 1, got {}", args.accept_length);
  std::vector<int64_t> widths{1};
  for (int32_t w : parse_id_list(args.verify_tokens, "--verify-tokens")) {
    MS_CHECK(w >= 1 && w <= 64, "--verify-tokens: tokens per sequence must be in [1, 64], got {}", w);
    if (std::find(widths.begin(), widths.end(), w) == widths.end()) widths.push_back(w);
  }
  return widths;
}

std::string model_spec(const BenchStepArgs& args) {
  std::string spec = args.model;
  if (args.layers > 0) {
    MS_CHECK(spec.rfind("synthetic:", 0) == 0, "--layers: only synthetic models take a layer override (got '{}')",
             spec);
    spec += ":layers=" + std::to_string(args.layers);
  }
  return spec;
}

runtime::EngineOptions engine_options(const BenchStepArgs& args, const ModelSource& model,
                                      const std::vector<int64_t>& batches, const std::vector<int64_t>& widths) {
  runtime::EngineOptions options;
  options.backend = !args.backend.empty() ? args.backend : runtime::default_backend();
  options.graphs = !args.no_cuda_graph;
  options.plan = plan_for_model(args.plan, model.config, options.backend == "cuda" ? 2 : 4);
  options.page_size = args.page_size;
  options.run = run_options_for(args.reduction_plan);
  options.batch_invariant = args.batch_invariant;
  options.kv_cache_fp8 = kv_cache_fp8(args.kv_cache_dtype);
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t per_replica = (max_batch + options.plan.attn_dp - 1) / options.plan.attn_dp;
  // Pipeline plans also run one group of the batch per stage in flight (pp times the sequences).
  const int64_t end = args.context + *std::max_element(widths.begin(), widths.end());
  options.num_pages = per_replica * options.plan.pp * ((end + args.page_size - 1) / args.page_size);
  if (!args.prefill.empty()) {
    int64_t longest = 0;
    for (int32_t n : parse_id_list(args.prefill, "--prefill")) longest = std::max<int64_t>(longest, n);
    options.num_pages = std::max(options.num_pages, runtime::prefill_pages(longest, args.page_size));
  }
  return options;
}

// The hardware ceilings each row is compared with (zero: not measured, e.g. on the CPU).
struct Ceilings {
  double copy_gbs = 0;
  double bf16_tflops = 0;
};

Ceilings measured_ceilings(const std::string& backend) {
  Ceilings ceilings;
#ifdef MOESERVE_WITH_CUDA
  if (backend == "cuda") {
    const cuda::Ceilings c = cuda::measure_ceilings(0);
    ceilings.copy_gbs = c.copy_gbs;
    ceilings.bf16_tflops = c.bf16_tflops;
  }
#endif
  return ceilings;
}

double fraction(double value, double ceiling) { return ceiling > 0 ? value / ceiling : 0.0; }

// Asynchronous pipelining: each stage runs one group's step while the next runs another's.
nlohmann::json report_pipelined(const runtime::StepBenchResult& r, const Ceilings& ceilings) {
  const runtime::PipelinedResult& p = *r.pipelined;
  const double p_bytes = p.max_rank_bytes();
  const double p_gbs = p_bytes / (p.group_step_ms() * 1e-3) / 1e9;
  std::printf(
      "  pipelined, %d groups of %lld in flight: %.3f ms per group step (%.3f per round), %.1f tok/s, "
      "%.3f GB/GPU/group step, %.1f GB/s/GPU, %.1f%% of copy\n",
      p.groups, (long long)r.batch, p.group_step_ms(), p.round_ms, p.tokens_per_s, p_bytes / 1e9, p_gbs,
      100 * fraction(p_gbs, ceilings.copy_gbs));
  return {{"groups", p.groups},
          {"group_step_ms", p.group_step_ms()},
          {"round_ms", p.round_ms},
          {"tokens_per_s", p.tokens_per_s},
          {"bytes_per_gpu", p_bytes},
          {"gbs_per_gpu", p_gbs},
          {"copy_fraction", fraction(p_gbs, ceilings.copy_gbs)}};
}

void report_ops(const runtime::StepBenchResult& r, nlohmann::json& row) {
  std::printf("  per op (rank 0, graphs off): ");
  double total = 0;
  for (const auto& [op, t] : r.op_ms_per_step) total += t.second;
  for (const auto& [op, t] : r.op_ms_per_step) {
    std::printf("%s %.3f ms (%lld calls, %.0f%%); ", op.c_str(), t.second, (long long)t.first, 100 * t.second / total);
    row["ops"][op] = {{"calls", t.first}, {"ms", t.second}};
  }
  std::printf("\n");
}

void report_comm(const runtime::StepBenchResult& r, nlohmann::json& row) {
  for (const auto& c : r.comm) {
    std::printf("  comm %-8s %-14s %3lld calls x %10.0f B: %.3f ms/step in the step, %.3f ms/step alone\n",
                c.group.c_str(), c.collective.c_str(), (long long)c.calls_per_step, c.bytes_per_call, c.ms_per_step,
                c.ms_alone_per_step);
    row["comm"].push_back({{"group", c.group},
                           {"collective", c.collective},
                           {"calls_per_step", c.calls_per_step},
                           {"bytes_per_call", c.bytes_per_call},
                           {"ms_per_step", c.ms_per_step},
                           {"ms_alone_per_step", c.ms_alone_per_step}});
  }
}

// One batch size: its table line (and the pipelined, per-op and communication lines) and its JSON row.
nlohmann::json report_row(const runtime::StepBenchResult& r, int world, const Ceilings& ceilings) {
  const double bytes = r.max_rank_bytes();
  const double gbs = bytes / (r.step_ms * 1e-3) / 1e9;
  const double tflops = r.total_flops() / world / (r.step_ms * 1e-3) / 1e12;
  std::string hit;
  for (int64_t h : r.experts_hit_per_rank[0]) hit += (hit.empty() ? "" : ",") + std::to_string(h);
  std::printf("%6lld %10.3f %11.1f %12.3f %10.1f %7.1f%% %10.2f %7.1f%% %12s\n", (long long)r.batch, r.step_ms,
              r.tokens_per_s, bytes / 1e9, gbs, 100 * fraction(gbs, ceilings.copy_gbs), tflops,
              100 * fraction(tflops, ceilings.bf16_tflops), hit.c_str());
  nlohmann::json row = {{"batch", r.batch},
                        {"step_ms", r.step_ms},
                        {"tokens_per_s", r.tokens_per_s},
                        {"bytes_per_gpu", bytes},
                        {"kv_bytes_rank0", r.cost_per_rank[0].kv_bytes},
                        {"gbs_per_gpu", gbs},
                        {"copy_fraction", fraction(gbs, ceilings.copy_gbs)},
                        {"tflops_per_gpu", tflops},
                        {"gemm_fraction", fraction(tflops, ceilings.bf16_tflops)},
                        {"experts_hit_rank0", r.experts_hit_per_rank[0]}};
  if (r.pipelined) row["pipelined"] = report_pipelined(r, ceilings);
  if (!r.op_ms_per_step.empty()) report_ops(r, row);
  report_comm(r, row);
  return row;
}

// Prefill passes of one prompt per length: time, tokens/s and the FLOP rate against the GEMM ceiling.
void run_prefill(runtime::Engine& engine, const BenchStepArgs& args, int world, const Ceilings& ceilings) {
  const std::vector<int32_t> ids = parse_id_list(args.prefill, "--prefill");
  const std::vector<int64_t> lengths(ids.begin(), ids.end());
  const auto results = runtime::benchmark_prefill(engine, lengths, {.iterations = std::max(1, args.iterations / 4)});
  std::printf("%8s %10s %11s %10s %8s %12s\n", "prompt", "ms", "tok/s", "TFLOP/s", "of GEMM", "attention");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : results) {
    const double tflops = r.flops / world / (r.ms * 1e-3) / 1e12;
    std::printf("%8lld %10.2f %11.0f %10.1f %7.1f%% %11.1f%%\n", (long long)r.tokens, r.ms, r.tokens_per_s, tflops,
                100 * fraction(tflops, ceilings.bf16_tflops), 100 * fraction(r.attention_flops, r.flops));
    rows.push_back({{"tokens", r.tokens},
                    {"ms", r.ms},
                    {"tokens_per_s", r.tokens_per_s},
                    {"flops", r.flops},
                    {"attention_flops", r.attention_flops},
                    {"tflops_per_gpu", tflops},
                    {"gemm_fraction", fraction(tflops, ceilings.bf16_tflops)}});
  }
  if (!args.json_out.empty()) std::ofstream(args.json_out) << nlohmann::json{{"prefill", rows}}.dump(2) << "\n";
}

// Verify steps against the 1-token step of the same batch: each width's cost ratio and, at
// an accept length of L tokens per verify step (possible from L tokens per sequence on), the
// expected speedup L * t(1) / t(w). The drafter's own cost is not in it.
nlohmann::json report_verify(const std::vector<std::vector<runtime::StepBenchResult>>& by_width, double accept_length) {
  std::printf(
      "\nverify steps against the 1-token step (cost ratio; expected speedup at accept length %.2f, "
      "drafting not counted)\n%6s",
      accept_length, "batch");
  for (const auto& w : by_width) std::printf(" %12lld tok", (long long)w[0].tokens_per_seq);
  std::printf("\n");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t b = 0; b < by_width[0].size(); ++b) {
    const double one = by_width[0][b].step_ms;
    std::printf("%6lld", (long long)by_width[0][b].batch);
    for (const auto& w : by_width) {
      const runtime::StepBenchResult& r = w[b];
      const double ratio = r.step_ms / one;
      nlohmann::json row = {{"batch", r.batch}, {"tokens_per_seq", r.tokens_per_seq}, {"cost_ratio", ratio}};
      if (static_cast<double>(r.tokens_per_seq) >= accept_length) {
        row["expected_speedup"] = accept_length / ratio;
        std::printf(" %7.2f (%5.2fx)", ratio, accept_length / ratio);
      } else {
        std::printf(" %7.2f         ", ratio);
      }
      rows.push_back(row);
    }
    std::printf("\n");
  }
  return rows;
}

// The decode steps' tables (one per verify width), the verify summary, and the JSON file.
void report_decode(const std::vector<std::vector<runtime::StepBenchResult>>& by_width, const BenchStepArgs& args,
                   const runtime::EngineOptions& options, const std::string& spec, const Ceilings& ceilings) {
  std::printf("model %s, plan %s (%d rank%s, %s), context %lld, CUDA graphs %s, reduction plan %s%s%s\n", spec.c_str(),
              options.plan.name.c_str(), options.plan.world(), options.plan.world() > 1 ? "s" : "",
              options.backend.c_str(), (long long)args.context, options.graphs ? "on" : "off",
              options.run.reduction_plan.name.c_str(), options.batch_invariant ? ", batch-invariant kernels" : "",
              options.kv_cache_fp8 ? ", fp8_e4m3 KV cache" : "");
  if (ceilings.copy_gbs > 0)
    std::printf("ceilings (GPU 0, measured now): copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", ceilings.copy_gbs,
                ceilings.bf16_tflops);
  nlohmann::json rows = nlohmann::json::array(), verify = nlohmann::json::array();
  for (const auto& results : by_width) {
    const int64_t w = results[0].tokens_per_seq;
    if (by_width.size() > 1)
      std::printf("%s%lld token%s per sequence%s\n", w > 1 ? "\n" : "", (long long)w, w > 1 ? "s" : "",
                  w > 1 ? " (verify steps: tok/s counts every token computed)" : "");
    std::printf("%6s %10s %11s %12s %10s %8s %10s %8s %12s\n", "batch", "step ms", "tok/s", "GB/GPU/step", "GB/s/GPU",
                "of copy", "TFLOP/s", "of GEMM", "experts hit");
    for (const auto& r : results) {
      nlohmann::json row = report_row(r, options.plan.world(), ceilings);
      row["tokens_per_seq"] = w;
      (w == 1 ? rows : verify).push_back(row);
    }
  }
  nlohmann::json speedups = by_width.size() > 1 ? report_verify(by_width, args.accept_length) : nlohmann::json();
  if (!args.json_out.empty()) {
    nlohmann::json doc = {{"model", spec},
                          {"plan", options.plan.name},
                          {"world", options.plan.world()},
                          {"backend", options.backend},
                          {"context", args.context},
                          {"graphs", options.graphs},
                          {"batch_invariant", options.batch_invariant},
                          {"kv_cache_dtype", options.kv_cache_fp8 ? "fp8_e4m3" : "bf16"},
                          {"copy_gbs", ceilings.copy_gbs},
                          {"bf16_tflops", ceilings.bf16_tflops},
                          {"rows", rows}};
    if (by_width.size() > 1) {
      doc["verify_rows"] = verify;
      doc["accept_length"] = args.accept_length;
      doc["verify"] = speedups;
    }
    std::ofstream(args.json_out) << doc.dump(2) << "\n";
  }
}

void run_bench_step(const BenchStepArgs& args) {
  const std::string spec = model_spec(args);
  const std::vector<int64_t> widths = verify_widths(args);
  const ModelSource model = open_model(spec);
  const std::vector<int32_t> batch_ids = parse_id_list(args.batches, "--batch");
  const std::vector<int64_t> batches(batch_ids.begin(), batch_ids.end());
  const runtime::EngineOptions options = engine_options(args, model, batches, widths);
  const Ceilings ceilings = measured_ceilings(options.backend);  // before the engine takes the GPU's memory
  runtime::Engine engine(model, options);
  if (!args.prefill.empty()) {
    std::printf("model %s, plan %s, prefill of one prompt per length%s\n", spec.c_str(), options.plan.name.c_str(),
                options.kv_cache_fp8 ? ", fp8_e4m3 KV cache" : "");
    if (ceilings.bf16_tflops > 0)
      std::printf("ceiling (GPU 0, measured now): bf16 GEMM %.0f TFLOP/s\n", ceilings.bf16_tflops);
    run_prefill(engine, args, options.plan.world(), ceilings);
    return;
  }
  runtime::StepBenchOptions bench;
  bench.context = args.context;
  bench.iterations = args.iterations;
  bench.warmup = args.warmup;
  bench.breakdown = args.breakdown;
  std::vector<std::vector<runtime::StepBenchResult>> by_width;  // [width][batch]
  for (int64_t w : widths) {
    bench.tokens_per_seq = w;
    by_width.push_back(runtime::benchmark_decode_steps(engine, batches, bench));
  }

  report_decode(by_width, args, options, spec, ceilings);
}

}  // namespace

void add_bench_step_command(CLI::App& app) {
  auto args = std::make_shared<BenchStepArgs>();
  CLI::App* cmd =
      app.add_subcommand("bench-step", "Time the decode step per batch size against measured hardware ceilings");
  cmd->add_option("--model,-m", args->model, "Model spec (synthetic:NAME or a directory)")->capture_default_str();
  cmd->add_option("--layers", args->layers, "Override the layer count of a synthetic model");
  cmd->add_option("--batch", args->batches, "Batch sizes, comma-separated")->capture_default_str();
  cmd->add_option("--plan", args->plan.preset, "Parallel plan preset (default single)");
  add_plan_flags(cmd, args->plan);
  cmd->add_option("--context", args->context, "Cached tokens per sequence")->capture_default_str();
  cmd->add_option("--iterations", args->iterations, "Timed steps per batch size (median reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_flag("--breakdown", args->breakdown, "Per-op times on rank 0 (GPU)");
  cmd->add_flag("--no-cuda-graph", args->no_cuda_graph, "Run steps op by op instead of replaying CUDA graphs");
  cmd->add_option("--backend", args->backend, "cpu, cpu-bf16 or cuda (default: cuda when a GPU is visible)");
  cmd->add_option("--json", args->json_out, "Also write the results as JSON");
  cmd->add_option("--page-size", args->page_size, "KV cache page size")->capture_default_str();
  add_reduction_plan_flag(cmd, args->reduction_plan);
  add_batch_invariant_flag(cmd, args->batch_invariant);
  cmd->add_option("--prefill", args->prefill,
                  "Prompt lengths, comma-separated: time one prompt's prefill pass per length instead of decode steps");
  add_kv_cache_dtype_flag(cmd, args->kv_cache_dtype);
  cmd->add_option("--verify-tokens", args->verify_tokens,
                  "Tokens per sequence, comma-separated: also time speculative verify steps of each width against "
                  "the 1-token step")
      ->capture_default_str();
  cmd->add_option("--accept-length", args->accept_length,
                  "Tokens per verify step assumed for the expected speedup of --verify-tokens")
      ->capture_default_str();
  cmd->callback([args] { run_bench_step(*args); });
}

}  // namespace moeserve::apps
