// moeserve bench-sampling: the host's full-row sampler (cpu::sample_row: the logits head's
// draws) on rows of random logits, one thread: milliseconds per row and a checksum of the
// drawn ids (equal checksums: equal tokens, so two builds can be compared). With
// `--backend cuda`, beside it the device's whole-row draw of the same rows in one call
// (ops::SampleParams: the candidates' fallback for rows whose filters reach past them), timed
// from the call to the tokens on the host, and whether it drew the host's tokens.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "backend/cpu/sampling.h"
#include "core/error.h"
#include "core/random.h"
#include "runtime/rank_devices.h"

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
  std::string backend = "cpu";  // cuda: the device's draw too
};

void run_bench_sampling(const BenchSamplingArgs& args) {
  MS_CHECK(args.vocab > 0 && args.rows > 0 && args.repeat > 0,
           "bench-sampling: --vocab, --rows and --repeat must be positive");
  std::vector<float> logits(static_cast<size_t>(args.vocab * args.rows));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = args.spread * uniform_pm1(7, i);
  ops::SamplingOptions o;
  o.temperature = args.temperature;
  o.top_p = args.top_p;
  o.top_k = args.top_k;
  o.seed = 3;
  std::vector<ops::SamplingOptions> options(static_cast<size_t>(args.rows), o);
  for (int64_t r = 0; r < args.rows; ++r) options[r].step = static_cast<uint64_t>(r);
  auto best_of = [&](const std::function<void()>& run) {
    double best = 0;
    for (int rep = 0; rep < args.repeat; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      best = rep == 0 ? ms : std::min(best, ms);
    }
    return best;
  };
  std::vector<int32_t> host(static_cast<size_t>(args.rows));
  const double host_ms = best_of([&] {
    for (int64_t r = 0; r < args.rows; ++r)
      host[r] = cpu::sample_row(logits.data() + r * args.vocab, args.vocab, options[r]);
  });
  int64_t checksum = 0;
  for (int32_t id : host) checksum += id;
  std::printf(
      "vocab %lld, %lld rows, logits in [-%g, %g], temperature %g, top_p %g, top_k %d: %.3f ms per row "
      "(best of %d), checksum %lld\n",
      (long long)args.vocab, (long long)args.rows, args.spread, args.spread, args.temperature, args.top_p, args.top_k,
      host_ms / static_cast<double>(args.rows), args.repeat, (long long)checksum);
  if (args.backend == "cpu") return;
  std::unique_ptr<ops::Backend> device = runtime::make_rank_backend(args.backend, 0);
  ops::BufferPtr d_logits = device->alloc(logits.size() * 4), d_tokens = device->alloc(host.size() * 4);
  device->upload(*d_logits, 0, logits.data(), logits.size() * 4);
  std::vector<int32_t> drawn(host.size());
  const double device_ms = best_of([&] {
    device->sample({static_cast<const float*>(d_logits->data()), options.data(),
                    static_cast<int32_t*>(d_tokens->data()), args.rows, args.vocab});
    device->download(drawn.data(), *d_tokens, 0, drawn.size() * 4);
  });
  std::printf(
      "%s whole-row draw of the same %lld rows in one call: %.3f ms (%.4f ms per row, %.1fx the host's "
      "thread), %s tokens\n",
      args.backend.c_str(), (long long)args.rows, device_ms, device_ms / static_cast<double>(args.rows),
      host_ms / device_ms, drawn == host ? "the host's" : "DIFFERENT");
  MS_CHECK(drawn == host, "bench-sampling: the {} backend drew different tokens from the host", args.backend);
}

}  // namespace

void add_bench_sampling_command(CLI::App& app) {
  auto args = std::make_shared<BenchSamplingArgs>();
  CLI::App* cmd =
      app.add_subcommand("bench-sampling", "Time the host's full-row sampler on random logits (one thread)");
  cmd->add_option("--vocab", args->vocab, "Vocabulary size")->capture_default_str();
  cmd->add_option("--rows", args->rows, "Rows sampled per repetition")->capture_default_str();
  cmd->add_option("--spread", args->spread, "Logits uniform in [-spread, spread]")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus mass (1: off)")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Top-k cut (0: off)")->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Repetitions (the best is reported)")->capture_default_str();
  cmd->add_option("--backend", args->backend, "cuda: also the device's whole-row draw of the same rows")
      ->capture_default_str();
  cmd->callback([args] { run_bench_sampling(*args); });
}

}  // namespace moeserve::apps
