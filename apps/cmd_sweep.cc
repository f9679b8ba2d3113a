// moeserve sweep: measures every plan at every concurrency with one server. It starts
// `moeserve serve` on the first plan that fits, moves it through the others by live re-plan
// (POST /admin/replan), runs the load generator (bench/) at each concurrency, and writes
// DIR/sweep.json, DIR/sweep.md, DIR/sweep.html, DIR/bench.jsonl (every run, sglang's fields)
// and DIR/server.log. Plans the model or the memory cannot hold are skipped with the reason.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "apps/commands.h"
#include "apps/plan_advise.h"
#include "apps/plan_cli.h"
#include "bench/dataset.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "core/error.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"
#include "perf/advisor.h"
#include "runtime/rank_devices.h"

namespace moeserve::apps {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

struct SweepArgs {
  std::string model = "synthetic:tiny";
  std::string plans;
  std::string concurrency = "1,4,16";
  std::string backend;  // "": runtime::default_backend()
  std::string out_dir;
  std::string mem_per_rank;
  int64_t context_length = 0;
  int64_t kv_pages = 0;              // 0: the server's default
  int64_t max_running_requests = 0;  // 0: the largest concurrency
  int64_t num_prompts = 0;           // 0: 4 x the concurrency of the point
  int repeats = 1;                   // runs per point; the median run (by output tok/s) is the point's
  double startup_timeout_s = 600;
  std::string reduction_plan = "single";  // the server's --reduction-plan
  bool batch_invariant = false;           // the server's --batch-invariant
  bench::DatasetOptions dataset;
  std::string hardware;  // a profile: the advisor's prediction beside every point
};

// The advisor's output tok/s for (plan, concurrency); empty: no --hardware.
using Predictor = std::function<double(const std::string& plan, int64_t concurrency)>;

Predictor make_predictor(const SweepArgs& args) {
  if (args.hardware.empty()) return {};
  const ModelConfig config = open_model(args.model).config;
  const perf::HardwareProfile profile = perf::load_profile(perf::resolve_profile_path(args.hardware, profiles_dir()));
  perf::AdviseWorkload workload;
  // Lengths are drawn from [len x ratio, len]: their mean.
  const double ratio = args.dataset.range_ratio;
  workload.input_len = std::max<int64_t>(1, std::llround(args.dataset.input_len * (1 + ratio) / 2));
  workload.output_len = std::max<int64_t>(1, std::llround(args.dataset.output_len * (1 + ratio) / 2));
  return [config, profile, workload](const std::string& plan, int64_t c) {
    return perf::predict_point(config, parallel::parse_plan(plan), profile, workload, c).aggregate_tok_s;
  };
}

std::vector<std::string> split_list(const std::string& text, const char* flag) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  MS_CHECK(!out.empty(), "{}: empty list", flag);
  return out;
}

// `moeserve serve` as a child process, its output in a log file; SIGTERM on destruction.
class ServerProcess {
 public:
  ServerProcess(const std::vector<std::string>& args, const std::filesystem::path& log, double timeout_s) : log_(log) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    MS_CHECK(fd >= 0, "sweep: cannot write the server log {}", log.string());
    const off_t start_offset = ::lseek(fd, 0, SEEK_END);
    pid_ = ::fork();
    MS_CHECK(pid_ >= 0, "sweep: fork failed");
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      std::string self = "/proc/self/exe";
      argv.push_back(self.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::perror("exec moeserve serve");
      ::_exit(127);
    }
    ::close(fd);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    const std::regex ready(R"(on http://(\S+):(\d+))");
    while (Clock::now() < deadline) {
      std::ifstream in(log);
      in.seekg(start_offset);
      std::string line;
      while (std::getline(in, line)) {
        std::smatch m;
        if (line.find("moeserve: serving") != std::string::npos && std::regex_search(line, m, ready)) {
          url_ = "http://" + m[1].str() + ":" + m[2].str();
          return;
        }
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        MS_CHECK(false, "the server exited before serving: {}", tail(start_offset));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop();
    MS_CHECK(false, "the server did not serve within {} s (--startup-timeout): {}", timeout_s, tail(start_offset));
  }
  ~ServerProcess() { stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& url() const { return url_; }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 600 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (::waitpid(pid_, &status, WNOHANG) == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }

 private:
  std::string tail(off_t from) const {
    std::ifstream in(log_);
    in.seekg(from);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.size() > 600) text = "..." + text.substr(text.size() - 600);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  }

  std::filesystem::path log_;
  pid_t pid_ = -1;
  std::string url_;
};

// The --admin-api-key the sweep gives its server, so that it can re-plan it: random per run,
// as nothing else on the host should re-plan or flush that server.
const std::string& sweep_admin_key() {
  static const std::string key = [] {
    std::random_device random;
    return fmt::format("sweep-{:08x}{:08x}", random(), random());
  }();
  return key;
}

// POST /admin/replan; the reply's JSON, or an Error with the server's reason.
Json replan(const bench::HttpUrl& url, const std::string& plan) {
  bench::HttpCall call;
  call.method = "POST";
  call.path = "/admin/replan";
  call.body = Json{{"plan", plan}}.dump();
  call.headers = {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + sweep_admin_key()}};
  const bench::HttpResponse response = bench::http_call(url, call);
  const Json body = Json::parse(response.body, nullptr, false);
  if (response.status != 200) {
    std::string message = response.body;
    if (body.is_object() && body.contains("error") && body["error"].is_object())
      message = body["error"].value("message", response.body);
    MS_CHECK(false, "{}", message);
  }
  return body;
}

std::vector<int64_t> concurrency_levels(const std::string& text) {
  std::vector<int64_t> levels;
  for (const std::string& c : split_list(text, "--concurrency")) {
    char* end = nullptr;
    const long long v = std::strtoll(c.c_str(), &end, 10);
    MS_CHECK(end && *end == '\0' && v > 0, "--concurrency '{}': expected positive integers", text);
    levels.push_back(v);
  }
  return levels;
}

// The sweep's arguments checked and expanded: what every step below reads.
struct SweepPlan {
  std::vector<std::string> plans;
  std::vector<int64_t> levels;
  int64_t max_running = 0;
  bench::DatasetOptions dataset;  // num_prompts set per point
};

SweepPlan plan_sweep(const SweepArgs& args) {
  MS_CHECK(!args.out_dir.empty(), "--out: required (a directory)");
  MS_CHECK(args.backend == "cpu" || args.backend == "cpu-bf16" || args.backend == "cuda",
           "--backend '{}': expected cpu, cpu-bf16 or cuda", args.backend);
  SweepPlan sweep;
  sweep.plans = split_list(args.plans, "--plans");
  sweep.levels = concurrency_levels(args.concurrency);
  MS_CHECK(args.num_prompts >= 0, "--num-prompts must be >= 0 (got {})", args.num_prompts);
  MS_CHECK(args.repeats >= 1, "--repeats must be >= 1 (got {})", args.repeats);
  sweep.max_running = args.max_running_requests > 0 ? args.max_running_requests
                                                    : *std::max_element(sweep.levels.begin(), sweep.levels.end());
  sweep.dataset = args.dataset;
  sweep.dataset.num_prompts = 1;
  bench::make_prompts(sweep.dataset);  // checks the dataset flags before anything starts
  return sweep;
}

bench::SweepResult new_result(const SweepArgs& args, const SweepPlan& sweep) {
  bench::SweepResult result;
  result.model = args.model;
  result.backend = args.backend;
  result.reduction_plan = args.reduction_plan;
  result.batch_invariant = args.batch_invariant;
  result.plans = sweep.plans;
  result.concurrency = sweep.levels;
  const bench::DatasetOptions& dataset = sweep.dataset;
  result.workload = {{"dataset_name", dataset.name},
                     {"num_prompts", args.num_prompts > 0 ? Json(args.num_prompts) : Json("4 x concurrency")},
                     {"random_input_len", dataset.input_len},
                     {"random_output_len", dataset.output_len},
                     {"random_range_ratio", dataset.range_ratio},
                     {"request_rate", "inf"},
                     {"repeats_per_point", args.repeats},
                     {"seed", dataset.seed}};
  return result;
}

void skip_plan(bench::SweepResult& result, const std::string& plan, const std::string& reason) {
  result.skipped.push_back({plan, reason});
  std::printf("sweep: skipping %s: %s\n", plan.c_str(), reason.c_str());
}

// The same checks the server makes, so that plans the model, the memory or the reduction
// plan cannot hold are skipped without a round trip.
std::vector<std::string> runnable_plans(const SweepArgs& args, const SweepPlan& sweep, bench::SweepResult& result) {
  const ModelSource model = open_model(args.model);
  const ModelRunOptions run_options = run_options_for(args.reduction_plan);
  PlanCliArgs plan_args;
  plan_args.mem_per_rank = args.mem_per_rank;
  plan_args.context_length = args.context_length;
  plan_args.max_running_requests = sweep.max_running;
  std::vector<std::string> runnable;
  for (const std::string& plan : sweep.plans) {
    plan_args.preset = plan;
    try {
      check_reduction_plan(model.config, plan_for_model(plan_args, model.config, args.backend == "cuda" ? 2 : 4),
                           run_options);
      runnable.push_back(plan);
    } catch (const std::exception& e) {
      skip_plan(result, plan, e.what());
    }
  }
  return runnable;
}

std::vector<std::string> serve_command(const SweepArgs& args, const std::string& plan, int64_t max_running) {
  std::vector<std::string> serve = {"serve",
                                    "--model",
                                    args.model,
                                    "--backend",
                                    args.backend,
                                    "--port",
                                    "0",
                                    "--plan",
                                    plan,
                                    "--max-running-requests",
                                    std::to_string(max_running),
                                    "--reduction-plan",
                                    args.reduction_plan,
                                    "--admin-api-key",
                                    sweep_admin_key()};
  if (args.batch_invariant) serve.push_back("--batch-invariant");
  if (!args.mem_per_rank.empty()) serve.insert(serve.end(), {"--mem-per-rank", args.mem_per_rank});
  if (args.context_length > 0) serve.insert(serve.end(), {"--context-length", std::to_string(args.context_length)});
  if (args.kv_pages > 0) serve.insert(serve.end(), {"--kv-pages", std::to_string(args.kv_pages)});
  return serve;
}

void print_point(const std::string& plan, int64_t c, const bench::RunResult& measured) {
  const auto& m = measured.metrics;
  std::printf("sweep: %-8s c=%-4lld %9.1f output tok/s  %7.1f tok/s per request  TTFT %8.2f ms  TPOT %7.2f ms%s\n",
              plan.c_str(), static_cast<long long>(c), m.output_throughput, bench::per_request_tok_s(m), m.ttft_ms.mean,
              m.tpot_ms.mean, m.failed ? fmt::format("  ({} FAILED)", m.failed).c_str() : "");
  std::fflush(stdout);
}

// One server taken through the runnable plans (a cold start, then live re-plans), every
// concurrency level measured on each.
class SweepRun {
 public:
  SweepRun(const SweepArgs& args, const SweepPlan& sweep, bench::SweepResult& result)
      : args_(args), sweep_(sweep), result_(result), dir_(args.out_dir) {
    std::filesystem::create_directories(dir_);
    runs_file_.open(dir_ / "bench.jsonl", std::ios::trunc);
    MS_CHECK(runs_file_.good(), "--out '{}': cannot write bench.jsonl", args.out_dir);
  }

  void measure(const std::string& plan) {
    if (!switch_to(plan)) return;
    std::fflush(stdout);
    bench::RunOptions run;
    run.url = bench::parse_http_url(server_->url(), "server url");
    run.progress = false;
    run.seed = sweep_.dataset.seed;
    run.token_ids = true;  // each request's output ids, compared between plans
    for (int64_t c : sweep_.levels) measure_point(plan, c, run);
  }

  void stop() {
    if (server_) server_->stop();
  }

  void set_predictor(Predictor predictor) { predictor_ = std::move(predictor); }

 private:
  // Serves `plan`: starts the server on it, or re-plans the running one. False: skipped.
  bool switch_to(const std::string& plan) {
    const auto switch_start = Clock::now();
    try {
      if (!server_) {
        server_ = std::make_unique<ServerProcess>(serve_command(args_, plan, sweep_.max_running), dir_ / "server.log",
                                                  args_.startup_timeout_s);
        const double ready = std::chrono::duration<double>(Clock::now() - switch_start).count();
        result_.switches.push_back({{"plan", plan}, {"how", "cold start"}, {"time_to_ready_s", ready}});
        std::printf("sweep: %s: cold start, serving in %.2f s on %s\n", plan.c_str(), ready, server_->url().c_str());
      } else {
        Json report = replan(bench::parse_http_url(server_->url(), "server url"), plan);
        report["how"] = "re-plan";
        result_.switches.push_back(report);
        std::printf("sweep: %s: re-plan ready in %.2f s\n", plan.c_str(), report.value("time_to_ready_s", 0.0));
      }
    } catch (const std::exception& e) {
      skip_plan(result_, plan, e.what());
      return false;
    }
    return true;
  }

  void measure_point(const std::string& plan, int64_t c, bench::RunOptions& run) {
    bench::DatasetOptions point = sweep_.dataset;
    point.num_prompts = args_.num_prompts > 0 ? args_.num_prompts : 4 * c;
    run.max_concurrency = c;
    // Every run in bench.jsonl; the point is the median run (a shared machine's bursts of load
    // move single runs by more than the plans differ).
    std::vector<bench::RunResult> runs;
    for (int r = 0; r < args_.repeats; ++r) {
      runs.push_back(bench::run_benchmark(run, bench::make_prompts(point)));
      Json line = bench::run_json(run, point, runs.back(), false);
      line["plan"] = plan;
      line["repeat"] = r;
      runs_file_ << line.dump() << "\n";
      runs_file_.flush();
    }
    std::sort(runs.begin(), runs.end(), [](const bench::RunResult& a, const bench::RunResult& b) {
      return a.metrics.output_throughput < b.metrics.output_throughput;
    });
    const bench::RunResult& measured = runs[runs.size() / 2];
    bench::SweepPoint measured_point{plan, c, measured.metrics};
    measured_point.runs = static_cast<int64_t>(runs.size());
    measured_point.output_throughput_min = runs.front().metrics.output_throughput;
    measured_point.output_throughput_max = runs.back().metrics.output_throughput;
    if (predictor_) measured_point.predicted_output_throughput = predictor_(plan, c);
    compare_with_reference(measured, measured_point);
    result_.points.push_back(std::move(measured_point));
    print_point(plan, c, measured);
  }

  // The first measured plan's greedy outputs per concurrency: every later plan's are compared
  // with them (the same prompts), request by request.
  void compare_with_reference(const bench::RunResult& measured, bench::SweepPoint& point) {
    std::vector<std::vector<int32_t>> outputs;
    for (const bench::RequestOutcome& o : measured.outcomes) outputs.push_back(o.output_ids);
    if (result_.reference_plan.empty()) result_.reference_plan = point.plan;
    if (point.plan == result_.reference_plan) {
      reference_outputs_[point.concurrency] = std::move(outputs);
    } else if (auto ref = reference_outputs_.find(point.concurrency); ref != reference_outputs_.end()) {
      for (size_t i = 0; i < outputs.size() && i < ref->second.size(); ++i) {
        point.compared += 1;
        point.same_outputs += outputs[i] == ref->second[i] ? 1 : 0;
      }
    }
  }

  const SweepArgs& args_;
  const SweepPlan& sweep_;
  bench::SweepResult& result_;
  const std::filesystem::path dir_;
  std::ofstream runs_file_;
  std::map<int64_t, std::vector<std::vector<int32_t>>> reference_outputs_;
  std::unique_ptr<ServerProcess> server_;
  Predictor predictor_;
};

void write_reports(const SweepArgs& args, const bench::SweepResult& result) {
  const std::filesystem::path dir(args.out_dir);
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream f(dir / name, std::ios::trunc);
    f << text;
    MS_CHECK(f.good(), "--out '{}': cannot write {}", args.out_dir, name);
  };
  write("sweep.json", bench::sweep_json(result).dump(2) + "\n");
  write("sweep.md", bench::sweep_markdown(result));
  write("sweep.html", bench::sweep_html(result));
  std::printf("sweep: wrote %s/sweep.{json,md,html} (%zu points, %zu plans skipped)\n", args.out_dir.c_str(),
              result.points.size(), result.skipped.size());
}

// The summary line of the output comparison, then the sweep fails if nothing was measured or
// any request failed.
void check_outcome(const SweepArgs& args, const bench::SweepResult& result) {
  int64_t compared = 0, same = 0, failed = 0;
  for (const auto& p : result.points) {
    compared += p.compared;
    same += p.same_outputs;
    failed += p.metrics.failed;
  }
  if (compared > 0)
    std::printf(
        "sweep: %lld of %lld greedy outputs equal %s's%s\n", static_cast<long long>(same),
        static_cast<long long>(compared), result.reference_plan.c_str(),
        args.reduction_plan == "single" ? "" : fmt::format(" (reduction plan {})", args.reduction_plan).c_str());
  MS_CHECK(!result.points.empty(), "sweep: no plan could be measured");
  MS_CHECK(failed == 0, "sweep: {} requests failed (see {}/bench.jsonl and server.log)", failed, args.out_dir);
}

void run_sweep(const SweepArgs& args) {
  const SweepPlan sweep = plan_sweep(args);
  bench::SweepResult result = new_result(args, sweep);
  const std::vector<std::string> runnable = runnable_plans(args, sweep, result);
  SweepRun run(args, sweep, result);
  run.set_predictor(make_predictor(args));
  for (const std::string& plan : runnable) run.measure(plan);
  run.stop();
  write_reports(args, result);
  check_outcome(args, result);
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto args = std::make_shared<SweepArgs>();
  args->dataset.input_len = 64;
  args->dataset.output_len = 32;
  args->dataset.range_ratio = 1.0;
  CLI::App* cmd = app.add_subcommand("sweep", "Measure plans x concurrency on one server by live re-plan");
  cmd->add_option("--model,-m", args->model, "synthetic:NAME[...], a model directory")->capture_default_str();
  cmd->add_option("--plans", args->plans, "Plans to measure, comma-separated (tp2,ep2,pp2,ep2-dp,...)")->required();
  cmd->add_option("--concurrency", args->concurrency, "Concurrency levels, comma-separated")->capture_default_str();
  cmd->add_option("--backend", args->backend, "cpu, cpu-bf16 or cuda (default: cuda when a GPU is visible)");
  cmd->add_option("--out", args->out_dir, "Directory for sweep.json, sweep.md, sweep.html, bench.jsonl")->required();
  cmd->add_option("--repeats", args->repeats, "Runs per point; the median run (by output tok/s) is the point's")
      ->capture_default_str();
  cmd->add_option("--num-prompts", args->num_prompts, "Requests per point (0: 4 x its concurrency)")
      ->capture_default_str();
  cmd->add_option("--dataset", args->dataset.name, "random or random-ids")->capture_default_str();
  cmd->add_option("--random-input-len", args->dataset.input_len, "Longest prompt")->capture_default_str();
  cmd->add_option("--random-output-len", args->dataset.output_len, "Longest output")->capture_default_str();
  cmd->add_option("--random-range-ratio", args->dataset.range_ratio, "Lengths from [len * ratio, len]")
      ->capture_default_str();
  cmd->add_option("--vocab-size", args->dataset.vocab_size, "random-ids: ids from [0, N)")->capture_default_str();
  cmd->add_option("--seed", args->dataset.seed, "Seed of the prompts")->capture_default_str();
  cmd->add_option("--mem-per-rank", args->mem_per_rank, "Skip plans that do not fit this memory per rank");
  cmd->add_option("--context-length", args->context_length, "The server's --context-length (0: the model's)")
      ->capture_default_str();
  cmd->add_option("--kv-pages", args->kv_pages, "The server's --kv-pages (0: its default)")->capture_default_str();
  cmd->add_option("--max-running-requests", args->max_running_requests,
                  "The server's --max-running-requests (0: the largest concurrency)")
      ->capture_default_str();
  cmd->add_option("--startup-timeout", args->startup_timeout_s, "Seconds to wait for the server to serve")
      ->capture_default_str();
  add_reduction_plan_flag(cmd, args->reduction_plan);
  add_batch_invariant_flag(cmd, args->batch_invariant);
  cmd->add_option("--hardware", args->hardware,
                  "Hardware profile (perf/profiles name or plan calibrate's file): the plan advisor's prediction and "
                  "its error beside every point");
  cmd->callback([args] {
    if (args->backend.empty()) args->backend = runtime::default_backend();
    run_sweep(*args);
  });
}

}  // namespace moeserve::apps
