// moeserve plan calibrate: measures this machine's CPU ranks and writes a hardware profile the
// advisor reads (`plan advise --hardware FILE`). Every field's source is the measurement that
// produced it: memory copy bandwidth (memcpy), the CPU backend's projection (linear op) at
// several batch sizes (its rate and streaming efficiency), the fixed time per layer and per
// step of decode steps (runtime::benchmark_decode_steps, as bench-step runs them, minus what
// the measured curves predict), and the in-process communicator's collectives (latency per
// group size, bandwidth).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "apps/plan_advise.h"
#include "backend/cpu/cpu_backend.h"
#include "comm/in_process.h"
#include "core/error.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"
#include "perf/advisor.h"
#include "perf/collective_model.h"
#include "runtime/prefill_benchmark.h"
#include "runtime/step_benchmark.h"

namespace moeserve::apps {

namespace {

using Clock = std::chrono::steady_clock;

struct CalibrateArgs {
  std::string out;
  int devices = 8;
  std::string model = "synthetic:small";
  double seconds_scale = 1.0;  // repetitions scale (tests use less)
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best of `repeats` timings of fn, seconds.
template <typename Fn>
double best_time(int repeats, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t = Clock::now();
    fn();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

double copy_gbs(const CalibrateArgs& a) {
  const size_t bytes = 256u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double t = best_time(std::max(2, static_cast<int>(5 * a.seconds_scale)),
                             [&] { std::memcpy(dst.data(), src.data(), bytes); });
  return static_cast<double>(bytes) / t / 1e9;
}

struct LinearPoint {
  double tokens, seconds, bytes, flops;
};

// The CPU backend's linear op on the model's dense-MLP projection, [intermediate, hidden] fp32
// (the shapes whose cache behaviour the model's steps see).
std::vector<LinearPoint> measure_linear(const CalibrateArgs& a) {
  const ModelConfig c = open_model(a.model).config;
  auto backend = cpu::make_cpu_backend();
  const int64_t in = c.hidden_size, out = c.intermediate_size, max_rows = 128;
  auto weight = backend->alloc(in * out * 4);
  auto x = backend->alloc(max_rows * in * 4);
  auto y = backend->alloc(max_rows * out * 4);
  std::vector<float> host(static_cast<size_t>(std::max(in * out, max_rows * in)), 0.01f);
  backend->upload(*weight, 0, host.data(), static_cast<size_t>(in * out) * 4);
  backend->upload(*x, 0, host.data(), static_cast<size_t>(max_rows * in) * 4);
  std::vector<LinearPoint> points;
  for (int64_t rows : {1, 8, 32, 64, 128}) {
    ops::LinearParams p{x->data(), weight->data(), y->data(), rows, in, out, in, out};
    const int reps = std::max(2, static_cast<int>(10 * a.seconds_scale));
    const double t = best_time(reps, [&] { backend->linear(p); });
    points.push_back(
        {static_cast<double>(rows), t, static_cast<double>((in * out + rows * (in + out)) * 4), 2.0 * rows * in * out});
  }
  return points;
}

// Seconds per call of fn(comm, rank) on every rank of an in-process world of n ranks: the best
// of three rounds of `calls` calls (the machine may be shared: the least disturbed round).
template <typename Fn>
double collective_seconds(int n, int calls, Fn&& fn) {
  comm::InProcessWorld world(n);
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(world.communicator(r, "calibrate", members));
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        for (int i = 0; i < calls; ++i) fn(*comms[r], r);
      });
    for (auto& th : threads) th.join();
    best = std::min(best, seconds_since(t) / calls);
  }
  return best;
}

void measure_link(const CalibrateArgs& a, perf::HardwareProfile& p) {
  const int calls = std::max(20, static_cast<int>(200 * a.seconds_scale));
  std::string alpha_text;
  for (int n = 2; n <= a.devices; n *= 2) {
    std::vector<std::vector<float>> buffers(n, std::vector<float>(64, 1.0f));
    const double s = collective_seconds(n, calls, [&](comm::Communicator& c, int r) {
      c.all_reduce_sum(buffers[r].data(), buffers[r].size(), DType::F32);
    });
    p.link.alpha_us.points.emplace_back(n, s * 1e6);
    alpha_text += fmt::format("{}{} ranks {:.1f} us", alpha_text.empty() ? "" : ", ", n, s * 1e6);
  }
  const size_t count = 1 << 20;  // 4 MiB
  std::vector<std::vector<float>> big_buffers(2, std::vector<float>(count, 1.0f));
  const double big = collective_seconds(2, std::max(4, calls / 20), [&](comm::Communicator& c, int r) {
    c.all_reduce_sum(big_buffers[r].data(), count, DType::F32);
  });
  const double wire = perf::bytes_on_wire(perf::CollectiveKind::AllReduce, 2, count * 4.0);
  p.link.link_gbs = wire / std::max(1e-9, big - p.link.alpha_us.at(2) * 1e-6) / 1e9;
  p.link.topology = "in_process";
  p.link.fabric_gbs = 0;
  p.sources["link_topology"] = "CPU ranks: threads of one process (comm/in_process.h)";
  p.sources["link_alpha_us"] =
      "measured here with `moeserve plan calibrate`: in-process all_reduce_sum of 64 floats, best of 3 rounds of " +
      std::to_string(calls) + " calls on every rank: " + alpha_text;
  p.sources["link_gbs"] = fmt::format(
      "measured here with `moeserve plan calibrate`: in-process all_reduce_sum of 4 MiB on 2 ranks, {:.3f} "
      "ms per call, minus the 2-rank latency, over its ring bytes on the wire (best of 3 rounds)",
      big * 1e3);
  p.sources["link_fabric_gbs"] = "0: in-process copies share only the memory bandwidth (memory_gbs)";
}

// Streaming efficiency and rate by rows, from the linear op: the roofline of these curves gives
// back each measured time.
void fit_curves(const std::vector<LinearPoint>& points, const std::string& how_measured, perf::HardwareProfile& p) {
  double peak = 0;
  for (const LinearPoint& x : points) peak = std::max(peak, x.flops / x.seconds / 1e12);
  p.matmul_tflops = peak;
  std::string text;
  for (const LinearPoint& x : points) {
    p.weight_efficiency.points.emplace_back(x.tokens, x.bytes / x.seconds / 1e9 / p.memory_gbs);
    p.matmul_efficiency.points.emplace_back(x.tokens, x.flops / x.seconds / 1e12 / peak);
    text += fmt::format("{}{} rows {:.3f} ms", text.empty() ? "" : ", ", x.tokens, x.seconds * 1e3);
  }
  const std::string how = how_measured + text;
  // Attention reads each token's own cache: no reuse across the batch, the one-row efficiency.
  p.kv_efficiency.points = {p.weight_efficiency.points.front()};
  p.sources["matmul_tflops"] = how + " (the highest rate)";
  p.sources["weight_efficiency"] = how + " (bytes / time / memory_gbs)";
  p.sources["matmul_efficiency"] = how + " (FLOP rate / matmul_tflops)";
  p.sources["kv_efficiency"] =
      "the weight_efficiency at one row (attention streams each token's own latent cache, so rows do not share it); "
      "not measured separately";
}

// Median decode step (batch 1, context 64) of `layers` layers of the model under `plan` on each
// of `side_by_side` engines stepping at once on their own threads (bench-step's loop): CPU ranks
// share the one process-wide thread pool, so this is what a step takes while that many others
// compute beside it. Returns the mean of the engines' medians, us, in the least disturbed of 3 rounds.
double step_us(const CalibrateArgs& a, const std::string& plan, int64_t layers, int iterations, int side_by_side) {
  const ModelSource model = open_model(a.model + ":layers=" + std::to_string(layers));
  runtime::EngineOptions options;
  options.backend = "cpu";
  options.num_pages = 4;
  options.plan = parallel::parse_plan(plan);
  std::vector<std::unique_ptr<runtime::Engine>> engines;
  for (int i = 0; i < side_by_side; ++i) engines.push_back(std::make_unique<runtime::Engine>(model, options));
  runtime::StepBenchOptions bench;
  bench.context = 64;
  bench.iterations = iterations;
  bench.warmup = 2;
  bench.comm = false;
  bench.pipelined = false;
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {  // the least disturbed of 3 rounds (the machine may be shared)
    std::vector<double> ms(side_by_side);
    std::vector<std::thread> threads;
    for (int i = 0; i < side_by_side; ++i)
      threads.emplace_back(
          [&, i] { ms[i] = runtime::benchmark_decode_steps(*engines[i], {1}, bench).front().step_ms; });
    for (auto& th : threads) th.join();
    double sum = 0;
    for (double x : ms) sum += x;
    best = std::min(best, sum / side_by_side * 1e3);
  }
  return best;
}

// A layer's fixed time: decode steps of 8 and of 2 layers measured, minus what `predicted_us`
// gives their bytes, FLOPs and collectives, over the 6 layers between them.
struct LayerFit {
  double t2 = 0, t8 = 0, p2 = 0, p8 = 0;
  double per_layer() const { return std::max(0.0, ((t8 - p8) - (t2 - p2)) / 6); }
  std::string text() const {
    return fmt::format("{:.0f} / {:.0f} us (model without it {:.0f} / {:.0f})", t2, t8, p2, p8);
  }
};

template <typename Predict>
LayerFit fit_layer(const CalibrateArgs& a, const std::string& plan, int side_by_side, Predict&& predicted_us) {
  const int iterations = std::max(5, static_cast<int>(30 * a.seconds_scale));
  return {step_us(a, plan, 2, iterations, side_by_side), step_us(a, plan, 8, iterations, side_by_side), predicted_us(2),
          predicted_us(8)};
}

// The fixed time per layer and step (hardware_profile.h): single-rank engines alone and n side
// by side (the speedup of n: n x the one-engine time over the n-engine time), and one engine of
// plan tpN (N = devices), whose ranks each hold 1/N of the heads (what each rank pays whatever
// its share). The model's part of each step: the bytes and FLOPs at the measured curves, n
// times (the executor runs them one after another), and tpN's collectives at the measured link.
void measure_overheads(const CalibrateArgs& a, perf::HardwareProfile& p) {
  perf::AdviseWorkload w;
  perf::HardwareProfile bare = p;  // the curves and the link; no fixed time
  bare.layer_overhead_us = bare.step_overhead_us = bare.shared_rank_layer_us = 0;
  bare.shared_executor_speedup.points = {{1, 1}};
  auto predicted = [&](const std::string& plan, int n) {
    return [&, plan, n](int64_t layers) {
      const ModelConfig c = open_model(a.model + ":layers=" + std::to_string(layers)).config;
      return n * perf::decode_round(c, parallel::parse_plan(plan), bare, 1, 64, w).total_us();
    };
  };
  const LayerFit one = fit_layer(a, "single", 1, predicted("single", 1));
  p.layer_overhead_us = one.per_layer();
  p.step_overhead_us = std::max(0.0, (one.t2 - one.p2) - 2 * p.layer_overhead_us);
  std::string text = "1 engine " + one.text();
  p.shared_executor_speedup.points = {{1, 1}};
  for (int n = 2; n <= a.devices; n *= 2) {
    const LayerFit f = fit_layer(a, "single", n, predicted("single", n));
    p.shared_executor_speedup.points.emplace_back(n, n * p.layer_overhead_us / std::max(1e-3, f.per_layer()));
    text += fmt::format("; {} side by side {}", n, f.text());
  }
  const int N = a.devices;
  const std::string tp = "tp" + std::to_string(N);
  const LayerFit t = N > 1 ? fit_layer(a, tp, 1, predicted(tp, 1)) : one;
  // t = N (alpha + (L - alpha) / N) / speedup(N), for alpha.
  p.shared_rank_layer_us =
      N > 1 ? std::clamp((t.per_layer() * p.shared_executor_speedup.at(N) - p.layer_overhead_us) / (N - 1), 0.0,
                         p.layer_overhead_us)
            : p.layer_overhead_us;
  const std::string how = fmt::format(
      "measured here with `moeserve plan calibrate`: decode steps of {} (batch 1, context 64, "
      "runtime::benchmark_decode_steps) of 2 / 8 layers: {}; plan {}: {}",
      a.model, text, tp, t.text());
  p.sources["layer_overhead_us"] = how + "; one engine's difference per layer";
  p.sources["step_overhead_us"] = how + "; what is left of one engine's 2-layer step beyond its 2 layers";
  p.sources["shared_executor_speedup"] = how + "; n x one engine's per-layer difference over n engines'";
  p.sources["shared_rank_layer_us"] =
      how + "; solved from the plan's per-layer difference = N x (this + (layer_overhead_us - this) / N) / speedup(N)";
}

// A prompt's forward (runtime::benchmark_prefill, as bench-step --prefill runs it) on one
// single-rank engine at 16, 64 and 256 tokens: the advisor's bytes and FLOPs of it (at
// prefill_efficiency 1) over the measured time beyond the fixed time per step and layer.
void measure_prefill(const CalibrateArgs& a, perf::HardwareProfile& p) {
  const ModelSource model = open_model(a.model);
  const std::vector<int64_t> lengths = {16, 64, 256};
  runtime::EngineOptions options;
  options.backend = "cpu";
  options.num_pages = runtime::prefill_pages(lengths.back(), 64);
  runtime::Engine engine(model, options);
  runtime::PrefillBenchOptions bench;
  bench.iterations = std::max(3, static_cast<int>(10 * a.seconds_scale));
  const std::vector<runtime::PrefillBenchResult> measured = runtime::benchmark_prefill(engine, lengths, bench);
  perf::HardwareProfile at_one = p;
  at_one.prefill_efficiency.points = {{1, 1}};
  const double fixed = p.step_overhead_us + p.layer_overhead_us * static_cast<double>(model.config.num_hidden_layers);
  std::string text;
  for (const runtime::PrefillBenchResult& r : measured) {
    perf::AdviseWorkload w;
    w.input_len = r.tokens;
    const double predicted = perf::predict_point(model.config, {}, at_one, w, 1).prefill_us - fixed;
    const double took = r.ms * 1e3 - fixed;
    p.prefill_efficiency.points.emplace_back(r.tokens, predicted / std::max(1.0, took));
    text += fmt::format("{}{} tokens {:.0f} us (bytes and FLOPs {:.0f} us)", text.empty() ? "" : ", ", r.tokens,
                        r.ms * 1e3, predicted);
  }
  p.sources["prefill_efficiency"] = fmt::format(
      "measured here with `moeserve plan calibrate`: one prompt's forward of {} on one CPU rank "
      "(runtime::benchmark_prefill, median of {}): {}; the bytes and FLOPs over the time beyond the fixed {:.0f} us",
      a.model, bench.iterations, text, fixed);
}

perf::HardwareProfile calibrate(const CalibrateArgs& a) {
  perf::HardwareProfile p;
  p.name = "calibrated-cpu";
  p.devices = a.devices;
  p.sources["devices"] = fmt::format("--devices {}: CPU rank threads of one process", a.devices);
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  p.memory_bytes = memory / a.devices;
  p.sources["memory_bytes"] =
      fmt::format("sysconf(_SC_PHYS_PAGES x _SC_PAGESIZE) = {:.0f} bytes, shared by {} ranks", memory, a.devices);
  p.memory_gbs = copy_gbs(a);
  p.sources["memory_gbs"] =
      "measured here with `moeserve plan calibrate`: memcpy of 256 MiB, best of several (bytes "
      "copied / time)";
  p.element_bytes = 4;
  p.sources["element_bytes"] = "the CPU backend stores weights, activations and the KV cache in fp32";
  p.ranks_share_executor = true;
  p.sources["ranks_share_executor"] =
      "CPU ranks run their ops on the one process-wide ThreadPool, one parallel_for at a time (core/thread_pool.h)";
  const ModelConfig c = open_model(a.model).config;
  fit_curves(measure_linear(a),
             fmt::format("measured here with `moeserve plan calibrate`: the CPU backend's linear op on {}'s dense-MLP "
                         "weight [{}, {}] fp32, best of several runs: ",
                         a.model, c.intermediate_size, c.hidden_size),
             p);
  p.layer_overhead_us = p.step_overhead_us = 0;
  measure_link(a, p);
  measure_overheads(a, p);
  measure_prefill(a, p);
  p.token_overhead_us = 0;
  p.sources["token_overhead_us"] = "0: not measured (calibrate does not run the HTTP path)";
  return p;
}

void run_calibrate(const CalibrateArgs& a) {
  MS_CHECK(!a.out.empty(), "--out: required (the profile file to write)");
  MS_CHECK(a.devices >= 1, "--devices must be >= 1 (got {})", a.devices);
  MS_CHECK(a.seconds_scale > 0, "--scale must be positive (got {})", a.seconds_scale);
  const perf::HardwareProfile p = calibrate(a);
  std::ofstream out(a.out, std::ios::trunc);
  out << perf::profile_to_json(p).dump(2) << "\n";
  MS_CHECK(out.good(), "--out {}: cannot write the file", a.out);
  std::printf(
      "calibrated %d CPU ranks: copy %.1f GB/s, linear op up to %.1f GFLOP/s, layer %.1f us, step %.1f us, "
      "all-reduce latency %.1f us (2 ranks) .. %.1f us (%d ranks), %.1f GB/s; wrote %s\n",
      a.devices, p.memory_gbs, p.matmul_tflops * 1e3, p.layer_overhead_us, p.step_overhead_us,
      p.link.alpha_us.points.front().second, p.link.alpha_us.points.back().second, a.devices, p.link.link_gbs,
      a.out.c_str());
}

}  // namespace

void add_plan_calibrate_command(CLI::App& plan) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = plan.add_subcommand("calibrate", "Measure this machine's CPU ranks and write a hardware profile");
  cmd->add_option("--out", args->out, "Profile file to write (JSON)")->required();
  cmd->add_option("--devices", args->devices, "CPU rank threads the profile describes")->capture_default_str();
  cmd->add_option("--model", args->model, "Synthetic model whose decode steps give the fixed costs")
      ->capture_default_str();
  cmd->add_option("--scale", args->seconds_scale, "Repetitions x this (less: faster, noisier)")->capture_default_str();
  cmd->callback([args] { run_calibrate(*args); });
}

}  // namespace moeserve::apps
