#include "bench/runner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"

namespace moeserve::bench {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

std::vector<std::pair<std::string, std::string>> headers_for(const std::string& api_key) {
  std::vector<std::pair<std::string, std::string>> headers = {{"Content-Type", "application/json"}};
  if (!api_key.empty()) headers.emplace_back("Authorization", "Bearer " + api_key);
  return headers;
}

// A greedy streaming completion of prompt.output_len tokens that reports usage and token ids.
Json completion_body(const RunOptions& options, const BenchPrompt& prompt) {
  Json body = {{"model", options.model}};
  if (!prompt.ids.empty())
    body["prompt"] = prompt.ids;
  else
    body["prompt"] = prompt.text;
  body["max_tokens"] = prompt.output_len;
  body["temperature"] = 0;
  body["ignore_eos"] = options.ignore_eos;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["return_token_ids"] = true;
  for (const auto& [key, value] : options.extra_body.items()) body[key] = value;  // sglang's --extra-request-body
  return body;
}

RequestOutcome send_one(const RunOptions& options, const BenchPrompt& prompt) {
  RequestOutcome out;
  HttpCall call;
  call.method = "POST";
  call.path = "/v1/completions";
  call.body = completion_body(options, prompt).dump();
  call.headers = headers_for(options.api_key);
  SseParser sse;
  std::string error_body;
  bool done = false, usage_seen = false;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  bool first = true;
  call.on_body = [&](int status, std::string_view bytes) {
    if (status != 200) {
      error_body.append(bytes);
      return;
    }
    sse.feed(bytes, [&](const std::string& data) {
      if (data == "[DONE]") {
        done = true;
        return;
      }
      const Json chunk = Json::parse(data);
      if (chunk.contains("error")) {
        out.error = chunk["error"].value("message", chunk.dump());
        return;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        out.prompt_len = chunk["usage"].value("prompt_tokens", int64_t{0});
        out.output_len = chunk["usage"].value("completion_tokens", int64_t{0});
        out.spec_verify_ct = chunk["usage"].value("spec_verify_ct", int64_t{0});
        out.spec_accept_length = chunk["usage"].value("spec_accept_length", 0.0);
        usage_seen = true;
      }
      for (const Json& choice : chunk.value("choices", Json::array())) {
        const Json ids = choice.value("token_ids", Json::array());
        if (ids.empty()) continue;
        const Clock::time_point now = Clock::now();
        if (first)
          out.ttft_s = std::chrono::duration<double>(now - start).count();
        else
          out.itl_s.push_back(std::chrono::duration<double>(now - last).count());
        first = false;
        last = now;
        for (const Json& id : ids) out.output_ids.push_back(id.get<int32_t>());
        out.text += choice.value("text", std::string());
      }
    });
  };
  try {
    const HttpResponse response = http_call(options.url, call);
    out.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (response.status != 200) {
      out.error = "HTTP " + std::to_string(response.status) + ": " + error_body;
      return out;
    }
  } catch (const std::exception& e) {
    out.error = e.what();
    return out;
  }
  if (!out.error.empty()) return out;
  if (!done)
    out.error = "the stream ended without [DONE]";
  else if (!usage_seen)
    out.error = "the stream carried no usage";
  else if (out.output_len != static_cast<int64_t>(out.output_ids.size()))
    out.error = "usage says " + std::to_string(out.output_len) + " completion tokens, the stream carried " +
                std::to_string(out.output_ids.size());
  out.success = out.error.empty();
  return out;
}

class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled), tty_(::isatty(2) != 0) {}
  void tick(int64_t done, int64_t failed) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (tty_) {
      const int width = 40;
      const int filled = static_cast<int>(width * done / total_);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld%s", std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(), static_cast<long long>(done),
                   static_cast<long long>(total_), failed ? (" (" + std::to_string(failed) + " failed)").c_str() : "");
      if (done == total_) std::fprintf(stderr, "\n");
    } else {
      const int64_t tenth = done * 10 / total_;
      if (tenth == last_tenth_ && done != total_) return;
      last_tenth_ = tenth;
      std::fprintf(stderr, "bench: %lld/%lld requests done, %lld failed\n", static_cast<long long>(done),
                   static_cast<long long>(total_), static_cast<long long>(failed));
    }
    std::fflush(stderr);
  }

 private:
  int64_t total_;
  bool enabled_, tty_;
  int64_t last_tenth_ = 0;
  std::mutex mutex_;
};

}  // namespace

std::string served_model(const HttpUrl& url, const std::string& api_key) {
  HttpCall call;
  call.path = "/v1/models";
  call.headers = headers_for(api_key);
  const HttpResponse response = http_call(url, call);
  MS_CHECK(response.status == 200, "GET /v1/models: HTTP {}: {}", response.status, response.body);
  const Json models = Json::parse(response.body);
  MS_CHECK(models.contains("data") && !models["data"].empty(), "GET /v1/models: no model listed");
  return models["data"][0].at("id").get<std::string>();
}

Json server_info(const HttpUrl& url, const std::string& api_key) {
  HttpCall call;
  call.path = "/get_server_info";
  call.headers = headers_for(api_key);
  try {
    const HttpResponse response = http_call(url, call);
    if (response.status == 200) return Json::parse(response.body);
  } catch (const std::exception&) {  // a server without the route: the field stays null
  }
  return nullptr;
}

RunResult run_benchmark(const RunOptions& options, const std::vector<BenchPrompt>& prompts) {
  MS_CHECK(options.max_concurrency > 0, "--concurrency values must be positive (got {})", options.max_concurrency);
  MS_CHECK(options.request_rate > 0, "--request-rate must be positive or inf (got {})", options.request_rate);
  RunOptions resolved = options;
  if (resolved.model.empty()) resolved.model = served_model(options.url, options.api_key);
  const size_t n = prompts.size();
  // Poisson arrivals: exponential gaps at the request rate (all at once for inf).
  std::vector<double> arrival_s(n, 0.0);
  if (std::isfinite(options.request_rate)) {
    std::mt19937_64 rng(options.seed);
    std::exponential_distribution<double> gap(options.request_rate);
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      arrival_s[i] = t;
      t += gap(rng);
    }
  }
  RunResult result;
  result.outcomes.resize(n);
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done{0}, failed{0};
  Progress progress(static_cast<int64_t>(n), options.progress);
  const Clock::time_point start = Clock::now();
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival_s[i])));
      const double sent = std::chrono::duration<double>(Clock::now() - start).count();
      result.outcomes[i] = send_one(resolved, prompts[i]);
      result.outcomes[i].start_s = sent;
      if (!result.outcomes[i].success) ++failed;
      progress.tick(++done, failed.load());
    }
  };
  std::vector<std::thread> workers;
  const size_t threads = std::min<size_t>(n, static_cast<size_t>(options.max_concurrency));
  for (size_t t = 0; t < threads; ++t) workers.emplace_back(worker);
  for (std::thread& t : workers) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  result.metrics = compute_metrics(result.outcomes, duration);
  return result;
}

Json run_json(const RunOptions& options, const DatasetOptions& dataset, const RunResult& result, bool details) {
  Json out;
  out["backend"] = "moeserve";
  out["dataset_name"] = dataset.name;
  out["request_rate"] = std::isfinite(options.request_rate) ? Json(options.request_rate) : Json("inf");
  out["max_concurrency"] = options.max_concurrency;
  out["num_prompts"] = dataset.num_prompts;
  out["random_input_len"] = dataset.input_len;
  out["random_output_len"] = dataset.output_len;
  out["random_range_ratio"] = dataset.range_ratio;
  out["seed"] = dataset.seed;
  add_metrics_json(result.metrics, out);
  if (details) {
    Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(), itls = Json::array(),
         texts = Json::array(), ids = Json::array(), errors = Json::array();
    for (const RequestOutcome& r : result.outcomes) {
      input_lens.push_back(r.prompt_len);
      output_lens.push_back(r.output_len);
      ttfts.push_back(r.ttft_s);
      itls.push_back(r.itl_s);
      texts.push_back(r.text);
      ids.push_back(r.output_ids);
      errors.push_back(r.error);
    }
    out["input_lens"] = std::move(input_lens);
    out["output_lens"] = std::move(output_lens);
    out["ttfts"] = std::move(ttfts);
    out["itls"] = std::move(itls);
    out["generated_texts"] = std::move(texts);
    out["output_ids"] = std::move(ids);
    out["errors"] = std::move(errors);
  }
  return out;
}

}  // namespace moeserve::bench
