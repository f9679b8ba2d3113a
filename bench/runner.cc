#include "bench/runner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "bench/protocol.h"
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

// Times one request's events as sglang.bench_serving does (bench/protocol.h).
class OutcomeRecorder {
 public:
  OutcomeRecorder(Protocol protocol, RequestOutcome& out) : reader_(protocol), out_(out) {}
  void on_event(const std::string& data) {
    last_event_ = Clock::now();
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const StreamEvent e = reader_.read(nlohmann::ordered_json::parse(data));
    if (!e.error.empty()) out_.error = e.error;
    if (e.completion_tokens) out_.output_len = *e.completion_tokens, counted_ = true;
    if (e.prompt_tokens) out_.prompt_len = *e.prompt_tokens;
    if (e.spec_verify_ct > 0) out_.spec_verify_ct = e.spec_verify_ct, out_.spec_accept_length = e.spec_accept_length;
    out_.output_ids.insert(out_.output_ids.end(), e.ids.begin(), e.ids.end());
    out_.text += e.text;
    if (!e.tokens_arrived) return;
    if (first_) {
      out_.ttft_s = seconds(start_, last_event_);
    } else {  // the native route's gap is shared by the tokens it brought, as sglang splits it
      for (int64_t k = 0; k < e.new_tokens; ++k)
        out_.itl_s.push_back(seconds(last_token_, last_event_) / static_cast<double>(e.new_tokens));
    }
    first_ = false;
    last_token_ = last_event_;
  }
  // sglang's latency: send to the last event ([DONE]).
  void finish(bool token_ids) {
    out_.latency_s = seconds(start_, last_event_);
    if (!out_.error.empty()) return;
    if (!done_)
      out_.error = "the stream ended without [DONE]";
    else if (!counted_)
      out_.error = "the stream carried no token count (usage or meta_info.completion_tokens)";
    else if (token_ids && out_.output_len != static_cast<int64_t>(out_.output_ids.size()))
      out_.error = "usage says " + std::to_string(out_.output_len) + " completion tokens, the stream carried " +
                   std::to_string(out_.output_ids.size());
    out_.success = out_.error.empty();
  }

 private:
  static double seconds(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  }
  StreamReader reader_;
  RequestOutcome& out_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_event_ = start_, last_token_ = start_;
  bool first_ = true, done_ = false, counted_ = false;
};

RequestOutcome send_one(const RunOptions& options, const BenchPrompt& prompt) {
  RequestOutcome out;
  out.prompt_len = prompt.input_len;  // until the server says (as sglang)
  out.output_len = prompt.output_len;
  const Protocol protocol = protocol_of(options.backend);
  const bool token_ids = options.token_ids && protocol == Protocol::kCompletions;
  HttpCall call;
  call.method = "POST";
  call.path = route_of(protocol);
  call.body = request_body(protocol, {options.model, options.ignore_eos, token_ids, options.extra_body}, prompt).dump();
  call.headers = headers_for(options.api_key);
  SseParser sse;
  std::string error_body;
  OutcomeRecorder recorder(protocol, out);
  call.on_body = [&](int status, std::string_view bytes) {
    if (status != 200) return error_body.append(bytes), void();
    sse.feed(bytes, [&](const std::string& data) { recorder.on_event(data); });
  };
  try {
    const HttpResponse response = http_call(options.url, call);
    if (response.status != 200) {
      out.error = "HTTP " + std::to_string(response.status) + ": " + error_body;
      return out;
    }
  } catch (const std::exception& e) {
    out.error = e.what();
    return out;
  }
  recorder.finish(token_ids);
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
