// moeserve restart --plan P [--url URL]: moves a running server to another parallel plan
// without losing a request (POST /admin/replan): between two steps it reshards the weights
// the ranks hold into P's shards, carries the running requests over and resumes; prints the
// time to ready by phase. A plan the server
// refuses (invalid, does not fit) leaves it serving on the old plan, and this exits 1.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "bench/http_client.h"
#include "core/error.h"

namespace moeserve::apps {

namespace {

struct RestartArgs {
  std::string plan;
  std::string url = "http://127.0.0.1:30000";
  std::string api_key;
  double timeout_s = 600;
};

void run_restart(const RestartArgs& args) {
  MS_CHECK(!args.plan.empty(), "--plan: required (e.g. ep2)");
  MS_CHECK(args.timeout_s > 0, "--timeout must be positive (got {})", args.timeout_s);
  bench::HttpCall call;
  call.method = "POST";
  call.path = "/admin/replan";
  call.body = nlohmann::json{{"plan", args.plan}}.dump();
  call.headers = {{"Content-Type", "application/json"}};
  if (!args.api_key.empty()) call.headers.emplace_back("Authorization", "Bearer " + args.api_key);
  call.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  const bench::HttpResponse response = bench::http_call(bench::parse_http_url(args.url, "--url"), call);
  const auto body = nlohmann::json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (response.status != 200) {
    std::string message = response.body;
    if (body.is_object() && body.contains("error") && body["error"].is_object())
      message = body["error"].value("message", response.body);
    MS_CHECK(false, "restart --plan {}: HTTP {}: {}", args.plan, response.status, message);
  }
  MS_CHECK(body.is_object(), "restart: the server's reply is not JSON: {}", response.body);
  const nlohmann::json phases = body.value("phases_s", nlohmann::json::object());
  std::printf(
      "moeserve: %s -> %s: ready in %.3f s (pause %.3f s, move %.3f s, graphs %.3f s, resume %.3f s; weights from "
      "%s; %lld requests carried, %lld waited)\n",
      body.value("previous_plan", std::string("?")).c_str(), body.value("plan", std::string("?")).c_str(),
      body.value("time_to_ready_s", 0.0), phases.value("pause", 0.0), phases.value("move", 0.0),
      phases.value("graphs", 0.0), phases.value("resume", 0.0), body.value("weights_from", std::string("?")).c_str(),
      static_cast<long long>(body.value("requests_carried", int64_t{0})),
      static_cast<long long>(body.value("requests_waited", int64_t{0})));
  if (const std::string why = body.value("fallback_reason", std::string()); !why.empty())
    std::printf("moeserve: the weights were not resharded in place: %s\n", why.c_str());
  std::fflush(stdout);
}

}  // namespace

void add_restart_command(CLI::App& app) {
  auto args = std::make_shared<RestartArgs>();
  CLI::App* cmd = app.add_subcommand("restart", "Move a running server to another parallel plan (live re-plan)");
  cmd->add_option("--plan", args->plan, "The new plan preset (tp2, ep2, pp2, ep2-dp, ...)")->required();
  cmd->add_option("--url", args->url, "The server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--admin-api-key,--api-key", args->api_key, "The server's --admin-api-key (its admin routes' key)");
  cmd->add_option("--timeout", args->timeout_s, "Seconds to wait for the switch")->capture_default_str();
  cmd->callback([args] { run_restart(*args); });
}

}  // namespace moeserve::apps
