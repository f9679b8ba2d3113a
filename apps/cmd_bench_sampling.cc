// moeserve bench-sampling: the host's full-row sampler (cpu::sample_row: the logits head's
// draws, and the candidates' fallback for rows whose filters reach past them) on rows of
// random logits, one thread: milliseconds per row and a checksum of the drawn ids (equal
// checksums: equal tokens, so two builds can be compared).
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/commands.h"
#include "backend/cpu/sampling.h"
#include "core/error.h"
#include "core/random.h"

namespace moeserve::apps {

namespace {

struct BenchSamplingArgs {
  int64_t vocab = 163840;
  int64_t rows = 32;
  float spread = 0.5f;  // logits uniform in [-spread, spread]: a random model's nearly flat rows
  float temperature = 0.8f;
  float top_p = 0.9f;
  int top_k = 0;
  int repeat = 3;
};

void run_bench_sampling(const BenchSamplingArgs& args) {
  MS_CHECK(args.vocab > 0 && args.rows > 0 && args.repeat > 0, "bench-sampling: --vocab, --rows and --repeat must be positive");
  std::vector<float> logits(static_cast<size_t>(args.vocab * args.rows));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = args.spread * uniform_pm1(7, i);
  ops::SamplingOptions o;
  o.temperature = args.temperature;
  o.top_p = args.top_p;
  o.top_k = args.top_k;
  o.seed = 3;
  double best_ms = 0;
  int64_t checksum = 0;
  for (int rep = 0; rep < args.repeat; ++rep) {
    checksum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < args.rows; ++r) {
      o.step = static_cast<uint64_t>(r);
      checksum += cpu::sample_row(logits.data() + r * args.vocab, args.vocab, o);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best_ms = rep == 0 ? ms : std::min(best_ms, ms);
  }
  std::printf("vocab %lld, %lld rows, logits in [-%g, %g], temperature %g, top_p %g, top_k %d: %.3f ms per row "
              "(best of %d), checksum %lld\n",
              (long long)args.vocab, (long long)args.rows, args.spread, args.spread, args.temperature, args.top_p,
              args.top_k, best_ms / static_cast<double>(args.rows), args.repeat, (long long)checksum);
}

}  // namespace

void add_bench_sampling_command(CLI::App& app) {
  auto args = std::make_shared<BenchSamplingArgs>();
  CLI::App* cmd = app.add_subcommand("bench-sampling", "Time the host's full-row sampler on random logits (one thread)");
  cmd->add_option("--vocab", args->vocab, "Vocabulary size")->capture_default_str();
  cmd->add_option("--rows", args->rows, "Rows sampled per repetition")->capture_default_str();
  cmd->add_option("--spread", args->spread, "Logits uniform in [-spread, spread]")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus mass (1: off)")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Top-k cut (0: off)")->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Repetitions (the best is reported)")->capture_default_str();
  cmd->callback([args] { run_bench_sampling(*args); });
}

}  // namespace moeserve::apps
