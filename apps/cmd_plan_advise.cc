// moeserve plan advise: the plan advisor (perf/advisor.h) for a model on a hardware profile:
// every plan preset of --gpus ranks the model admits, whether it fits, and its predicted
// decode speed per concurrency, as Markdown on stdout and optionally JSON.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/cli_util.h"
#include "apps/plan_advise.h"
#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "model/model_source.h"
#include "parallel/plan_parse.h"
#include "perf/advisor_report.h"
#include "perf/replan_cost.h"

namespace moeserve::apps {

namespace {

struct AdviseArgs {
  std::string model;
  std::string hardware;
  int gpus = 0;  // 0: the profile's devices
  std::string plans;
  std::string concurrency = "1,8,32,64";
  perf::AdviseWorkload workload;
  std::string expert_loads;
  std::string json_out;
  std::string replans;  // "FROM:TO,..."
};

std::vector<double> read_expert_loads(const std::string& path) {
  std::ifstream in(path);
  MS_CHECK(in.good(), "--expert-loads {}: cannot read the file", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_object() && j.contains("expert_loads")) j = j["expert_loads"];
  MS_CHECK(j.is_array() && !j.empty(),
           "--expert-loads {}: expected a list of per-expert loads (or {{\"expert_loads\": [...]}})", path);
  std::vector<double> loads;
  for (const auto& v : j) {
    MS_CHECK(v.is_number() && v.get<double>() >= 0, "--expert-loads {}: loads must be numbers >= 0", path);
    loads.push_back(v.get<double>());
  }
  return loads;
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// --replan FROM:TO,...: each re-plan's bytes to move and predicted time (perf/replan_cost.h).
void print_replans(const ModelConfig& config, const perf::HardwareProfile& profile, const std::string& replans) {
  for (const std::string& pair : split_names(replans)) {
    const size_t colon = pair.find(':');
    MS_CHECK(colon != std::string::npos, "--replan '{}': expected FROM:TO (e.g. tp8:ep8)", pair);
    const parallel::ParallelPlan from = parallel::parse_plan(pair.substr(0, colon));
    const parallel::ParallelPlan to = parallel::parse_plan(pair.substr(colon + 1));
    parallel::validate_plan(from, shard_dims(config));
    parallel::validate_plan(to, shard_dims(config));
    std::printf("%s", perf::replan_markdown(perf::predict_replan(config, from, to, profile), profile).c_str());
  }
}

void run_advise(AdviseArgs args) {
  const ModelSource model = open_model(args.model);
  const perf::HardwareProfile profile = perf::load_profile(perf::resolve_profile_path(args.hardware, profiles_dir()));
  args.workload.concurrency.clear();
  for (int32_t c : parse_id_list(args.concurrency, "--concurrency")) {
    MS_CHECK(c > 0, "--concurrency: levels must be positive (got {})", c);
    args.workload.concurrency.push_back(c);
  }
  perf::AdviseWorkload& w = args.workload;
  MS_CHECK(w.input_len >= 1 && w.output_len >= 1, "--input-len and --output-len must be >= 1");
  MS_CHECK(w.accept_length >= 1, "--accept-length must be >= 1 (got {})", w.accept_length);
  if (!w.speculative_algorithm.empty() && w.verify_tokens <= 1)
    w.verify_tokens = static_cast<int64_t>(std::ceil(w.accept_length)) + 1;
  MS_CHECK(w.speculative_algorithm.empty() ? w.accept_length == 1 : w.accept_length <= w.verify_tokens,
           "--accept-length {}: needs --speculative-algorithm and at most --speculative-num-draft-tokens + 1 ({})",
           w.accept_length, w.verify_tokens);
  if (!args.expert_loads.empty()) w.expert_load = read_expert_loads(args.expert_loads);
  const int gpus = args.gpus > 0 ? args.gpus : profile.devices;
  const perf::Advice advice = perf::advise(model.config, args.model, profile, gpus, split_names(args.plans), w);
  std::printf("%s", perf::advice_markdown(advice).c_str());
  print_replans(model.config, profile, args.replans);
  if (!args.json_out.empty()) {
    std::ofstream out(args.json_out, std::ios::trunc);
    out << perf::advice_json(advice).dump(2) << "\n";
    MS_CHECK(out.good(), "--json {}: cannot write the file", args.json_out);
  }
}

}  // namespace

std::string profiles_dir() {
  const char* env = std::getenv("MOESERVE_PROFILES_DIR");
  return env != nullptr && *env != '\0' ? env : MOESERVE_PROFILES_DIR;
}

void add_plan_advise_command(CLI::App& plan) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* cmd = plan.add_subcommand(
      "advise", "Predict every plan's fit and decode speed on a hardware profile (perf/profiles, or plan calibrate's)");
  cmd->add_option("--model,-m", args->model, "Model spec (synthetic:NAME, a model directory or a config.json)")
      ->required();
  cmd->add_option("--hardware", args->hardware, "Profile name in perf/profiles (h200-sxm-x8, ...) or a JSON file")
      ->required();
  cmd->add_option("--gpus", args->gpus, "Ranks of the plans (0: the profile's devices)")->capture_default_str();
  cmd->add_option("--plans", args->plans, "Plans to compare, comma-separated (default: every preset of --gpus ranks)");
  cmd->add_option("--concurrency", args->concurrency, "Concurrency levels")->capture_default_str();
  cmd->add_option("--input-len", args->workload.input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", args->workload.output_len, "Output tokens per request")->capture_default_str();
  cmd->add_option("--speculative-algorithm", args->workload.speculative_algorithm, "EAGLE, MTP, ... (one-layer draft)");
  cmd->add_option("--accept-length", args->workload.accept_length, "Tokens emitted per verify step")
      ->capture_default_str();
  cmd->add_option("--speculative-num-draft-tokens", args->workload.verify_tokens,
                  "Tokens verified per sequence and step (default: ceil(accept length) + 1)");
  cmd->add_option("--expert-loads", args->expert_loads, "JSON list of routed rows per expert (default: uniform)");
  cmd->add_flag(
      "--kv-cache-fp8", args->workload.kv_cache_fp8,
      "The KV cache as --kv-cache-dtype fp8_e4m3 stores it: one byte per element (memory fit and KV read time)");
  cmd->add_option("--context-length", args->workload.context_length, "KV tokens per sequence for the fit (0: in + out)")
      ->capture_default_str();
  cmd->add_option("--max-running-requests", args->workload.max_running_requests,
                  "Sequences whose KV cache must fit (0: the largest concurrency)")
      ->capture_default_str();
  cmd->add_option("--json", args->json_out, "Also write the advice as JSON to this file");
  cmd->add_option("--replan", args->replans,
                  "Also predict re-plans from resident weights, FROM:TO comma-separated (e.g. tp8:ep8)");
  cmd->callback([args] { run_advise(*args); });
}

}  // namespace moeserve::apps
